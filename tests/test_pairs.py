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
    p.write(L([4, 4, -1]), L([7, 7, 9]), L([[1, 2, 3], [5, 6, 8], [9, 9, 9]]))
    rows, seen = p.lookup(L([4, 7, 0]), L([7, 4, 9]))
    assert seen.tolist() == [True, False, False]
    assert rows[0].tolist() == [5, 6, 8]  # the later of the two writes of (4, 7)
    assert p.written == 1  # the entry with before = -1 (a text's first token) wrote nothing


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
    assert m.blank_drafts(tokens, tree, before=1).tolist() == [False, False, False, True]  # M[4] and (3, 4) unseen
    assert m.from_pairs(tokens, tree, before=1).tolist() == [False, True, True, False]
    assert m.blank_drafts(tokens, tree).tolist() == [False, True, True, True]  # without pairs: all blank


def test_recycle_writes_pair_rows_in_priority_order():
    m = AdjacencyMatrix(20, 2)
    tokens, before = L([5, 5, 7]), L([2, 2, 5])
    logits = torch.zeros(3, 20)
    logits[0, [1, 2]] = torch.tensor([2.0, 1.0])  # accepted: [1, 2]
    logits[1, [3, 4]] = torch.tensor([2.0, 1.0])  # a rejected twin, written later: [3, 4]
    logits[2, [8, 9]] = torch.tensor([1.0, 2.0])
    m.recycle(tokens, logits, priority=L([1, 0, 1]), before=before)
    rows, seen = m.pairs.lookup(L([2, 5]), L([5, 7]))
    assert seen.all()
    assert rows.tolist() == [[1, 2], [9, 8]]  # the accepted occurrence's row, as for M's
    assert m.table[5].tolist() == [1, 2]


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

    for damage in ({"pair_rows": saved["pair_rows"] + 100}, {"pair_slots": saved["pair_slots"].flip(0)},
                   {"pair_keys": saved["pair_keys"][:1]}):
        save_file({**saved, **damage}, str(tmp_path / "bad.safetensors"), metadata=meta)
        with pytest.raises(MatrixFileError, match="pair rows"):
            AdjacencyMatrix.load(tmp_path / "bad.safetensors", "fp", 50)


def test_reset_narrowed_and_to_carry_the_pairs():
    m = AdjacencyMatrix(30, 4)
    m.pairs.write(L([1]), L([2]), L([[3, 4, 5, 6]]))
    narrow = m.narrowed(2)
    assert narrow.pairs.lookup(L([1]), L([2]))[0].tolist() == [[3, 4]]
    m.pairs.write(L([1]), L([2]), L([[9, 9, 9, 9]]))
    assert narrow.pairs.lookup(L([1]), L([2]))[0].tolist() == [[3, 4]]  # a copy, not a view
    m.reset()
    assert m.pairs.written == 0 and narrow.pairs.written == 1
