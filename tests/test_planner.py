import pytest

from tr_core.planner import RATE_FLOOR, AcceptanceStats, CostCurve, plan_tree
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
    assert stats.estimate((0,)) == 0.5 and stats.estimate((1,)) == RATE_FLOOR  # no prior: the floor, never 0
    for _ in range(30):
        stats.record(UNIVERSE, [(1,)])
    level = stats.level  # 30 hits where the prior expected 15: the text's drafts do better than the prior
    assert level == pytest.approx((30 + 2) / (30 * (0.5 + 2 * RATE_FLOOR) + 2))  # 3 nodes, 2 at the floor
    assert stats.estimate((1,)) == pytest.approx((30 + 10 * RATE_FLOOR) / 40)  # no prior: the floor
    assert stats.estimate((0,)) == pytest.approx(10 * 0.5 * level / 40)


def test_a_text_whose_drafts_miss_lowers_the_estimate_of_nodes_not_yet_tried():
    stats = AcceptanceStats(UNIVERSE, {(0,): 0.5, (1,): 0.4, (0, 0): 0.3}, weight=4, decay=0.97)
    for _ in range(12):
        stats.record([(0,)], [])  # only (0,) drafted, never accepted
    assert stats.level < 0.3
    assert stats.estimate((1,)) < 0.3 * 0.4  # never tried, but this text is one where drafts miss
    for _ in range(12):
        stats.record([(0,)], [(0,)])  # then it hits every time
    assert stats.level > 1.0 and stats.estimate((1,)) > 0.4


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


def test_cost_model_refits_its_fixed_and_per_token_parts_and_keeps_the_shape():
    c = CostCurve([1, 2, 4, 8], [1.0, 1.2, 1.0, 2.0])  # not monotone, as measured on a CPU
    assert c(2) == pytest.approx(1.2) and c(3) == pytest.approx(1.1) and c(4) == pytest.approx(1.0)
    for _ in range(100):
        for q in (1, 2, 8):
            c.observe(q, 2.0 * c.shape(q))  # the machine got twice as slow, uniformly
    assert c(4) == pytest.approx(2.0, rel=0.01) and c(2) == pytest.approx(2.4, rel=0.01)
    assert c(8) == pytest.approx(4.0, rel=0.01) and c.scale == pytest.approx(2.0, rel=0.01)
    assert c(12) == pytest.approx(2.0 * c.shape(12), rel=0.01)  # extrapolated beyond the grid
    for _ in range(300):
        c.observe(1, 0.5)  # only one-token forwards seen, faster: extra tokens follow the common factor
    assert c(1) == pytest.approx(0.5, rel=0.02) and c(8) == pytest.approx(1.0, rel=0.1)


LINEAR = CostCurve(list(range(1, 33)), [1.0 + 0.03 * (q - 1) for q in range(1, 33)], per_cache=2e-5)


def geometric(p):
    return 0.7 ** (len(p) + 2 * sum(p))


def plan_size(cost, cache=None):
    return plan_tree(load_tree("paper-80"), geometric, lambda q: cost(q, cache))[0].size


def test_a_longer_cache_leads_to_a_smaller_tree():
    near, far = plan_size(LINEAR, 128), plan_size(LINEAR, 128 + 4000)
    assert 0 < far < near


def test_dearer_extra_tokens_lead_to_a_smaller_tree_and_a_busy_spell_does_not_stick():
    import copy

    c = copy.deepcopy(LINEAR)
    quiet = plan_size(c)
    assert quiet > 2
    for _ in range(60):  # busy: one-token forwards as measured, every extra token three times dearer
        c.observe(1, c.shape(1))
        c.observe(9, c.shape(1) + 3 * (c.shape(9) - c.shape(1)))
    busy = plan_size(c)
    assert busy < quiet
    for _ in range(60):
        c.observe(1, 2 * c.shape(1))
        c.observe(9, 2 * c.shape(9))  # then uniformly twice as slow: the plan is as when quiet
    assert plan_size(c) == quiet


def test_a_planner_with_no_tree_tries_a_small_one_now_and_then(tiny_lm):
    from tr_core.planner import TreePlanner

    planner = TreePlanner(tiny_lm, universe="tr-8", every=1, explore=3)
    planner.cost = CostCurve([1, 101], [1.0, 201.0])  # every extra token costs two forwards: no tree
    planner.reset()
    sizes = []
    for _ in range(8):
        planner.record(planner.tree, [], forward_tokens=1 + planner.tree.size, forward_seconds=1.0)
        sizes.append(planner.tree.size)
    assert sizes[:2] == [0, 0] and max(sizes) >= TreePlanner.EXPLORE_NODES and sizes.count(0) >= 5


def test_lookup_estimates_depend_on_whether_the_text_is_being_copied():
    from tr_core.planner import ChainStats

    stats = ChainStats()
    for _ in range(100):
        stats.record(3, offered=20, accepted=20, hot=True)  # after a full acceptance: copying
        stats.record(3, offered=20, accepted=1, hot=False)
    assert stats.estimate(3, 15, hot=True) > 0.6 and stats.estimate(3, 15, hot=False) < 0.05
    assert ChainStats(prior={(3, True, 0): 0.95}).estimate(3, 0, hot=True) == pytest.approx(0.95)


