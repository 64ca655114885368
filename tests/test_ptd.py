"""Progressive Tree Drafting: the draft tree's growth rules by hand, then the decoder on the tiny model."""
import numpy as np
import torch

from tr_core.decoders import ProgressiveTreeDecoder
from tr_core.progressive import CandidateTries, DraftForest, PTDConfig, _Node

from .conftest import decode_losslessly, reference_greedy

PROMPTS = [[5, 9, 14, 3, 22, 9, 14], [7], [30, 31, 32, 33, 30, 31, 32, 33, 30, 31], [60, 2, 60, 2, 60]]


def forest_of(*branches, **cfg) -> DraftForest:
    """A forest whose first-level branches are the given token chains."""
    f = DraftForest(PTDConfig(**cfg))
    for chain in branches:
        f.add_branch(chain[0])
        node = f.branches[-1]
        for t in chain[1:]:
            node.children.append(_Node(t))
            node = node.children[-1]
    return f


def shape(f: DraftForest):
    flat = f.flatten()
    return list(zip(flat.tokens, flat.parents, flat.depths))


def test_flatten_is_bfs_with_parents_and_depths():
    f = forest_of([10, 11, 12], [20, 21])
    assert shape(f) == [(10, -1, 1), (20, -1, 1), (11, 0, 2), (21, 1, 2), (12, 2, 3)]


def test_expansion_adds_the_argmax_under_every_node_once():
    f = forest_of([10, 11], [20])
    flat = f.flatten()  # 10, 20, 11
    grown = f.expand(flat, [11, 25, 12])  # 11 under 10 exists already: no new child there
    assert grown == [[20, 25], [10, 11, 12]]
    assert shape(f) == [(10, -1, 1), (20, -1, 1), (11, 0, 2), (25, 1, 2), (12, 2, 3)]
    assert f.expand(f.flatten(), [11, 25, 12, 26, 13]) == [[20, 25, 26], [10, 11, 12, 13]]


def test_width_control_drops_the_newest_extra_children():
    f = forest_of([10], width=2)
    for choice in (1, 2, 3):  # a third child does not fit
        f.expand(f.flatten(), [choice] + [0] * (len(f.flatten().nodes) - 1))
    assert [c.token for c in f.branches[0].children] == [1, 2]


def test_size_cap_limits_the_draft_tree():
    f = forest_of([10], [20], max_nodes=3)
    f.expand(f.flatten(), [11, 21])
    assert len(f.flatten().nodes) == 3


def test_root_window_keeps_the_newest_branches():
    f = forest_of([1], [2], root_window=3)
    assert f.add_branch(3) and f.add_branch(4)
    assert [b.token for b in f.branches] == [2, 3, 4]
    assert not f.add_branch(3)  # already a branch: nothing changes
    assert [b.token for b in f.branches] == [2, 3, 4]


def test_stepping_reroots_an_over_deep_branch_at_its_oldest_child():
    f = forest_of([1, 2, 3, 4], [9, 8], depth=3)
    first = f.branches[0]
    first.children.append(_Node(7))  # a younger sibling of 2, dropped by stepping
    assert f.step_depth() == [0]
    assert shape(f) == [(2, -1, 1), (9, -1, 1), (3, 0, 2), (8, 1, 2), (4, 2, 3)]
    assert f.step_depth() == []  # depth 3 is within the limit


def test_seed_takes_short_chains_of_prompt_tokens_reproducibly():
    prompt = list(range(100, 140))
    a, b = DraftForest(PTDConfig(seed=3)), DraftForest(PTDConfig(seed=3))
    a.seed(prompt)
    b.seed(prompt)
    assert shape(a) == shape(b) and len(a.branches) == 4
    assert len(a.flatten().nodes) <= 48 // 2  # half the cap at most: the rest is room to grow
    small = DraftForest(PTDConfig(max_nodes=8))
    small.seed(prompt)
    assert len(small.flatten().nodes) == 4
    for tok, parent, depth in shape(a):
        assert tok in prompt
        if parent >= 0:  # a seed chain is a stretch of the prompt
            assert tok == a.flatten().tokens[parent] + 1


