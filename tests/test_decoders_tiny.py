"""Greedy and Token Recycling on the tiny in-test model: records, stopping, losslessness."""
import dataclasses
import json
import time

import pytest
import torch

from tr_core import AdjacencyMatrix, DecodeError, GreedyDecoder, TokenRecyclingDecoder, load_tree
from tr_core.trees import TreeShape

from .conftest import decode_losslessly, reference_greedy

PROMPTS = [[5, 9, 14, 3, 22, 9, 14], [7], [30, 31, 32, 33, 30, 31, 32, 33, 30, 31], [60, 2, 60, 2, 60]]


@pytest.mark.parametrize("tree, lookup", [("paper-80", 0), ("tr-16", 0), ("chain-4", 0), ("tr-16", 10),
                                          ("chain-4", 5), ("auto", 0), ("auto", 10)])
def test_tr_equals_generate(tiny_lm, tree, lookup):
    from tr_core.planner import CostCurve, TreePlanner

    matrix = AdjacencyMatrix(tiny_lm.vocab_size, 8, fingerprint=tiny_lm.fingerprint)
    planner = TreePlanner(tiny_lm, every=4)
    planner.cost = CostCurve([1, 100, 200], [1.0, 1.2, 2.0])  # a GPU-like curve: trees pay
    planner.reset()
    accepted = 0
    for ids in PROMPTS:
        dec = TokenRecyclingDecoder(tiny_lm, tree=tree, matrix=matrix, max_new_tokens=40, lookup=lookup,
                                    planner=planner)
        assert dec.generate(ids) == reference_greedy(tiny_lm, ids, 40)
        accepted += sum(s.accepted_drafts for s in dec.steps)
    assert accepted > 0, "the tiny model should accept some drafts, or this test proves little"


def test_greedy_equals_generate(tiny_lm):
    for ids in PROMPTS:
        assert GreedyDecoder(tiny_lm, max_new_tokens=30).generate(ids) == reference_greedy(tiny_lm, ids, 30)


def test_tr_step_record_is_consistent(tiny_lm):
    tree = load_tree("tr-16")
    dec = TokenRecyclingDecoder(tiny_lm, tree=tree, max_new_tokens=30, lookup=0)
    dec.start(PROMPTS[0])
    root, blanks = PROMPTS[0][-1], 0
    while not dec.done:
        t0 = time.perf_counter()
        step = dec.step()
        elapsed = time.perf_counter() - t0
        t = step.tree
        assert t.tokens[0] == root and len(t.tokens) == tree.size + 1 - step.blank_drafts
        assert step.forward_tokens == len(t.tokens) and all(p < i for i, p in enumerate(t.parents[1:], 1))
        # no node was drafted from a row never written: every parent's row held a prediction before
        before = {r.token: r.old for r in step.rows_written}
        assert all(any(before[t.tokens[p]]) for p in t.parents[1:])
        blanks += step.blank_drafts
        # the nodes whose children were left out: exactly the kept nodes that had children in the shape
        # and whose row (before this step's writes) was never written
        paths = [()]
        for j in range(1, len(t.tokens)):
            paths.append(paths[t.parents[j]] + (t.ranks[j],))
        with_kids = {j for j, q in enumerate(paths) if any(len(r) == len(q) + 1 and r[:len(q)] == q for r in tree.paths)}
        empty_row = {j for j in with_kids if not any(before[t.tokens[j]])}
        assert set(step.blank_under) == empty_row
        assert bool(step.blank_under) == (step.blank_drafts > 0)
        path = step.accepted_path
        assert path[0] == 0 and all(t.parents[b] == a for a, b in zip(path, path[1:]))
        # every accepted draft equals the model's choice at its parent
        assert all(t.tokens[b] == step.model_choices[a] for a, b in zip(path, path[1:]))
        full = [t.tokens[i] for i in path[1:]] + [step.model_choices[path[-1]]]
        assert step.committed == full[: len(step.committed)]
        # every distinct input token's row was written, with the new row = top-k of its logits
        assert sorted(r.token for r in step.rows_written) == sorted(set(t.tokens))
        assert all(len(r.new) == 8 and len(r.old) == 8 for r in step.rows_written)
        assert all(dec.matrix.table[r.token].tolist() == r.new for r in step.rows_written
                   if r.token not in step.committed)
        assert set(step.timings) == {"retrieve", "prepare", "forward", "verify", "update", "prune"}
        # the phases are this step's own, in seconds: together they fit inside the call's wall clock
        assert step.timings["forward"] > 0 and sum(step.timings.values()) <= elapsed
        root = step.committed[-1]
        assert json.loads(json.dumps(step.to_dict()))["committed"] == step.committed  # serialisable
    assert sum(len(s.committed) for s in dec.steps) == len(dec.output) == 30
    assert blanks > 0 and dec.steps[0].blank_drafts > 0  # a fresh matrix: the first trees had blank rows


