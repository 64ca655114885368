import pytest
import torch

from tr_core.matrix import AdjacencyMatrix, MatrixFileError
from tr_core.trees import load_tree


def slow_retrieve(table: torch.Tensor, root: int, paths, skip_blank: bool = False) -> list[int]:
    """The definition: node [a, b, c] = M[M[M[root][a]][b]][c], one path at a time; ``skip_blank``:
    leave out the nodes whose walk reads a row never written (all zeros)."""
    out = [root]
    for path in paths:
        t, blank = root, False
        for rank in path:
            blank |= not bool(table[t].any())
            t = int(table[t, rank])
        if not (skip_blank and blank):
            out.append(t)
    return out


@pytest.mark.parametrize("tree_name", ["paper-80", "tr-16", "chain-6"])
def test_retrieval_matches_slow_reference(tree_name):
    torch.manual_seed(1)
    m = AdjacencyMatrix(500, 8)
    m.table.copy_(torch.randint(0, 500, (500, 8), dtype=torch.int32))
    tree = load_tree(tree_name)
    tt = tree.tensors()
    for root in (0, 7, 499):
        got = m.retrieve_draft_tree(torch.tensor(root), tt).tolist()
        assert got == slow_retrieve(m.table, root, tree.paths)


def test_zero_matrix_drafts_token_zero():
    m = AdjacencyMatrix(50, 8)
    got = m.retrieve_draft_tree(torch.tensor(9), load_tree("chain-3").tensors())
    assert got.tolist() == [9, 0, 0, 0]


def test_recycle_writes_every_input_and_last_write_wins():
    m = AdjacencyMatrix(20, 3)
    tokens = torch.tensor([5, 7, 5, 9])
    logits = torch.zeros(4, 20)
    logits[0, [1, 2, 3]] = torch.tensor([3.0, 2.0, 1.0])  # first 5: would give [1, 2, 3]
    logits[1, [4, 5, 6]] = torch.tensor([1.0, 2.0, 3.0])  # 7 -> [6, 5, 4]
    logits[2, [10, 11, 12]] = torch.tensor([2.0, 3.0, 1.0])  # second 5 wins -> [11, 10, 12]
    logits[3, [13, 14, 15]] = torch.tensor([3.0, 1.0, 2.0])  # 9 -> [13, 15, 14]
    m.table[5] = torch.tensor([19, 18, 17], dtype=torch.int32)
    rows = m.recycle(tokens, logits)
    assert m.table[5].tolist() == [11, 10, 12]
    assert m.table[7].tolist() == [6, 5, 4]
    assert m.table[9].tolist() == [13, 15, 14]
    assert sorted(rows.tokens.tolist()) == [5, 7, 9]
    i5 = rows.tokens.tolist().index(5)
    assert rows.old[i5].tolist() == [19, 18, 17] and rows.new[i5].tolist() == [11, 10, 12]
    untouched = [t for t in range(20) if t not in (5, 7, 9)]
    assert (m.table[untouched] == 0).all()


def test_save_load_round_trip(tmp_path):
    m = AdjacencyMatrix(100, 8, fingerprint="abc")
    m.table.copy_(torch.randint(0, 100, (100, 8), dtype=torch.int32))
    path = tmp_path / "m.safetensors"
    m.save(path, model_name="tiny")
    back = AdjacencyMatrix.load(path, "abc", 100)
    assert torch.equal(back.table, m.table) and back.k == 8
    assert not list(tmp_path.glob("*.tmp"))  # atomic write left no temporary file


def test_load_refuses_other_vocabulary(tmp_path):
    m = AdjacencyMatrix(100, 8, fingerprint="abc")
    m.save(tmp_path / "m.safetensors")
    with pytest.raises(MatrixFileError, match="another vocabulary"):
        AdjacencyMatrix.load(tmp_path / "m.safetensors", "xyz", 100)
    with pytest.raises(MatrixFileError, match="another vocabulary"):
        AdjacencyMatrix.load(tmp_path / "m.safetensors", "abc", 101)