def test_harvest_keys_ngrams_by_first_token_and_caps_tries():
    t = CandidateTries(max_nodes=4, ngram=3)
    t.harvest([1, 2])
    t.harvest([1, 2, 3])  # n-gram = last 3 tokens -> key 1, suffix (2, 3)
    t.harvest([7, 1, 2, 4])  # key 1, suffix (2, 4)
    assert t.candidates(1)[:3] == ([2, 4, 3], [0, 1, 1], [1, 2, 2])  # newest first on each level
    t.harvest([1, 5, 6], drafted=True)  # two more nodes: over the cap of 4, the oldest leaf (2, 3) goes
    tokens, parents, depths, drafted = t.candidates(1)
    assert sorted(zip(depths, tokens, drafted)) == [(1, 2, False), (1, 5, True), (2, 4, False), (2, 6, True)]
    t.harvest([1, 5])  # the context has (1, 5) too: no longer the draft tree's alone
    assert dict(zip(t.candidates(1).tokens, t.candidates(1).drafted)) == {2: False, 5: False, 4: False, 6: True}
    t.harvest([1, 2, 4], drafted=True)  # a drafted path the context already had stays the context's
    assert not any(t.candidates(1).drafted[:3])
    assert t.candidates(99) == ([], [], [], [])
    cand = t.candidates(1)  # newest first per level: 2, 5 (depth 1), then 4 under 2, 6 under 5 ...
    assert cand.keep([1, 3]) == ([cand.tokens[1], cand.tokens[3]], [0, 1], [1, 2], [False, True])


def test_ptd_equals_generate_and_accepts_drafts(tiny_lm):
    decoders = decode_losslessly(tiny_lm, lambda: ProgressiveTreeDecoder(tiny_lm, max_new_tokens=40, config=PTDConfig.paper()),
                                  PROMPTS, 40)
    assert sum(s.accepted_drafts for d in decoders for s in d.steps) > 0, "the tiny model repeats itself; PTD should accept some candidates"


def test_ptd_step_record_shows_verified_and_draft_trees(tiny_lm):
    dec = ProgressiveTreeDecoder(tiny_lm, max_new_tokens=30, config=PTDConfig.paper())  # drafts whatever the costs
    dec.start(PROMPTS[2])
    saw_candidates = saw_new = False
    while not dec.done:
        before = len(dec.forest.flatten().nodes)
        s = dec.step()
        verified, draft = s.tree, s.draft_tree
        assert s.forward_tokens == len(verified.tokens) + before
        assert set(verified.sources[1:]) <= {"trie"}
        assert draft.tokens[0] == verified.tokens[0] and draft.parents[0] == -1
        assert set(draft.sources[1:]) <= {"kept", "new", "pruned"}
        kept = sum(x != "pruned" for x in draft.sources[1:])
        assert kept == len(dec.forest.flatten().nodes)  # what survives rides along next step
        assert s.model_choices == [int(torch.tensor(c)) for c in s.model_choices]
        saw_candidates |= verified.size > 0
        saw_new |= "new" in draft.sources
    assert saw_candidates and saw_new


def test_ptd_state_starts_afresh_for_every_prompt(tiny_lm):
    dec = ProgressiveTreeDecoder(tiny_lm, max_new_tokens=20, config=PTDConfig.paper())
    dec.generate(PROMPTS[2])
    assert len(dec.tries) > 0
    dec.start([7])  # a one-token prompt has no prefill, but still a fresh state
    assert len(dec.tries) == 0 and {b.token for b in dec.forest.branches} == {7}
    assert dec.generate([7]) == reference_greedy(tiny_lm, [7], 20)