def test_cache_holds_all_committed_but_the_last(tiny_lm):
    dec = TokenRecyclingDecoder(tiny_lm, tree="tr-16", max_new_tokens=25)
    ids = PROMPTS[2]
    dec.start(ids)
    while not dec.done:
        dec.step()
        if not dec.done:
            assert dec.cache_length == len(ids) + len(dec.output) - 1


def test_stops_at_eos(tiny_lm):
    """Declare a token that greedy emits mid-way as the end token: both decoders stop right after it."""
    ids = PROMPTS[0]
    free = GreedyDecoder(tiny_lm, max_new_tokens=20).generate(ids)
    eos = free[6]
    lm = dataclasses.replace(tiny_lm, eos_token_ids=(eos,))
    cut = free[: free.index(eos) + 1]
    for dec in (GreedyDecoder(lm, 20), TokenRecyclingDecoder(lm, tree="tr-16", max_new_tokens=20)):
        assert dec.generate(ids) == cut
        assert dec.done and dec.steps[-1].done and dec.steps[-1].committed[-1] == eos


def test_budget_is_exact(tiny_lm):
    for n in (1, 2, 7):
        dec = TokenRecyclingDecoder(tiny_lm, tree="paper-80", max_new_tokens=n)
        assert len(dec.generate(PROMPTS[2])) <= n
        assert dec.output == reference_greedy(tiny_lm, PROMPTS[2], n)


def test_bad_prompts_are_refused_with_a_message(tiny_lm):
    dec = TokenRecyclingDecoder(tiny_lm, tree="tr-16", max_new_tokens=10)
    with pytest.raises(DecodeError, match="empty"):
        dec.start([])
    with pytest.raises(DecodeError, match="context"):
        dec.start(list(range(2, 90)) * 6)
    with pytest.raises(DecodeError, match="at least 1"):
        TokenRecyclingDecoder(tiny_lm, max_new_tokens=0).start([3])
    with pytest.raises(DecodeError, match="start"):
        dec.step()


def test_hot_start_matrix_carries_over(tiny_lm):
    from .test_matrix import slow_retrieve

    matrix = AdjacencyMatrix(tiny_lm.vocab_size, 8, fingerprint=tiny_lm.fingerprint)
    TokenRecyclingDecoder(tiny_lm, tree="tr-16", matrix=matrix, max_new_tokens=20).generate(PROMPTS[0])
    snapshot = matrix.table.clone()
    root = PROMPTS[0][2]
    assert (snapshot[root] != 0).any()
    # a one-token prompt has no prefill, so its first tree comes from the carried-over rows alone
    warm = TokenRecyclingDecoder(tiny_lm, tree="tr-16", matrix=matrix, max_new_tokens=5, lookup=0)
    warm.start([root])
    tree = load_tree("tr-16")
    step = warm.step()
    assert step.tree.tokens == slow_retrieve(snapshot, root, tree.paths, skip_blank=True)
    assert step.blank_drafts == len(slow_retrieve(snapshot, root, tree.paths)) - len(step.tree.tokens)
    cold = TokenRecyclingDecoder(tiny_lm, tree="tr-16", max_new_tokens=5, lookup=0)
    cold.start([root])
    step = cold.step()  # a fresh matrix drafts nothing: every node would come from a blank row
    assert step.tree.tokens == [root] and step.forward_tokens == 1 and step.blank_drafts == tree.size
    matrix.reset()
    assert not matrix.table.any() and matrix.writes == 0


