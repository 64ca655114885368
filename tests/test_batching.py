"""Several decoders' steps in one forward (a class of tabs): every decoder's output is exactly what it
gives alone, and what ``generate(do_sample=False)`` gives, whatever its neighbours in the forward."""
from __future__ import annotations

import threading
import time

import pytest
import torch

from components.counters import alongside_words
from tr_core import GreedyDecoder, PromptLookupDecoder, TokenRecyclingDecoder
from tr_core.batching import can_pack, causal_mask, run_forwards
from tr_core.bench.random_models import family_configs, random_lm
from tr_core.decoders import ProgressiveTreeDecoder
from tr_core.race import Race, step_races
from tr_core.rounds import Batcher
from tr_core.runs import step_from_dict
from tr_core.sampling import SamplingConfig

from .conftest import lockstep, reference_greedy

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


def test_threads_stepping_races_share_rounds_and_keep_their_outputs():
    """Four tabs, each in its own thread, step TR-vs-greedy races through one batcher: their steps are
    gathered into rounds (greedy's catch-up included), and every race's text is what it is alone."""
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
        assert race.baseline[-1]["tokens"] == lone.baseline[-1]["tokens"]
        assert all(s.wall is not None and s.wall >= s.timings["forward"] * 0.5 for s in race.decoder.steps)
    assert max(batcher.rounds) > 1 and max(batcher.sizes) > 1, (batcher.rounds, batcher.sizes)


def test_races_of_every_kind_step_together_as_alone_and_a_failure_stays_with_its_race():
    """One round steps races of TR, PTD, PLD and greedy sampling together; each gets the step it gets
    alone.  A race whose drafting fails hears of it; the others' steps go on."""
    lm = random_lm(family_configs()["llama"])

    def races():
        out = []
        for make, ids in zip(mixed_class(lm, 12), PROMPTS):
            dec = make()
            race = Race(dec, GreedyDecoder(lm, 12, sampling=dec.sampling))
            race.start(ids)
            out.append(race)
        return out

    alone, together = races(), races()
    for race in alone:
        while not race.done:
            race.step()
    broken = together[1]
    broken.decoder.prepare_step = lambda: (_ for _ in ()).throw(RuntimeError("drafting failed"))
    first = step_races(together)
    assert isinstance(first[1], RuntimeError) and all(not isinstance(s, BaseException) for i, s in enumerate(first) if i != 1)
    rest = [r for r in together if r is not broken]
    while any(not r.done for r in rest):
        step_races([r for r in rest if not r.done])
    for race, lone in zip(together, alone):
        if race is not broken:
            assert race.decoder.output == lone.decoder.output and race.greedy.output == lone.greedy.output
            assert race.speedups and len(race.speedups) == len(race.decoder.steps)


def test_races_read_their_prompts_once_for_both_sides_and_together_as_alone():
    """A race checks its prompt at ``start`` and reads it in its first step, once for both sides: the
    method's prefill, greedy's KV cache a copy of the method's.  With a batcher every race's prefill
    shares one forward.  Each TR matrix is seeded from its prompt exactly as a race reading alone seeds
    it, and each race then runs as alone."""
    from tr_core.decoders.base import DecodeError
    from tr_core.race import drive

    lm = random_lm(family_configs()["llama"])
    batcher = Batcher()

    def races(with_batcher):
        out = []
        for make, ids in zip(mixed_class(lm, 12), PROMPTS):
            dec = make()
            race = Race(dec, GreedyDecoder(lm, 12, sampling=dec.sampling), batcher=with_batcher)
            race.start(ids)
            out.append(race)
        return out

    alone, read_alone, together = races(None), races(None), races(batcher)
    assert all(r.unread and r.decoder.cache_length == 0 for r in together + read_alone)
    sizes = []

    def counted(lm_, requests):
        sizes.append(len(requests))
        return run_forwards(lm_, requests)

    drive([r.read_stepping() for r in together], counted)
    assert sizes == [len(PROMPTS)]  # one forward: every race's prompt, read once for its two sides
    for race in read_alone:
        drive([race.read_stepping()])
    for race, lone in zip(together, read_alone):
        assert not race.unread and race.reading["method"] > 0 and race.reading["greedy"] > 0
        for side, other in ((race.decoder, lone.decoder), (race.greedy, lone.greedy)):
            assert side.cache_length == other.cache_length == len(side.prompt) - 1
        assert len(race.greedy.cache.layers) == len(race.decoder.cache.layers)
        for mine, theirs in zip(race.greedy.cache.layers, race.decoder.cache.layers):  # greedy's: a copy
            assert torch.equal(mine.keys, theirs.keys) and torch.equal(mine.values, theirs.values)
            assert mine.keys.data_ptr() != theirs.keys.data_ptr()
        if isinstance(race.decoder, TokenRecyclingDecoder):
            assert torch.equal(race.decoder.matrix.table, lone.decoder.matrix.table)
    for race in alone:
        while not race.done:
            race.step()
    while any(not r.done for r in together):
        step_races([r for r in together if not r.done])
    for race, lone in zip(together, alone):
        assert race.decoder.output == lone.decoder.output and race.greedy.output == lone.greedy.output
    with pytest.raises(DecodeError):  # a prompt that cannot be read is refused at start, not in a round
        Race(GreedyDecoder(lm, 8), GreedyDecoder(lm, 8), batcher=batcher).start([])