def test_measured_cost_curve_covers_every_small_tree_size(tiny_lm):
    from tr_core.planner import COST_LENGTHS

    c = CostCurve.measure(tiny_lm, lengths=COST_LENGTHS[:20], repeats=1)
    assert c.lengths == list(COST_LENGTHS[:20]) and c.lengths[:16] == list(range(1, 17))
    assert len(c.seconds) == 20 and all(s > 0 for s in c.seconds) and c.prefix == 128


def test_cache_parts_are_read_from_the_growth_between_two_cache_lengths():
    # 1 and 16 query tokens over 128 and 512 cached tokens: per query token and cached token 0.5 ms
    # (gamma), per cached token whatever the size 1 ms (delta)
    gamma, delta, span = 0.0005, 0.001, 512 - 128
    far = {1: 1.0 + span * (delta + gamma), 16: 2.0 + span * (delta + 16 * gamma)}
    c = CostCurve.from_two_caches([1, 16], [1.0, 2.0], 128, far, 512)
    assert c.per_cache == pytest.approx(gamma) and c.per_cache_fixed == pytest.approx(delta)
    assert c.prefix == 128 and c.seconds == [1.0, 2.0]
    flat = CostCurve.from_two_caches([1, 16], [1.0, 2.0], 128, {1: 1.0, 16: 2.0}, 512)
    assert flat.per_cache == 0.0 and flat.per_cache_fixed == 0.0  # no growth, no cache part


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


def test_acceptance_is_kept_per_temperature(tiny_lm):
    from tr_core.planner import TreePlanner

    planner = TreePlanner(tiny_lm, universe="paper-80", every=1)
    planner.cost = CostCurve([1, 101], [1.0, 1.5])
    planner.reset()
    greedy_tree = planner.tree
    planner.use_temperature(1.0)
    for _ in range(60):  # nothing drafted is accepted when sampling
        planner.record(planner.tree, [])
    assert planner.tree.size < greedy_tree.size
    planner.use_temperature(0.0)  # greedy decoding keeps its own statistics
    assert planner.tree.paths == greedy_tree.paths
    assert set(planner.by_temperature) == {0.0, 1.0}


def test_each_planner_refits_its_own_cost_curve_and_a_new_text_starts_cold(tiny_lm):
    from tr_core.planner import HOT_RUN, TreePlanner, is_hot

    a, b = TreePlanner(tiny_lm), TreePlanner(tiny_lm)
    before = b.cost.coef.copy()
    for _ in range(20):
        a.record(a.tree, [], forward_tokens=8, forward_seconds=10 * a.cost(8), cache_length=200)
    assert a.cost.coef[0] > 2 * before[0] and (b.cost.coef == before).all()  # b never saw a's forwards
    assert is_hot(HOT_RUN + 3, HOT_RUN) and is_hot(2, 2) and not is_hot(8, HOT_RUN - 1) and not is_hot(0, 0)
    a.record_lookup(3, 2, 2)  # a short continuation, all of it accepted: the text is being copied
    assert a.hot
    a.begin_text()
    assert not a.hot and a.idle == 0


def test_the_fixed_cache_part_counts_beyond_the_measured_prefix_only():
    """A per-cached-token part measured between 128 and 512 cached tokens is charged for longer caches;
    a short cache is not made cheaper than the measured shape (which would make trees look dear)."""
    c = CostCurve([1, 2, 4], [1e-3, 1.1e-3, 1.2e-3], prefix=128, per_cache_fixed=8e-6)
    assert c(1, 628) == pytest.approx(1e-3 + 500 * 8e-6) and c(4, 628) == pytest.approx(1.2e-3 + 500 * 8e-6)
    assert c(1, 8) == pytest.approx(1e-3) and c(4, 8) / c(1, 8) == pytest.approx(1.2)


# Two CPUs' cost curves (seconds of a forward by query tokens): one where extra tokens are dear (an
# AVX2 CPU's measured curve: 8 tokens cost 1.44x one), one where they are nearly free.
STEEP = CostCurve([1, 2, 4, 6, 8, 16, 32, 81], [0.059, 0.065, 0.066, 0.075, 0.085, 0.095, 0.131, 0.237])
FLAT = CostCurve([1, 2, 4, 8, 16, 32, 81], [0.040, 0.041, 0.041, 0.042, 0.044, 0.047, 0.060])


def test_each_cost_curve_gets_its_own_tree_and_it_beats_the_other_curves_choice_there():
    from tr_core.trees import tree_prior

    universe, prior = load_tree("paper-80"), tree_prior("paper-80")
    estimate = lambda p: max(prior.get(p, 0.0), RATE_FLOOR)  # noqa: E731
    plans = {name: plan_tree(universe, estimate, curve) for name, curve in (("steep", STEEP), ("flat", FLAT))}
    steep_tree, flat_tree = plans["steep"][0], plans["flat"][0]
    assert 0 < steep_tree.size < flat_tree.size

    def throughput(tree, curve):
        return (1 + sum(estimate(p) for p in tree.paths)) / curve(1 + tree.size)

    assert throughput(steep_tree, STEEP) > throughput(flat_tree, STEEP)
    assert throughput(flat_tree, FLAT) > throughput(steep_tree, FLAT)