def test_tree_rank_beyond_k_is_refused(tiny_lm):
    with pytest.raises(ValueError, match="k=4"):
        TokenRecyclingDecoder(tiny_lm, tree=TreeShape.from_paths([[0], [5]]), k=4)


def test_lookup_branch_is_grafted_and_traced(tiny_lm):
    """With prompt lookup on, the context's continuation rides along as extra nodes under the tree."""
    tree = load_tree("chain-2")
    dec = TokenRecyclingDecoder(tiny_lm, tree=tree, max_new_tokens=30, lookup=6)
    dec.start(PROMPTS[2])  # a prompt that repeats itself: lookup always finds a continuation
    grafted_steps = 0
    while not dec.done:
        step = dec.step()
        t = step.tree
        extra = [i for i, s in enumerate(t.sources) if s == "lookup"]
        assert len(t.tokens) == len(t.parents) == len(t.depths) == len(t.sources) == step.forward_tokens
        if extra:
            grafted_steps += 1
            drafted = tree.size + 1 - step.blank_drafts  # root and matrix nodes
            assert extra == list(range(drafted, len(t.tokens)))  # appended after the matrix nodes
            first = extra[0]
            assert t.parents[first] < drafted  # hangs under the root or a matrix node
            assert all(t.parents[b] == a and t.depths[b] == t.depths[a] + 1 for a, b in zip(extra, extra[1:]))
            assert "lookup" in step.timings
        path = step.accepted_path
        assert all(t.tokens[b] == step.model_choices[a] for a, b in zip(path, path[1:]))
    assert grafted_steps > 0


def test_auto_tree_replans_from_acceptance(tiny_lm):
    from tr_core.planner import CostCurve, TreePlanner

    planner = TreePlanner(tiny_lm, every=4)
    planner.cost = CostCurve([1, 200], [1.0, 1.0])  # compute is free: the plan should grow
    planner.reset()
    first = planner.tree
    dec = TokenRecyclingDecoder(tiny_lm, tree="auto", planner=planner, max_new_tokens=40, lookup=0)
    out = dec.generate(PROMPTS[2])
    assert out == reference_greedy(tiny_lm, PROMPTS[2], 40)
    from tr_core.trees import tree_prior

    assert first.size == len(tree_prior("paper-80"))  # free compute: every node pays (no prior is 0)
    sizes = {s.forward_tokens for s in dec.steps}
    assert max(sizes) <= 81
    planner.cost = CostCurve([1, 200], [1.0, 200.0])  # now every extra token costs a forward
    planner.reset()
    assert planner.tree.size == 0
    dec = TokenRecyclingDecoder(tiny_lm, tree="auto", planner=planner, max_new_tokens=10, lookup=0)
    assert dec.generate(PROMPTS[0]) == reference_greedy(tiny_lm, PROMPTS[0], 10)
    assert all(s.forward_tokens == 1 for s in dec.steps)  # plain decoding


def test_prompt_lookup_decoder_equals_generate_and_drafts(tiny_lm):
    from tr_core import PromptLookupDecoder

    decoders = decode_losslessly(tiny_lm, lambda: PromptLookupDecoder(tiny_lm, max_new_tokens=30), PROMPTS, 30)
    for s in (s for d in decoders for s in d.steps):
        assert s.tree.sources[0] == "root" and set(s.tree.sources[1:]) <= {"lookup"}
        assert s.tree.depths == list(range(len(s.tree.tokens)))  # one chain
    assert sum(s.accepted_drafts for d in decoders for s in d.steps) > 0


def test_auto_tree_respects_small_k_on_a_long_prompt(tiny_lm):
    dec = TokenRecyclingDecoder(tiny_lm, tree="auto", k=3, max_new_tokens=12, lookup=0)
    assert max(max(p) for p in dec.planner.universe.paths) < 3
    ids = [2 + (i * 7) % 90 for i in range(300)]
    assert dec.generate(ids) == reference_greedy(tiny_lm, ids, 12)


