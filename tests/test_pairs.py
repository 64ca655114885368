"""Pair rows (``tr_core.pairs``): the top-k after a token and the one before it, beside ``M``."""
import pytest
import torch

from tr_core.matrix import AdjacencyMatrix, MatrixFileError
from tr_core.pairs import PairRows
from tr_core.trees import load_tree

L = torch.tensor  # noqa: E731


def slow_retrieve(m: AdjacencyMatrix, rows: dict, root: int, before: int, paths) -> list[int]:
    """The definition, one path at a time: a node's children come from the row of the pair (its
    parent's token, its token) where ``rows`` holds that pair, else from ``M``."""
    out = [root]
    for path in paths:
        prev, t = before, root
        for rank in path:
            row = rows.get((prev, t))
            prev, t = t, int(row[rank] if row is not None else m.table[t, rank])
        out.append(t)
    return out


def test_write_then_lookup_later_write_wins_and_no_pair_is_skipped():
    p = PairRows(100, 3, slots=64)
    p.write(L([4, 4, -1]), L([7, 7, 99]), L([[1, 2, 3], [5, 6, 8], [9, 9, 9]]))
    rows, seen = p.lookup(L([4, 7, 0, -1]), L([7, 4, 9, 99]))
    assert seen.tolist() == [True, False, False, False]  # (-1, 99)'s key is -1, the empty slots' mark: unseen
    assert rows[0].tolist() == [5, 6, 8]  # the later of the two writes of (4, 7)
    assert p.written == 1  # the entry with before = -1 (a text's first token) wrote nothing


def test_two_pairs_in_one_slot_the_later_wins_and_the_other_is_unseen():
    p = PairRows(1000, 2, slots=4)
    before, token = torch.arange(40), torch.full((40,), 3)
    slots = p._locate(before, token)[1]
    a, b = [i for i in range(40) if slots[i] == slots[0]][:2]  # 40 pairs in 4 slots: some share one
    p.write(L([a, b]), L([3, 3]), L([[1, 2], [5, 6]]))
    rows, seen = p.lookup(L([a, b]), L([3, 3]))
    assert seen.tolist() == [False, True] and rows[1].tolist() == [5, 6]
    p.write(L([b, a]), L([3, 3]), L([[7, 8], [9, 10]]))  # one call, two pairs in one slot: the later wins
    rows, seen = p.lookup(L([a, b]), L([3, 3]))
    assert seen.tolist() == [True, False] and rows[0].tolist() == [9, 10] and p.written == 1


def test_slots_follow_the_products_top_bits_for_a_large_vocabulary():
    """Golden values: the hash wraps in signed 64 bits, the same on every device (a file written on a
    GPU loads on a CPU by hashing its keys again, so only a hash that differs would lose rows)."""
    p = PairRows(151_936, 8, "meta", slots=1 << 18)
    before, token = L([0, 1, 151_935, 70_000]), L([1, 0, 151_935, 12_345])
    key = before * 151_936 + token
    mix = 0x9E3779B97F4A7C15
    expect = [(((int(k) * mix) % (1 << 64)) >> 46) for k in key]  # the product's top 18 of 64 bits
    assert p._locate(before, token)[1].tolist() == expect

@pytest.mark.parametrize("tree_name", ["paper-80", "chain-6"])
def test_retrieval_takes_the_pair_row_where_seen_else_m(tree_name):
    torch.manual_seed(3)
    v = 40
    m = AdjacencyMatrix(v, 8)
    m.table.copy_(torch.randint(0, v, (v, 8), dtype=torch.int32))
    pairs = {}
    for _ in range(300):  # a third of all pairs or so
        a, b = torch.randint(0, v, (2,)).tolist()
        pairs[(a, b)] = torch.randint(0, v, (8,))
    keys = list(pairs)
    m.pairs.write(L([a for a, _ in keys]), L([b for _, b in keys]), torch.stack([pairs[k] for k in keys]))
    held = {k: r for k, r in pairs.items() if bool(m.pairs.lookup(L([k[0]]), L([k[1]]))[1])}  # collisions: last wins
    assert len(held) > 200
    tree = load_tree(tree_name)
    for root, before in ((0, 5), (7, 7), (39, 12)):
        got = m.retrieve_draft_tree(L(root), tree.tensors(), before).tolist()
        assert got == slow_retrieve(m, held, root, before, tree.paths)
        plain = m.retrieve_draft_tree(L(root), tree.tensors()).tolist()  # no ``before``: the paper's rows
        assert plain == slow_retrieve(m, {}, root, before, tree.paths)


def test_a_pair_row_keeps_its_children_when_m_is_empty():
    m = AdjacencyMatrix(10, 2)
    m.pairs.write(L([1]), L([3]), L([[4, 6]]))  # after "1 3": 4, 6; M[3] never written
    tree = load_tree([[0], [1], [0, 0]]).tensors()  # 3 -> 4, 6; 4 -> ?
    tokens = m.retrieve_draft_tree(L(3), tree, before=1)
    assert tokens.tolist() == [3, 4, 6, 0]
    paired = m.from_pairs(tokens, tree, before=1)
    assert paired.tolist() == [False, True, True, False]
    assert m.blank_drafts(tokens, tree, paired).tolist() == [False, False, False, True]  # M[4] and (3, 4) unseen
    assert m.blank_drafts(tokens, tree).tolist() == [False, True, True, True]  # without pairs: all blank