def test_load_refuses_corrupt_truncated_and_missing(tmp_path):
    m = AdjacencyMatrix(100, 8, fingerprint="abc")
    path = tmp_path / "m.safetensors"
    m.save(path)
    data = path.read_bytes()
    (tmp_path / "trunc.safetensors").write_bytes(data[: len(data) // 2])
    (tmp_path / "junk.safetensors").write_bytes(b"\x00\x01garbage" * 10)
    for name in ("trunc.safetensors", "junk.safetensors"):
        with pytest.raises(MatrixFileError, match="corrupt or truncated"):
            AdjacencyMatrix.load(tmp_path / name, "abc", 100)
    with pytest.raises(MatrixFileError, match="No matrix file"):
        AdjacencyMatrix.load(tmp_path / "absent.safetensors", "abc", 100)


def test_load_refuses_foreign_safetensors_and_bad_ids(tmp_path):
    from safetensors.torch import save_file

    save_file({"matrix": torch.zeros(100, 8, dtype=torch.int32)}, str(tmp_path / "x.safetensors"))
    with pytest.raises(MatrixFileError, match="not a Token Recycling matrix"):
        AdjacencyMatrix.load(tmp_path / "x.safetensors", "abc", 100)
    m = AdjacencyMatrix(100, 8, fingerprint="abc")
    m.table[3, 2] = 100  # out of range
    m.save(tmp_path / "bad.safetensors")
    with pytest.raises(MatrixFileError, match="invalid token ids"):
        AdjacencyMatrix.load(tmp_path / "bad.safetensors", "abc", 100)


def test_recycle_with_priorities_keeps_the_row_of_highest_priority():
    m = AdjacencyMatrix(50, 2)
    tokens = torch.tensor([5, 7, 5, 9, 5])
    logits = torch.zeros(5, 50)
    for i in range(5):
        logits[i, 10 + i] = 2.0  # occurrence i predicts token 10 + i first
        logits[i, 20 + i] = 1.0
    m.recycle(tokens, logits)
    assert m.table[5].tolist() == [14, 24]  # the paper's rule: the last occurrence wins
    m.recycle(tokens, logits, priority=torch.tensor([0, 0, 1, 0, 0]))
    assert m.table[5].tolist() == [12, 22] and m.table[7].tolist() == [11, 21] and m.table[9].tolist() == [13, 23]
    m.recycle(tokens, logits, priority=torch.tensor([2, 0, 1, 0, 1]))
    assert m.table[5].tolist() == [10, 20]


def test_blank_drafts_are_the_nodes_at_or_below_a_row_never_written():
    from tr_core.trees import TreeShape

    m = AdjacencyMatrix(50, 2)
    m.table[3] = torch.tensor([4, 6], dtype=torch.int32)  # row 3 written; 4 and 6 never
    tree = TreeShape.from_paths([[0], [1], [0, 0], [1, 0], [0, 0, 0]]).tensors()
    tokens = m.retrieve_draft_tree(torch.tensor(3), tree)  # 3 -> 4, 6; 4 -> 0; 6 -> 0; 0 -> 0
    assert tokens.tolist() == [3, 4, 6, 0, 0, 0]
    blank = m.blank_drafts(tokens, tree)
    assert blank.tolist() == [False, False, False, True, True, True]
    sub = tree.select(~blank)
    assert sub.parents.tolist() == [-1, 0, 0] and sub.depths.tolist() == [0, 1, 1]
    assert sub.ancestors.tolist() == [[True, False, False], [True, True, False], [True, False, True]]


def test_select_renumbers_parents_and_keeps_each_nodes_place():
    from tr_core.trees import TreeShape

    tree = TreeShape.from_paths([[0], [1], [0, 0], [1, 0], [1, 0, 0]]).tensors()
    keep = torch.tensor([True, False, True, False, True, True])  # drop [0] and its child [0, 0]
    sub = tree.select(keep)
    assert sub.kept.tolist() == [0, 2, 4, 5]
    assert sub.parents.tolist() == [-1, 0, 1, 2] and sub.depths.tolist() == [0, 1, 2, 3]
    assert sub.children() == [[1], [2], [3], []]
    assert sub.ancestors[3].tolist() == [True, True, True, True]