def test_prefill_seeds_the_matrix_from_the_whole_prompt(tiny_lm):
    """Prefill runs the whole prompt (its last token too, whose KV entry is then cropped: the cache
    holds all but the last, which roots step 1) and seeds ``M`` from it: ``M[last]`` is the model's
    own top-k for the first new token.  Without pair rows the head runs only at each token's last
    occurrence; the matrix equals recycling every prompt position's logits (where the last occurrence
    wins), also when the head runs over the kept positions in several chunks."""
    from transformers import DynamicCache

    from tr_core.decoders.recycling import last_occurrences

    ids = [2 + (i * i * 7) % 60 for i in range(300)]  # many repeats
    full, prefix = torch.tensor(ids), torch.tensor(ids[:-1])
    assert last_occurrences(torch.tensor([5, 3, 5, 2, 3])).tolist() == [False, False, True, True, True]
    dec = TokenRecyclingDecoder(tiny_lm, tree="tr-16", max_new_tokens=4, lookup=0, pair_rows=False)
    dec.start(ids)
    assert dec.cache_length == len(ids) - 1
    with torch.inference_mode():
        logits = tiny_lm.model(input_ids=full[None]).logits[0]  # [L, vocab], every position
    reference = AdjacencyMatrix(tiny_lm.vocab_size, 8, "cpu", tiny_lm.fingerprint)
    reference.recycle(full, logits, keep_old=False)
    assert int(reference.table.count_nonzero()) > 0
    assert torch.equal(dec.matrix.table, reference.table)
    assert dec.matrix.table[ids[-1]].tolist() == logits[-1].topk(8).indices.tolist()  # step 1's drafts: exact
    first = dec.step()
    assert first.accepted_drafts >= 1  # the rank-0 child of the root is the model's own first token
    assert dec.generate(ids) == reference_greedy(tiny_lm, ids, 4)
    chunked = TokenRecyclingDecoder(tiny_lm, tree="tr-16", max_new_tokens=4, lookup=0, pair_rows=False)
    chunked.cache, chunked.prompt = DynamicCache(config=tiny_lm.model.config), ids
    chunked.prefill(prefix, chunk=7)
    assert chunked.cache_length == len(prefix) and torch.equal(chunked.matrix.table, reference.table)
    assert dec.matrix.pairs.written == 0 and chunked.matrix.pairs.written == 0
    # with pair rows (the default): the same M, and the pair row of every prompt position but the first
    paired = TokenRecyclingDecoder(tiny_lm, tree="tr-16", max_new_tokens=4, lookup=0)
    paired.cache, paired.prompt = DynamicCache(config=tiny_lm.model.config), ids
    paired.prefill(prefix, chunk=7)
    reference.recycle(full, logits, keep_old=False, before=torch.cat([torch.tensor([-1]), full[:-1]]))
    assert torch.equal(paired.matrix.table, reference.table)
    assert torch.equal(paired.matrix.pairs.keys, reference.pairs.keys) and reference.pairs.written >= 20
    assert torch.equal(paired.matrix.pairs.rows, reference.pairs.rows)
    # as a request (a forward shared with other races'): the forward runs the head at the last position
    # alone and hands over the hidden states; the decoder's own head over them seeds the same M
    from tr_core.decoders.base import run_forward

    shared = TokenRecyclingDecoder(tiny_lm, tree="tr-16", max_new_tokens=4, lookup=0)
    shared.prepare_start(ids)
    request = shared.prefill_request()
    logits = run_forward(tiny_lm, request)
    assert logits.shape[0] == 1 and request.hidden.shape[0] == len(request.hidden_rows) > 1
    shared.finish_prefill(request, logits)
    assert shared.cache_length == len(prefix) and torch.equal(shared.matrix.table, reference.table)
    assert torch.equal(shared.matrix.pairs.rows, reference.pairs.rows)