def test_cost_aware_ptd_verifies_only_candidates_that_pay():
    from tr_core.planner import CostCurve
    from tr_core.progressive import Candidates, PTDPlanner, candidate_keys

    parents, depths = [0, 0, 1, 1, 3], [1, 1, 2, 2, 3]  # two first-level candidates, two under the first, ...
    assert candidate_keys(parents, depths) == [(1, 0), (1, 1), (2, 0), (2, 1), (3, 0)]
    free = PTDPlanner(CostCurve([1, 200], [1.0, 1.0]), max_nodes=48)
    assert free.cut(parents, depths, riding=10) == [0, 1, 2, 3, 4] and free.draft_budget() == 48
    dear = PTDPlanner(CostCurve([1, 200], [1.0, 200.0]), max_nodes=48)  # each token costs a forward
    assert dear.cut(parents, depths, riding=0) == [] and dear.draft_budget() == 0
    mid = PTDPlanner(CostCurve([1, 101], [1.0, 2.0]), max_nodes=48)  # each token costs 1% of a forward
    kept = mid.cut(parents, depths, riding=10)
    assert kept and 0 in kept and all(parents[i] == 0 or parents[i] - 1 in kept for i in kept)
    cand = Candidates([7, 8, 9, 10, 11], parents, depths, [False] * 5)
    assert cand.keep([0, 2, 4]) == ([7, 9, 11], [0, 1, 2], [1, 2, 3], [False] * 3)
    five = PTDPlanner(CostCurve([1, 101], [1.0, 6.0]), max_nodes=48)  # each token costs 5% of a forward
    assert len(five.cut(parents, depths, riding=0)) > 1  # by the prior
    for _ in range(100):  # only the first candidate is ever accepted: the rest stop being verified
        five.record(candidate_keys(parents, depths), [0], 6, five.cost(6), 128)
    assert five.cut(parents, depths, riding=0) == [0]


def test_the_draft_tree_rides_along_only_while_its_nodes_bring_more_than_they_cost():
    from tr_core.planner import CostCurve
    from tr_core.progressive import PRIOR_DRAFT_YIELD, PTDPlanner

    cheap = PTDPlanner(CostCurve([1, 101], [1.0, 1.3]), max_nodes=48)  # a node costs 0.3% of a forward
    dear = PTDPlanner(CostCurve([1, 101], [1.0, 5.0]), max_nodes=48)  # 4%: more than the prior yield
    assert PRIOR_DRAFT_YIELD > 0.003 and cheap.draft_budget() == 48 and dear.draft_budget() == 0
    for _ in range(200):  # 48 nodes ride along every step and none of their n-grams is ever accepted
        cheap.record([], [], 49, cheap.cost(49), 128, riding=48, drafted_hits=0)
    assert cheap.drafts.rate < 0.001 and cheap.draft_budget() == 0
    for _ in range(200):  # a busy draft tree: 2 of its tokens accepted a step, from 10 riding nodes
        dear.record([], [], 11, dear.cost(11), 128, riding=10, drafted_hits=2)
    assert dear.drafts.rate > 0.1 and dear.draft_budget() == 48
    dear.use_temperature(1.0)  # kept per temperature: sampled text starts from the prior again
    assert dear.draft_budget() == 0
    # Up to 5 tokens a forward cost the same, then 4% each: alone the draft tree would take the 4 free
    # places, but the candidates take them first, and a draft node does not pay for what it adds after.
    knee = PTDPlanner(CostCurve([1, 5, 105], [1.0, 1.0, 5.0]), max_nodes=48)
    assert knee.draft_budget() == 4
    parents, depths = [0] * 6, [1] * 6
    assert knee.plan(parents, depths) == ([0, 1, 2, 3], 0)  # the four most likely fill the free places
    assert knee.plan(parents, depths, min_riding=3) == ([0, 1, 2, 3, 4, 5], 3)