@pytest.mark.parametrize("family", sorted(family_configs()))
def test_greedys_copy_of_the_prompts_reading_is_what_its_own_prefill_writes(family):
    """Every decoder reads a prompt in the same forward (the whole prompt, as ``generate`` does), so the
    cache a race's greedy side copies from TR's reading is the one its own prefill writes, bit for bit,
    on every family (Gemma 2's eager attention included), and greedy then decodes what ``generate`` does."""
    from tr_core.race import drive

    lm = random_lm(family_configs()[family])
    ids = PROMPTS[2]  # past the windowed families' window
    race = Race(TokenRecyclingDecoder(lm, max_new_tokens=10), GreedyDecoder(lm, 10))
    race.start(ids)
    drive([race.read_stepping()])
    own = GreedyDecoder(lm, 10)
    own.start(ids)
    assert len(race.greedy.cache.layers) == len(own.cache.layers) > 0
    for mine, theirs in zip(race.greedy.cache.layers, own.cache.layers):
        assert torch.equal(mine.keys, theirs.keys) and torch.equal(mine.values, theirs.values)
    while not race.done:
        race.step()
    assert race.greedy.output == own.generate(ids) == reference_greedy(lm, ids, 10)
    assert race.decoder.output == race.greedy.output


def test_in_a_class_greedys_first_token_rides_in_the_methods_forward_and_alone_it_does_not():
    """Races stepped together (a class) run the method's tree and greedy's first token of each step in
    one forward; a race alone keeps them apart, each timed on its own.  Every output is as alone."""
    lm = random_lm(family_configs()["llama"])
    sizes = []

    def counted(lm_, requests):
        sizes.append(len(requests))
        return run_forwards(lm_, requests)

    def races():
        out = [Race(TokenRecyclingDecoder(lm, max_new_tokens=12), GreedyDecoder(lm, 12)) for _ in PROMPTS[:2]]
        for race, ids in zip(out, PROMPTS[:2]):
            race.start(ids)
        return out

    alone = races()
    for race in alone:
        while not race.done:
            step_races([race], counted)
    assert set(sizes) == {1} and not any(r.company for r in alone)
    sizes.clear()
    together = races()
    while any(not r.done for r in together):
        step_races([r for r in together if not r.done], counted)
    assert max(sizes) == 4  # two races' trees and greedy tokens in one forward
    for race, lone in zip(together, alone):
        assert race.decoder.output == lone.decoder.output and race.greedy.output == lone.greedy.output
        assert len(race.greedy.steps) == len(lone.greedy.steps) and race.figures()["identical"]
        # the counters say which forwards were shared, and what the speedup then means
        assert lone.figures()["tr"]["alongside"] == lone.figures()["greedy"]["alongside"] == 0
        assert not alongside_words(lone.figures())
        mine = race.figures()
        assert mine["tr"]["alongside"] == sum(1 for s in race.decoder.steps if s.alongside) > 0
        assert race.baseline[-1]["alongside"] == mine["greedy"]["alongside"] > 0
        assert f"{mine['tr']['alongside']} of the method's {mine['tr']['forwards']}" in alongside_words(mine)
        step = next(s for s in race.decoder.steps if s.alongside)
        assert step_from_dict(step.to_dict(), step.index).alongside == step.alongside  # run files keep it