def test_recycle_writes_pair_rows_in_priority_order():
    m = AdjacencyMatrix(20, 2)
    tokens, before = L([5, 5, 7, 7]), L([2, 2, 5, 6])
    logits = torch.zeros(4, 20)
    logits[0, [1, 2]] = torch.tensor([2.0, 1.0])  # accepted: [1, 2]
    logits[1, [3, 4]] = torch.tensor([2.0, 1.0])  # a rejected twin, written later: [3, 4]
    logits[2, [8, 9]] = torch.tensor([1.0, 2.0])  # accepted, after 5
    logits[3, [10, 11]] = torch.tensor([1.0, 2.0])  # rejected, after 6: its own pair
    m.recycle(tokens, logits, priority=L([1, 0, 1, 0]), before=before)
    rows, seen = m.pairs.lookup(L([2, 5, 6]), L([5, 7, 7]))
    assert seen.all()
    assert rows.tolist() == [[1, 2], [9, 8], [11, 10]]  # the accepted occurrence's row, as for M's
    assert m.table[5].tolist() == [1, 2] and m.table[7].tolist() == [9, 8]


def test_pair_rows_survive_a_file_and_old_files_load_without(tmp_path):
    m = AdjacencyMatrix(50, 4, fingerprint="fp")
    m.table[3] = L([1, 2, 4, 5], dtype=torch.int32)
    m.pairs.write(L([3, 9]), L([4, 1]), L([[7, 8, 9, 10], [11, 12, 13, 14]]))
    m.save(tmp_path / "m.safetensors")
    back = AdjacencyMatrix.load(tmp_path / "m.safetensors", "fp", 50)
    rows, seen = back.pairs.lookup(L([3, 9, 4]), L([4, 1, 3]))
    assert seen.tolist() == [True, True, False] and rows[:2].tolist() == [[7, 8, 9, 10], [11, 12, 13, 14]]
    assert back.pairs.written == 2 and torch.equal(back.table, m.table)

    from safetensors.torch import load_file, save_file
    saved = load_file(str(tmp_path / "m.safetensors"))
    meta = {"format": "token-recycling-matrix/1", "fingerprint": "fp", "vocab_size": "50", "k": "4"}
    save_file({"matrix": saved["matrix"]}, str(tmp_path / "old.safetensors"), metadata=meta)  # before pair rows
    old = AdjacencyMatrix.load(tmp_path / "old.safetensors", "fp", 50)
    assert old.pairs.written == 0 and torch.equal(old.table, m.table)

    for damage in ({"pair_rows": saved["pair_rows"] + 100}, {"pair_keys": saved["pair_keys"][:1]},
                   {"pair_keys": torch.tensor(5)}, {"pair_rows": saved["pair_rows"][:, :2].contiguous()},
                   {"pair_keys": saved["pair_keys"].to(torch.int32)}):
        save_file({**saved, **damage}, str(tmp_path / "bad.safetensors"), metadata=meta)
        with pytest.raises(MatrixFileError, match="pair rows"):
            AdjacencyMatrix.load(tmp_path / "bad.safetensors", "fp", 50)


def test_a_file_from_a_table_of_another_size_is_hashed_again(tmp_path):
    m = AdjacencyMatrix(50, 2, fingerprint="fp")
    m.pairs.write(torch.arange(30), torch.arange(30) % 7, torch.randint(0, 50, (30, 2)))
    held = m.pairs.written_tensors()
    small = PairRows(50, 2, slots=16)
    small.load_written(held)
    rows, seen = small.lookup(held["pair_keys"] // 50, held["pair_keys"] % 50)
    assert 0 < small.written <= 16 and int(seen.sum()) == small.written  # collisions: the later pair kept
    assert torch.equal(rows[seen], held["pair_rows"][seen])


def test_pickling_carries_only_the_written_pairs():
    import pickle

    m = AdjacencyMatrix(30, 4)
    m.pairs.write(L([1, 2]), L([2, 3]), L([[3, 4, 5, 6], [7, 8, 9, 10]]))
    blob = pickle.dumps(m)
    assert len(blob) < m.pairs.nbytes / 10  # the empty slots stay behind
    back = pickle.loads(blob)
    rows, seen = back.pairs.lookup(L([1, 2]), L([2, 3]))
    assert seen.all() and rows.tolist() == [[3, 4, 5, 6], [7, 8, 9, 10]] and back.pairs.written == 2


def test_reset_narrowed_and_to_carry_the_pairs():
    m = AdjacencyMatrix(30, 4)
    m.pairs.write(L([1]), L([2]), L([[3, 4, 5, 6]]))
    moved = m.to("meta")
    assert moved.pairs.rows.device.type == "meta" and moved.pairs.keys.device.type == "meta"
    narrow = m.narrowed(2)
    assert narrow.pairs.lookup(L([1]), L([2]))[0].tolist() == [[3, 4]]
    m.pairs.write(L([1]), L([2]), L([[9, 9, 9, 9]]))
    assert narrow.pairs.lookup(L([1]), L([2]))[0].tolist() == [[3, 4]]  # a copy, not a view
    m.reset()
    assert m.pairs.written == 0 and narrow.pairs.written == 1


def test_last_of_each_keeps_the_last_write_per_slot_as_the_pairwise_definition():
    from tr_core.pairs import last_of_each

    g = torch.Generator().manual_seed(0)
    for n in (0, 1, 7, 300):
        values = torch.randint(0, 20, (n,), generator=g)
        slow = ~(values[:, None] == values[None, :]).triu(1).any(1) if n else torch.zeros(0, dtype=torch.bool)
        assert last_of_each(values).tolist() == slow.tolist()