def test_pair_rows_draft_where_seen_stay_lossless_and_the_paper_never_uses_them(tiny_lm):
    matrix = AdjacencyMatrix(tiny_lm.vocab_size, 8, fingerprint=tiny_lm.fingerprint)
    from_pairs = accepted_pairs = 0
    for ids in PROMPTS:
        dec = TokenRecyclingDecoder(tiny_lm, tree="tr-16", matrix=matrix, max_new_tokens=40, lookup=0)
        assert dec.generate(ids) == reference_greedy(tiny_lm, ids, 40)
        for step in dec.steps:
            from_pairs += step.tree.sources.count("pair")
            accepted_pairs += sum(step.tree.sources[i] == "pair" for i in step.accepted_path)
    assert from_pairs > 0 and accepted_pairs > 0 and matrix.pairs.written > 0
    # the keys: the root's pair is (the token before it, the root), a node's (its parent, itself)
    ids = PROMPTS[0]
    dec = TokenRecyclingDecoder(tiny_lm, tree="tr-16", max_new_tokens=40, lookup=0)
    dec.start(ids)
    step = dec.step()
    with torch.inference_mode():
        logits = tiny_lm.model(input_ids=torch.tensor([ids + step.committed])).logits[0]  # [L, vocab]
    path = [step.tree.tokens[i] for i in step.accepted_path]  # the root, then the accepted drafts
    for j in range(len(path)):  # each path node's logits are those of the text up to it
        before, token = (ids[-2], ids[-1]) if j == 0 else (path[j - 1], path[j])
        rows, seen = dec.matrix.pairs.lookup(torch.tensor([before]), torch.tensor([token]))
        assert bool(seen[0]) and rows[0].tolist() == logits[len(ids) - 1 + j].topk(8).indices.tolist()
    paper = TokenRecyclingDecoder.paper(tiny_lm, "tr-16", max_new_tokens=30)
    assert paper.generate(PROMPTS[2]) == reference_greedy(tiny_lm, PROMPTS[2], 30)
    assert paper.matrix.pairs.written == 0 and not any("pair" in s.tree.sources for s in paper.steps)


@pytest.mark.parametrize("verified", [True, False])
def test_a_token_drafted_twice_keeps_the_row_of_its_accepted_node(tiny_lm, verified):
    """Where a token sits on the accepted path and on a rejected branch, its row is the accepted
    node's top-k (``verified_rows``), or the last occurrence's (the paper's rule)."""
    dec = TokenRecyclingDecoder(tiny_lm, tree="paper-80", max_new_tokens=40, lookup=0, verified_rows=verified)
    dec.start(PROMPTS[2])
    checked = 0
    while not dec.done:
        step = dec.step()
        t, written = step.tree, {r.token: r.new for r in step.rows_written}
        for i in step.accepted_path:
            twins = [j for j, tok in enumerate(t.tokens) if tok == t.tokens[i] and j != i]
            if twins and step.model_choices[max(twins + [i])] != step.model_choices[i]:
                on_path = [j for j in twins + [i] if j in step.accepted_path]  # the last among equals
                winner = max(on_path) if verified else max(twins + [i])
                assert written[t.tokens[i]][0] == step.model_choices[winner]
                checked += 1
    assert checked > 0


def test_the_papers_method_and_the_ngram_retrieval_stay_lossless(tiny_lm):
    ids = PROMPTS[2]
    paper = TokenRecyclingDecoder.paper(tiny_lm, "tr-16", max_new_tokens=30)
    assert paper.generate(ids) == reference_greedy(tiny_lm, ids, 30)
    assert all(s.forward_tokens == 17 for s in paper.steps)  # the full shape, blank drafts included
    assert "empty" in paper.steps[0].tree.sources  # and marked as such
    ngram = TokenRecyclingDecoder(tiny_lm, tree="tr-16", max_new_tokens=30, lookup=8, retrieval="ngram")
    assert ngram.generate(ids) == reference_greedy(tiny_lm, ids, 30)
    with pytest.raises(ValueError, match="retrieval"):
        TokenRecyclingDecoder(tiny_lm, retrieval="bm25")