def test_a_race_that_asks_while_others_step_joins_them_at_the_next_forward():
    """A tab that presses Step while another tab's step runs does not wait for that step to end: its
    race joins the serving loop at the next forward (one loop serves both, a forward carries both), and
    each gets the step it gets alone."""
    lm = random_lm(family_configs()["llama"])
    batcher = Batcher(submit=lambda fn, later=False: threading.Thread(target=fn, daemon=True).start() or True)
    first, second = (Race(TokenRecyclingDecoder(lm, max_new_tokens=12), GreedyDecoder(lm, 12), batcher=batcher)
                     for _ in range(2))
    lone = [Race(TokenRecyclingDecoder(lm, max_new_tokens=12), GreedyDecoder(lm, 12)) for _ in range(2)]
    for race, ids in zip([first, second, *lone], PROMPTS[:2] * 2):
        race.start(ids)
    forwards, joined, carried = batcher._forwards, [], []

    def forward_once_second_asks(lm_, requests):
        carried.append({id(r.cache) for r in requests})
        if not joined:
            joined.append(threading.Thread(target=second.step, daemon=True))
            joined[0].start()
            while not batcher._queue:  # the second tab's step is asked for while the first's runs
                threading.Event().wait(0.001)
        return forwards(lm_, requests)

    batcher._forwards = forward_once_second_asks
    first.step()
    joined[0].join(timeout=60)
    assert list(batcher.rounds) == [2], batcher.rounds
    ones, twos = ({id(r.decoder.cache), id(r.greedy.cache)} for r in (first, second))
    assert any(caches & ones and caches & twos for caches in carried), "no forward carried both tabs"
    for race, alone in zip([first, second], lone):
        alone.step()
        assert race.decoder.output == alone.decoder.output and race.greedy.output == alone.greedy.output


def test_a_lone_caller_runs_at_once_and_a_failed_forward_reaches_its_callers_only():
    lm = random_lm(family_configs()["llama"])
    batcher = Batcher()
    race = Race(GreedyDecoder(lm, 8), GreedyDecoder(lm, 8), batcher=batcher)
    race.start([5, 6, 7])
    race.step()
    assert list(batcher.rounds) == [1]
    bad = Race(GreedyDecoder(lm, 8), GreedyDecoder(lm, 8), batcher=batcher)
    bad.start([5, 6, 7])
    prepare = bad.decoder.prepare_step

    def outside():
        request = prepare()
        request.input_ids = torch.full_like(request.input_ids, 10_000)  # outside the vocabulary
        return request
    bad.decoder.prepare_step = outside
    with pytest.raises(IndexError):
        bad.step()
    race.step()  # the batcher goes on
    assert list(batcher.rounds) == [1, 1, 1] and len(race.decoder.output) == 2


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


@pytest.mark.parametrize("make", [lambda lm: TokenRecyclingDecoder(lm, max_new_tokens=60),
                                  lambda lm: ProgressiveTreeDecoder(lm, 60)], ids=["tr", "ptd"])
def test_a_planner_counts_its_own_host_work_not_the_time_its_neighbours_take(tiny_lm, make, monkeypatch):
    """In a class, a step's request waits while the other tabs' requests are made, and its second half
    waits while theirs are finished.  That waiting is not the decoder's host work: counted as such, a
    forward's tokens would look cheap beside it and the planner would grow the tree with the class.
    The decoder's own second half (here a slow prune) is."""
    def host_after_steps(dec, between: float = 0.0, in_prune: float = 0.0) -> float:
        prune = dec.prune
        monkeypatch.setattr(dec, "prune", lambda *a: (time.sleep(in_prune), prune(*a))[1])
        dec.start(PROMPTS[0])
        for _ in range(3):
            request = dec.prepare_step()
            time.sleep(between)  # the other tabs' requests are made
            logits = run_forwards(tiny_lm, [request])[0]
            time.sleep(between)  # the other tabs' steps are finished first
            dec.finish_step(request, logits)
        return dec.planner.host(1 + dec.steps[-1].tree.size)

    assert host_after_steps(make(tiny_lm), between=0.25) < 0.15  # a tiny model's own host work: milliseconds
    assert host_after_steps(make(tiny_lm), in_prune=0.25) > 0.15
