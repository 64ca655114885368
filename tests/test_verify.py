import torch

from tr_core.trees import TreeShape
from tr_core.verify import verify_greedy

# root=0; nodes: 1:[0] 2:[1] 3:[0,0] 4:[0,1] 5:[1,0] 6:[0,1,0]
TREE = TreeShape.from_paths([[0], [1], [0, 0], [0, 1], [1, 0], [0, 1, 0]]).tensors()
V = 50


def logits_choosing(choices):
    lg = torch.zeros(len(choices), V)
    for i, c in enumerate(choices):
        lg[i, c] = 1.0
    return lg


def test_longest_matching_path_and_bonus():
    tokens = torch.tensor([10, 11, 12, 13, 14, 15, 16])
    # root's choice 11 -> node 1 ok; node1's choice 14 -> node 4 ok (node 3=13 rejected);
    # node 4's choice 16 -> node 6 ok; node 6's choice 42 is the bonus.
    choices = [11, 14, 0, 0, 16, 0, 42]
    v = verify_greedy(tokens, logits_choosing(choices), TREE)
    assert v.path.tolist() == [0, 1, 4, 6]
    assert int(v.bonus) == 42
    assert v.choices.tolist() == choices


def test_child_of_rejected_node_is_not_accepted():
    tokens = torch.tensor([10, 11, 12, 13, 14, 15, 16])
    # root picks 12 (node 2); node 5 (=15) would match node 2's choice; node 6 matches
    # node 4's choice but node 1 was rejected, so node 6 must not count.
    choices = [12, 0, 15, 0, 16, 7, 0]
    v = verify_greedy(tokens, logits_choosing(choices), TREE)
    assert v.path.tolist() == [0, 2, 5]
    assert int(v.bonus) == 7


def test_nothing_accepted_gives_the_models_own_token():
    tokens = torch.tensor([10, 11, 12, 13, 14, 15, 16])
    v = verify_greedy(tokens, logits_choosing([33, 0, 0, 0, 0, 0, 0]), TREE)
    assert v.path.tolist() == [0]
    assert int(v.bonus) == 33


def test_tie_between_equal_depths_takes_the_better_rank():
    tokens = torch.tensor([10, 11, 11, 13, 14, 15, 16])  # nodes 1 and 2 hold the same token
    v = verify_greedy(tokens, logits_choosing([11, 5, 6, 0, 0, 0, 0]), TREE)
    assert v.path.tolist() == [0, 1]
    assert int(v.bonus) == 5
