import json
from pathlib import Path

import pytest
import torch

from tr_core.trees import TreeError, TreeShape, list_presets, load_tree

SHARED_TREE = Path(__file__).resolve().parents[2] / "shared" / "data" / "tr_paper_tree.json"


def test_paper_tree_facts():
    tree = load_tree("paper-80")
    assert tree.size == 80 and tree.depth == 6
    assert tree.nodes_per_depth() == [8, 21, 25, 15, 8, 3]
    parents = set(tree.parents[1:])
    leaves = [i for i in range(1, 81) if i not in parents]
    assert len(leaves) == 40


def test_bundled_paper_tree_equals_shared_data():
    if not SHARED_TREE.is_file():
        pytest.skip("shared data not beside the checkout")
    shared = json.loads(SHARED_TREE.read_text())["nodes"]
    assert [list(p) for p in load_tree("paper-80").paths] == sorted(shared, key=lambda p: (len(p), p))


@pytest.mark.parametrize("name", list_presets() + ["chain-5"])
def test_presets_are_valid(name):
    tree = load_tree(name, k=8)
    # BFS order: parents precede children, depths never decrease
    assert all(tree.parents[i] < i for i in range(1, tree.size + 1))
    assert list(tree.depths) == sorted(tree.depths)


def test_sorted_to_bfs_and_parents():
    tree = TreeShape.from_paths([[0, 1], [1], [0], [0, 1, 0], [0, 0]])
    assert tree.paths == ((0,), (1,), (0, 0), (0, 1), (0, 1, 0))
    assert tree.parents == (-1, 0, 0, 1, 1, 4)
    assert tree.depths == (0, 1, 1, 2, 2, 3)
    assert tree.ranks == (0, 0, 1, 0, 1, 0)


@pytest.mark.parametrize("paths, message", [
    ([], "at least one"),
    ([[0], [0]], "Duplicate"),
    ([[0, 1]], "no parent"),
    ([[0], [0, -1]], "non-negative"),
    ([[0], [0, 1.5]], "non-negative"),
    ([[0], []], "non-empty"),
    ([[0] * d for d in range(1, 18)], "deeper"),
    ([[0], [8]], "k=8"),
])
def test_invalid_trees_are_refused(paths, message):
    with pytest.raises(TreeError, match=message):
        TreeShape.from_paths(paths, k=8)


def test_unknown_or_corrupt_tree_files(tmp_path):
    with pytest.raises(TreeError, match="Unknown tree"):
        load_tree("no-such-tree")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(TreeError, match="Cannot read"):
        load_tree(str(bad))


def test_attention_mask_and_positions():
    tree = TreeShape.from_paths([[0], [1], [0, 0], [1, 0]])
    tt = tree.tensors("cpu", torch.float32)
    mask = tt.attention_mask(past=3)
    assert mask.shape == (1, 1, 5, 8)
    visible = (mask[0, 0] == 0)
    assert visible[:, :3].all()  # the whole cache
    expected = torch.tensor([  # root, [0], [1], [0,0], [1,0]
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 0, 1, 0, 0],
        [1, 1, 0, 1, 0],
        [1, 0, 1, 0, 1]], dtype=torch.bool)
    assert torch.equal(visible[:, 3:], expected)
    assert tt.position_ids(past=3).tolist() == [[3, 4, 4, 5, 5]]


def test_graft_chain_extends_mask_positions_and_parents():
    tt = TreeShape.from_paths([[0], [1]]).tensors()
    g = tt.graft_chain(attach=1, length=2)  # nodes 3, 4 under node 1
    assert g.parents.tolist() == [-1, 0, 0, 1, 3]
    assert g.depths.tolist() == [0, 1, 1, 2, 3]
    visible = g.attention_mask(past=2)[0, 0, :, 2:] == 0
    assert visible.tolist() == [
        [True, False, False, False, False],
        [True, True, False, False, False],
        [True, False, True, False, False],
        [True, True, False, True, False],
        [True, True, False, True, True]]
    assert g.position_ids(past=2).tolist() == [[2, 3, 3, 4, 5]]


def test_ancestors_of_any_forest_are_those_found_node_by_node():
    """The ancestor table, filled a generation at a time, against the plain walk up the parents, on
    random forests (a parent -1 past the root starts a tree of its own, as PTD's branches do)."""
    from tr_core.trees import TreeTensors

    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        q = int(torch.randint(1, 120, (1,), generator=gen))
        parents = [-1] + [int(torch.randint(-1, i, (1,), generator=gen)) for i in range(1, q)]
        depths = [0] * q
        for i in range(1, q):
            depths[i] = depths[parents[i]] + 1 if parents[i] >= 0 else 0
        walked = torch.zeros(q, q, dtype=torch.bool)
        for i in range(q):
            j = i
            while j >= 0:
                walked[i, j] = True
                j = parents[j] if j else -1
        assert torch.equal(TreeTensors.from_parents(parents, depths, "cpu", torch.float32).ancestors, walked)
