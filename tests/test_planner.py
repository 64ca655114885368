import pytest

from tr_core.planner import AcceptanceStats, CostCurve, plan_tree
from tr_core.trees import TreeShape, load_tree

UNIVERSE = TreeShape.from_paths([[0], [1], [0, 0]])


def test_cost_curve_interpolates_and_extrapolates():
    c = CostCurve([1, 3, 5], [1.0, 2.0, 4.0])
    assert c(1) == 1.0 and c(2) == 1.5 and c(4) == 3.0 and c(7) == 6.0 and c(0) == 1.0


def test_plan_by_hand():
    est = {(0,): 0.6, (1,): 0.1, (0, 0): 0.5}.get
    cost = CostCurve([1, 2, 3, 4], [1.0, 1.2, 1.3, 2.0])
    # n=1: 1.6/1.2 = 1.33; n=2 (adds [0,0], p .5 > .1): 2.1/1.3 = 1.62; n=3: 2.2/2.0 = 1.1
    tree, expected = plan_tree(UNIVERSE, est, cost)
    assert tree.paths == ((0,), (0, 0)) and expected == pytest.approx(2.1)


def test_free_compute_takes_every_useful_node_and_costly_compute_none():
    est = {(0,): 0.6, (1,): 0.1, (0, 0): 0.5}.get
    flat = CostCurve([1, 100], [1.0, 1.0])
    assert plan_tree(UNIVERSE, est, flat)[0].size == 3
    steep = CostCurve([1, 100], [1.0, 100.0])  # each extra token costs a whole forward
    tree, expected = plan_tree(UNIVERSE, est, steep)
    assert tree.size == 0 and expected == 1.0  # degrade to plain decoding


def test_children_only_after_their_parent():
    est = {(0,): 0.05, (1,): 0.1, (0, 0): 0.9}.get  # a child rated above its parent
    flat = CostCurve([1, 100], [1.0, 1.0])
    tree, _ = plan_tree(UNIVERSE, est, flat)
    assert set(tree.paths) == {(0,), (1,), (0, 0)}
    mid = CostCurve([1, 2, 3, 4], [1.0, 1.05, 1.5, 2.0])
    tree, _ = plan_tree(UNIVERSE, est, mid)
    assert tree.paths == ((1,),)  # (0, 0) is unreachable without paying for (0,) first


def test_statistics_shrink_towards_the_prior_and_move_with_evidence():
    stats = AcceptanceStats(UNIVERSE, {(0,): 0.5}, weight=10, decay=1.0)
    assert stats.estimate((0,)) == 0.5 and stats.estimate((1,)) == 0.0
    for _ in range(30):
        stats.record(UNIVERSE, [(1,)])
    assert stats.estimate((1,)) == pytest.approx(30 / 40)
    assert stats.estimate((0,)) == pytest.approx(5 / 40)


def test_old_evidence_fades_back_to_the_prior():
    stats = AcceptanceStats(UNIVERSE, {(0,): 0.5}, weight=10, decay=0.9)
    for _ in range(30):
        stats.record(UNIVERSE, [])
    assert stats.estimate((0,)) < 0.3  # about 5 / (10 + 9.6)
    for _ in range(200):
        stats.record(TreeShape.empty(), [])  # the node is not drafted any more
    assert stats.estimate((0,)) == pytest.approx(0.5, abs=1e-4)


def test_paper_tree_carries_a_prior_for_every_node():
    from tr_core.trees import tree_prior

    prior = tree_prior("paper-80")
    assert set(prior) == set(load_tree("paper-80").paths)
    assert prior[(0,)] == max(prior.values())


def test_cost_curve_follows_observed_forward_times_and_keeps_its_shape():
    c = CostCurve([1, 2, 4, 8], [1.0, 1.2, 1.0, 2.0])  # not monotone, as measured on a CPU
    assert c(2) == 1.2 and c(3) == pytest.approx(1.1) and c(4) == 1.0
    for _ in range(300):
        c.observe(4, 2.0, rate=0.1)  # the machine got twice as slow
    assert c(4) == pytest.approx(2.0, rel=0.01)
    assert c(2) == pytest.approx(2.4, rel=0.01) and c(8) == pytest.approx(4.0, rel=0.01)
    for _ in range(300):
        c.observe(8, 1.0, rate=0.1)
    assert c(8) == pytest.approx(1.0, rel=0.01) and c(1) == pytest.approx(0.5, rel=0.01)
    assert c(12) == pytest.approx(c.scale * 3.0)  # extrapolated beyond the grid


def test_measured_cost_curve_covers_every_small_tree_size(tiny_lm):
    from tr_core.planner import COST_LENGTHS

    c = CostCurve.measure(tiny_lm, lengths=COST_LENGTHS[:20], repeats=1)
    assert c.lengths[:16] == list(range(1, 17)) and all(s > 0 for s in c.seconds)
    assert c.scale == 1.0


def test_lookup_continuation_is_cut_where_its_tokens_stop_paying(tiny_lm):
    from tr_core.planner import ChainStats, TreePlanner

    stats = ChainStats()
    assert stats.estimate(3, 0) == pytest.approx(0.67) and stats.estimate(1, 2) == pytest.approx(0.35 ** 3)
    for _ in range(200):  # the first two tokens of 2-gram continuations are always right, the rest never
        stats.record(2, offered=6, accepted=2)
    assert stats.estimate(2, 0) == pytest.approx(0.903, abs=1e-3) and stats.estimate(2, 1) == pytest.approx(0.855, abs=1e-3)
    assert stats.estimate(2, 2) < 0.03 and stats.estimate(2, 5) < 0.005
    assert stats.estimate(3, 0) == pytest.approx(0.67)  # other n-gram sizes keep their own counts

    planner = TreePlanner(tiny_lm, universe="tr-8")
    planner.chain, planner.expected = stats, 2.0
    planner.cost = CostCurve([1, 101], [1.0, 11.0])  # each token costs a tenth of a forward
    # q = 5: 2/1.4 = 1.43 with none, (2 + .903)/1.5 = 1.94 with one, (2 + .903 + .855)/1.6 = 2.35 with
    # two, (2 + .903 + .855 + .024)/1.7 = 2.22 with three
    assert planner.lookup_length(5, 2, offset=0, available=6) == 2
    assert planner.lookup_length(5, 2, offset=1, available=6) == 1  # its first token is already drafted
    planner.cost = CostCurve([1, 101], [1.0, 1.0])  # free tokens: take all there are
    assert planner.lookup_length(5, 2, offset=0, available=6) == 6
    planner.cost = CostCurve([1, 101], [1.0, 201.0])  # each token costs two forwards: take none
    assert planner.lookup_length(1, 2, offset=0, available=6) == 0  # 2/1 against 2.9/3 with one