@pytest.mark.parametrize("budget", [1, 12, 80])
def test_a_node_budget_is_never_exceeded_and_stays_lossless(tiny_lm, budget):
    """``node_budget``: the paper's tree drafted in full, then its best nodes and the retrieved copy
    share the budget: no step's forward holds more, and a copy gets nodes where it is likely."""
    matrix = AdjacencyMatrix(tiny_lm.vocab_size, 8, fingerprint=tiny_lm.fingerprint)
    lookups = 0
    for ids in PROMPTS:
        dec = TokenRecyclingDecoder(tiny_lm, matrix=matrix, max_new_tokens=40, lookup=12, node_budget=budget)
        assert dec.generate(ids) == reference_greedy(tiny_lm, ids, 40)
        for step in dec.steps:
            t = step.tree
            assert step.forward_tokens == len(t.tokens) <= budget + 1
            assert all(p < i for i, p in enumerate(t.parents[1:], 1))
            assert all(t.tokens[b] == step.model_choices[a] for a, b in zip(step.accepted_path, step.accepted_path[1:]))
            n = t.sources.count("lookup")
            assert len(t.sources) == len(t.tokens) and t.sources[len(t.sources) - n:] == ["lookup"] * n
            lookups += "lookup" in t.sources
    assert lookups > 0 or budget == 1  # the repeating prompts are copied (one node: the tree's first may win)
    with pytest.raises(ValueError, match="node_budget"):
        TokenRecyclingDecoder(tiny_lm, node_budget=0)


def _records(dec) -> list[dict]:
    """Step records without their clock readings."""
    return [{**s.to_dict(), "timings": sorted(s.timings), "wall": None} for s in dec.steps]


def test_the_papers_class_equals_every_addition_switched_off(tiny_lm):
    from tr_core import Additions, PaperTokenRecycling

    for tree in ("tr-16", "paper-80"):
        a = AdjacencyMatrix(tiny_lm.vocab_size, 8, fingerprint=tiny_lm.fingerprint)
        b = AdjacencyMatrix(tiny_lm.vocab_size, 8, fingerprint=tiny_lm.fingerprint)
        for ids in PROMPTS:  # hot start across the prompts
            paper = PaperTokenRecycling(tiny_lm, tree, matrix=a, max_new_tokens=30)
            off = TokenRecyclingDecoder(tiny_lm, tree, matrix=b, max_new_tokens=30, additions=Additions.none())
            assert paper.generate(ids) == off.generate(ids) == reference_greedy(tiny_lm, ids, 30)
            assert _records(paper) == _records(off)
        assert torch.equal(a.table, b.table) and a.pairs.written == 0
    assert isinstance(TokenRecyclingDecoder.paper(tiny_lm, "tr-16"), PaperTokenRecycling)


def test_the_step_halves_run_sessions_forwards_between_them(tiny_lm):
    """``prepare_step`` / ``run_forward`` / ``finish_step`` on two sessions in turn give each the
    records of its own ``step()`` loop (the halves are the whole step)."""
    from tr_core.decoders import ProgressiveTreeDecoder, PromptLookupDecoder, run_forward
    from tr_core.progressive import PTDConfig

    makers = [lambda: GreedyDecoder(tiny_lm, 20), lambda: PromptLookupDecoder(tiny_lm, 20),
              lambda: TokenRecyclingDecoder(tiny_lm, tree="tr-16", lookup=6, max_new_tokens=20),
              lambda: ProgressiveTreeDecoder(tiny_lm, 20, config=PTDConfig.paper())]
    for make in makers:
        alone = [make(), make()]
        for dec, ids in zip(alone, PROMPTS[2:]):
            dec.generate(ids)
        paired = [make(), make()]
        for dec, ids in zip(paired, PROMPTS[2:]):
            dec.start(ids)
        while not all(d.done for d in paired):
            live = [d for d in paired if not d.done]
            requests = [d.prepare_step() for d in live]  # every session drafts, then the forwards, then the rest
            logits = [run_forward(tiny_lm, r) for r in requests]
            for d, r, out in zip(live, requests, logits):
                assert r.input_ids.shape == r.position_ids.shape == (1, out.shape[0])
                d.finish_step(r, out)
        assert [_records(d) for d in paired] == [_records(d) for d in alone]


def test_a_node_budget_on_a_static_tree_is_refused(tiny_lm):
    with pytest.raises(ValueError, match="node_budget .*tree='auto'"):
        TokenRecyclingDecoder(tiny_lm, tree="paper-80", node_budget=80)