def test_host_work_per_token_is_learnt_and_shrinks_the_tree():
    from tr_core.cost import HostCost

    host = HostCost()
    assert host(1) == 0.0  # nothing observed: nothing assumed
    for q in (1, 9, 1, 9, 1, 9, 1, 9, 1, 9):
        host.observe(q, 0.002 + 0.001 * q)
    assert host(1) == pytest.approx(0.003, rel=0.1) and host(9) == pytest.approx(0.011, rel=0.1)
    fixed = HostCost()
    for _ in range(10):
        fixed.observe(9, 0.011)  # one size only: counted as fixed work, not per token
    assert fixed(1) == pytest.approx(fixed(9), rel=0.2)
    estimate = lambda p: 0.7 ** (len(p) + 2 * sum(p))  # noqa: E731
    universe = load_tree("paper-80")
    bare = plan_tree(universe, estimate, LINEAR)[0].size
    dear_host = plan_tree(universe, estimate, lambda q: LINEAR(q) + 0.02 * q)[0].size
    assert dear_host < bare


def test_a_planner_on_text_its_drafts_miss_falls_back_to_no_tree_within_a_few_steps(tiny_lm):
    """Chat-like text: nothing drafted is accepted.  The plan must shrink to no tree quickly and
    stay small, whatever the prior said."""
    from tr_core.planner import TreePlanner

    dear = CostCurve([1, 2, 4, 8, 16], [1.0, 1.08, 1.24, 1.56, 2.2])  # 8% a token
    planner = TreePlanner(tiny_lm)
    planner.cost = dear
    planner.reset()
    assert planner.tree.size > 0  # the prior expects drafts to hit
    sizes = []
    for _ in range(40):
        planner.record(planner.tree, [], 1 + planner.tree.size, dear(1 + planner.tree.size), 128)
        planner.record_host(1 + planner.tree.size, 0.002)
        sizes.append(planner.tree.size)
    assert sizes[15] == 0  # within 16 steps
    assert sum(s == 0 for s in sizes[16:]) >= 16  # then mostly no tree, bar the exploring plans


def test_a_node_budget_keeps_the_likeliest_nodes_parent_first_and_a_copy_competes_with_the_tree():
    from tr_core.planner import allocate

    #        0
    #      1   2        node estimates: 1: .5, 2: .2, 3 (under 1): .4, 4 (under 2): .9
    #      3   4        a chain 5-6-7 under node 1: .45, .3, .1
    parents = [0, 0, 0, 1, 2, 1, 5, 6]
    est = [.5, .2, .4, .9, .45, .3, .1]
    assert allocate(est, parents, 1) == [0, 1]
    assert allocate(est, parents, 3) == [0, 1, 3, 5]  # the chain's first token beats node 2
    assert allocate(est, parents, 4) == [0, 1, 3, 5, 6]
    assert allocate(est, parents, 5) == [0, 1, 2, 3, 5, 6]
    assert allocate(est, parents, 6) == [0, 1, 2, 3, 4, 5, 6]  # node 4 (.9) only after its parent (.2)
    assert allocate(est, parents, 100) == list(range(8))
    for budget in range(8):
        kept = allocate(est, parents, budget)
        assert len(kept) == budget + 1 and all(parents[i] in kept for i in kept[1:])


def test_under_a_node_budget_the_plan_is_the_whole_universe_at_any_cost(tiny_lm):
    from tr_core.planner import TreePlanner

    planner = TreePlanner(tiny_lm, budget=80)
    planner.cost = CostCurve([1, 100, 200], [1.0, 50.0, 100.0])  # extra tokens dear: a cost-aware plan is tiny
    planner.reset()
    assert planner.tree.size == planner.universe.size


def test_trees_are_weighed_against_greedys_mask_free_forward(tiny_lm):
    """Where a masked 1-token forward costs twice greedy's (a KV copy under the mask), a tree that
    beats the masked forward but not greedy's is not planned."""
    import dataclasses

    from tr_core.cost import CostCurve
    from tr_core.planner import TreePlanner

    curve = CostCurve([1, 2, 4, 8, 16, 32, 96], [2.0, 2.2, 2.4, 2.8, 3.4, 4.0, 6.0])
    lm = dataclasses.replace(tiny_lm, cost_curve=curve)
    assert TreePlanner(lm).tree.size > 0  # against the masked forward, trees pay
    curve.plain_ratio = 0.5  # greedy's own forward: 1.0
    planner = TreePlanner(lm)
    assert planner.greedy_cost() == pytest.approx(1.0)
    assert planner.tree.size == 0 or planner.expected / planner.step_cost(1 + planner.tree.size) > 1.0
    assert curve.fresh().plain_ratio == 0.5
