"""Several decoders' steps in one forward (a class of tabs): every decoder's output is exactly what it
gives alone, and what ``generate(do_sample=False)`` gives, whatever its neighbours in the forward."""
from __future__ import annotations

import threading

import pytest
import torch

from tr_core import GreedyDecoder, PromptLookupDecoder, TokenRecyclingDecoder
from tr_core.batching import Batcher, can_pack, causal_mask, run_forwards
from tr_core.bench.random_models import family_configs, random_lm
from tr_core.decoders import ProgressiveTreeDecoder
from tr_core.race import Race
from tr_core.sampling import SamplingConfig

from .conftest import reference_greedy

# Prompts of different lengths (the windowed families' window is passed by the long ones)
PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 12] * 4, [20, 21, 22], [30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41] * 3,
           [3, 4], [7, 8, 9, 7, 8, 9, 7, 8], [11, 12, 13, 14]]


def mixed_class(lm, n: int):
    """A class of decoders of every kind: TR (auto and the paper's tree), greedy, PTD, PLD, sampling."""
    makers = [lambda: TokenRecyclingDecoder(lm, max_new_tokens=n), lambda: GreedyDecoder(lm, n),
              lambda: TokenRecyclingDecoder(lm, tree="paper-80", max_new_tokens=n),
              lambda: ProgressiveTreeDecoder(lm, n), lambda: PromptLookupDecoder(lm, n),
              lambda: TokenRecyclingDecoder(lm, max_new_tokens=n, sampling=SamplingConfig(0.8, 0.95, 0, 7))]
    return makers


def lockstep(lm, decoders, prompts) -> list[int]:
    """Decode every prompt together: each round, every live decoder's step in one forward; returns the
    number of decoders in each forward."""
    for dec, ids in zip(decoders, prompts):
        dec.start(ids)
    sizes = []
    while any(not d.done for d in decoders):
        live = [d for d in decoders if not d.done]
        requests = [d.prepare_step() for d in live]
        for dec, request, logits in zip(live, requests, run_forwards(lm, requests)):
            dec.finish_step(request, logits)
        sizes.append(len(live))
    return sizes


@pytest.mark.parametrize("family", sorted(family_configs()))
def test_a_packed_forward_gives_every_decoder_its_own_output(family):
    """(That each decoder alone is ``generate``'s greedy on every family is tests/test_families.py's.)"""
    lm = random_lm(family_configs()[family])
    makers = mixed_class(lm, 40)
    alone = [make().generate(ids) for make, ids in zip(makers, PROMPTS)]
    together = [make() for make in makers]
    sizes = lockstep(lm, together, PROMPTS)
    assert [d.output for d in together] == alone
    assert max(sizes) == len(makers)
    assert can_pack(lm) == (family != "gemma2")  # Gemma 2 runs on eager attention: one forward each


def test_the_embedded_model_batched_is_generate_token_for_token(embedded_lm):
    lm = embedded_lm
    texts = ["Why do cats purr? Explain briefly.", "Write a Python function that reverses a string.",
             "Rewrite formally: gonna be late, sorry.", "List three facts about the moon."]
    prompts = [lm.encode_prompt(t) for t in texts]
    decoders = [TokenRecyclingDecoder(lm, max_new_tokens=32), GreedyDecoder(lm, 32),
                TokenRecyclingDecoder(lm, tree="paper-80", max_new_tokens=32), ProgressiveTreeDecoder(lm, 32)]
    assert can_pack(lm)
    lockstep(lm, decoders, prompts)
    for dec, ids in zip(decoders, prompts):
        assert dec.output == reference_greedy(lm, ids, 32)


def test_the_causal_block_of_a_maskless_request_follows_the_window():
    mask = causal_mask(past=5, q=2, window=3, dtype=torch.float32, device="cpu")[0, 0]
    seen = (mask == 0).int().tolist()
    assert seen == [[0, 0, 0, 1, 1, 1, 0], [0, 0, 0, 0, 1, 1, 1]]  # positions 5 and 6 see 3 positions each


def test_threads_stepping_races_share_forwards_and_keep_their_outputs():
    """Four tabs, each in its own thread, step TR-vs-greedy races through one batcher: their forwards
    are gathered, and every race's text is what it is alone."""
    lm = random_lm(family_configs()["llama"])
    alone = [Race(TokenRecyclingDecoder(lm, max_new_tokens=40), GreedyDecoder(lm, 40)) for _ in range(4)]
    for race, ids in zip(alone, PROMPTS):
        race.start(ids)
        while not race.done:
            race.step()
    batcher = Batcher()
    gate = threading.Barrier(4)
    races = [Race(TokenRecyclingDecoder(lm, max_new_tokens=40), GreedyDecoder(lm, 40), batcher=batcher)
             for _ in range(4)]

    def tab(race, ids):
        race.start(ids)
        gate.wait(timeout=30)  # the class presses Step together
        while not race.done:
            race.step()

    threads = [threading.Thread(target=tab, args=(race, ids)) for race, ids in zip(races, PROMPTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    for race, lone in zip(races, alone):
        assert race.decoder.output == lone.decoder.output
        assert race.greedy.output == lone.greedy.output
        assert all(s.wall is not None and s.wall >= s.timings["forward"] * 0.5 for s in race.decoder.steps)
    assert max(batcher.sizes) > 1, batcher.sizes


def test_a_lone_caller_runs_at_once_and_a_failed_forward_reaches_its_callers_only():
    lm = random_lm(family_configs()["llama"])
    batcher = Batcher()
    assert batcher.idle_seconds() == float("inf")  # no forward yet: a race wakes an idle CPU first
    dec = GreedyDecoder(lm, 8)
    dec.start([5, 6, 7])
    dec.step(batcher.run)
    assert list(batcher.sizes) == [1] and 0 <= batcher.idle_seconds() < 5
    bad = GreedyDecoder(lm, 8)
    bad.start([5, 6, 7])
    request = bad.prepare_step()
    request.input_ids = torch.full_like(request.input_ids, 10_000)  # outside the vocabulary
    with pytest.raises(IndexError):
        batcher.run(lm, [request])
    dec.step(batcher.run)  # the batcher goes on
    assert list(batcher.sizes) == [1, 1, 1] and len(dec.output) == 2


def test_a_planner_in_a_class_sizes_its_tree_for_the_batch():
    """Alone, a step's cost is its own forward's; in forwards shared by 8 requests, its share of a
    forward of 8 times its tokens (and greedy's, of 8 single tokens)."""
    from tr_core.planner import TreePlanner

    lm = random_lm(family_configs()["llama"])
    planner = TreePlanner(lm)
    alone = planner.step_cost(10)
    planner.record([], [], forward_tokens=10, forward_seconds=planner.cost(10, 64), cache_length=64)
    assert planner.batch == 1.0
    for _ in range(20):
        planner.record([], [], forward_tokens=10, forward_seconds=planner.cost(80, 64), cache_length=64, batch=8,
                       batch_tokens=80)
    assert planner.batch == pytest.approx(8.0, rel=0.01)
    b = planner.batch
    assert planner.step_cost(10) == pytest.approx(planner.cost(round(10 * b), 64) / b + planner.host(10))
    assert planner.greedy_cost() == pytest.approx(planner.cost(round(b), 64) / b + planner.host(1))
    assert planner.step_cost(10) != pytest.approx(alone)