def test_cost_aware_ptd_is_lossless_and_paper_settings_stay_available(tiny_lm):
    from tr_core.planner import CostCurve
    from tr_core.progressive import PTDPlanner

    assert PTDConfig.default().cost_aware and not PTDConfig.paper().cost_aware
    planner = PTDPlanner(CostCurve([1, 101], [1.0, 1.3]), max_nodes=48)
    assert planner.draft_budget() == 48  # 0.3% of a forward per token: the prior yield pays for all
    decoders = decode_losslessly(tiny_lm, lambda: ProgressiveTreeDecoder(
        tiny_lm, 40, PTDConfig(cost_aware=True), planner=planner), PROMPTS, 40)
    assert all(len(d.forest.flatten().nodes) <= planner.max_nodes + 1 for d in decoders)  # the cap holds
    assert sum(s.accepted_drafts for d in decoders for s in d.steps) > 0


def test_cost_aware_ptd_follows_the_cost_within_a_prompt_and_forgets_after_reset(tiny_lm, monkeypatch):
    from tr_core.planner import CostCurve
    from tr_core.progressive import PTDPlanner

    planner = PTDPlanner(CostCurve([1, 101], [1.0, 1.3]), max_nodes=48)
    dec = ProgressiveTreeDecoder(tiny_lm, 30, PTDConfig(cost_aware=True), planner=planner)
    assert dec.config.max_nodes == 48
    prior = planner.cost.coef.copy()
    sizes, plan = [], planner.plan

    def planned(*args, **kwargs):
        keep, size = plan(*args, **kwargs)
        sizes.append(size)
        return keep, size

    monkeypatch.setattr(planner, "plan", planned)
    dec.start(PROMPTS[0])
    for _ in range(8):
        dec.step()
    assert len(sizes) == 8 and dec.config.max_nodes == sizes[-1]  # each step sized by the planner ...
    assert not np.allclose(planner.cost.coef, prior)  # ... refitted on the forwards just seen
    assert planner.rates.trials  # what the steps saw is counted ...
    planner.cost = CostCurve([1, 101], [1.0, 201.0])  # the machine got busy: every token now costs two forwards
    step = dec.step()
    assert dec.config.max_nodes == 0 and step.forward_tokens == 1  # no draft rides along, no candidate pays
    assert planner.drafts.nodes > 0  # ... and the draft nodes that rode along
    planner.use_temperature(0.7)
    assert not planner.rates.trials and not planner.drafts.nodes  # ... per temperature
    planner.use_temperature(0.0)
    planner.reset()
    assert not planner.rates.trials and not planner.by_temperature[0.0][0].trials  # warm-up forgotten


def test_cpu_ptd_also_harvests_the_context_and_stays_lossless(tiny_lm, monkeypatch):
    from tr_core.progressive import CandidateTries

    assert PTDConfig.default().harvest_context and not PTDConfig.paper().harvest_context  # ptd:paper stays
    d = ProgressiveTreeDecoder(tiny_lm, 40, PTDConfig(harvest_context=True))
    d.start(PROMPTS[0])  # [5, 9, 14, 3, 22, 9, 14]: the prompt's n-grams are in the tries from the start
    assert d.tries.candidates(9)[:3] == ([14, 3, 22], [0, 1, 2], [1, 2, 3])
    assert d.tries.candidates(14)[:3] == ([3, 22, 9], [0, 1, 2], [1, 2, 3])
    assert d.tries.candidates(22) == ([], [], [], [])  # its 4-gram ends in the output, harvested then
    assert not any(d.tries.candidates(9).drafted)
    d.tries, d.output = CandidateTries(60, 4), [90, 91, 92]
    d.harvest_text(2)  # the 4-grams ending at the last two committed tokens
    ctx = d.prompt + d.output
    assert d.tries.tries == {ctx[-4]: {tuple(ctx[-3:]): 2, tuple(ctx[-3:-1]): 2, tuple(ctx[-3:-2]): 2},
                             ctx[-5]: {tuple(ctx[-4:-1]): 1, tuple(ctx[-4:-2]): 1, tuple(ctx[-4:-3]): 1}}
    calls = []
    monkeypatch.setattr(ProgressiveTreeDecoder, "harvest_text", lambda self, n: calls.append(n))
    ProgressiveTreeDecoder(tiny_lm, 10, PTDConfig.paper()).generate(PROMPTS[1])
    assert calls == []  # the paper's settings harvest only the draft tree
    dec = ProgressiveTreeDecoder(tiny_lm, 10, PTDConfig(harvest_context=True))
    dec.generate(PROMPTS[2])
    assert calls == [len(PROMPTS[2]) - 1] + [len(s.committed) for s in dec.steps]  # the prompt, then every step
    monkeypatch.undo()
    decode_losslessly(tiny_lm, lambda: ProgressiveTreeDecoder(tiny_lm, 40, PTDConfig(harvest_context=True)), PROMPTS, 40)


def test_min_draft_keeps_the_draft_tree_riding_where_it_does_not_pay(tiny_lm):
    from tr_core.planner import CostCurve
    from tr_core.progressive import PTDPlanner

    dear = lambda: PTDPlanner(CostCurve([1, 101], [1.0, 5.0]), max_nodes=48)  # noqa: E731
    bare = ProgressiveTreeDecoder(tiny_lm, 20, PTDConfig(cost_aware=True, harvest_context=True), planner=dear())
    shown = ProgressiveTreeDecoder(tiny_lm, 20, PTDConfig(cost_aware=True, min_draft=8), planner=dear())
    for dec in (bare, shown):
        assert dec.generate(PROMPTS[0]) == reference_greedy(tiny_lm, PROMPTS[0], 20)
    assert all(s.forward_tokens == 1 + s.tree.size for s in bare.steps)  # nothing rides along ...
    assert any(s.tree.size for s in bare.steps)  # ... while the context's n-grams are verified
    riding = [s.forward_tokens - 1 - s.tree.size for s in shown.steps]
    assert riding[0] == 4 and all(r > 0 for r in riding)  # seeds fill half of the 8 ...
    assert max(riding) > 4  # ... and the tree grows into the rest
    assert shown.planner.drafts.nodes > 0  # what rode along is measured


def test_draft_yield_counts_only_tokens_from_ngrams_the_draft_tree_alone_harvested(tiny_lm, monkeypatch):
    from tr_core.planner import CostCurve
    from tr_core.progressive import PTDPlanner

    def run(harvest_context: bool):
        planner = PTDPlanner(CostCurve([1, 101], [1.0, 1.3]), max_nodes=48)  # cheap: the draft tree rides
        seen = []
        record = planner.record
        monkeypatch.setattr(planner, "record", lambda *a, **k: (seen.append(k["drafted_hits"]), record(*a, **k)))
        dec = ProgressiveTreeDecoder(tiny_lm, 40, PTDConfig(cost_aware=True, harvest_context=harvest_context),
                                     planner=planner)
        assert dec.generate(PROMPTS[2]) == reference_greedy(tiny_lm, PROMPTS[2], 40)
        return seen, [s.accepted_drafts for s in dec.steps]

    drafted, accepted = run(harvest_context=False)  # every n-gram in the tries came from the draft tree
    assert drafted == accepted and sum(accepted) > 0
    drafted, accepted = run(harvest_context=True)  # the prompt [30, 31, 32, 33, 30, ...] repeats itself:
    assert all(d <= a for d, a in zip(drafted, accepted)) and sum(drafted) < sum(accepted)  # the context has it


def test_trie_bookkeeping_survives_random_inserts_and_evictions():
    import random

    rng = random.Random(0)
    t = CandidateTries(max_nodes=12, ngram=4)
    for _ in range(2000):
        t.harvest([rng.randrange(6) for _ in range(rng.randrange(2, 6))], drafted=rng.random() < 0.5)
        for key, trie in t.tries.items():
            assert len(trie) <= 12 and set(t.children[key]) == set(trie)
            for p in trie:
                assert p[:-1] in trie or len(p) == 1  # a path's prefix is in the trie too
                assert t.children[key][p] == sum(1 for o in trie if len(o) == len(p) + 1 and o[:-1] == p)
        assert all(p in t.tries[k] for k, p in t.drafted)  # no mark outlives its entry
