"""Lossless sampling: the processing matches ``generate``, runs are reproducible, and the tree walk
gives exactly plain sampling's distribution (a chi-square test that a wrong rule fails)."""
import dataclasses

import pytest
import torch

from tr_core import AdjacencyMatrix, GreedyDecoder, TokenRecyclingDecoder
from tr_core.decoders import ProgressiveTreeDecoder, PromptLookupDecoder
from tr_core.cost import CostCurve
from tr_core.planner import TreePlanner
from tr_core.progressive import PTDConfig, PTDPlanner
from tr_core.sampling import Sampler, SamplingConfig
from tr_core.verify import Verdict, verify_greedy

from .conftest import lockstep, make_tiny_model, make_tiny_tokenizer

PROMPT = [30, 31, 32, 33, 30, 31, 32, 33, 30, 31]
CONFIG = dict(temperature=2.0, top_k=24, top_p=0.95)


def test_processing_matches_generate(tiny_lm):
    cfg = SamplingConfig(**CONFIG)
    out = tiny_lm.model.generate(torch.tensor([PROMPT]), max_new_tokens=3, output_scores=True, output_logits=True,
                                 return_dict_in_generate=True, **cfg.generate_kwargs())
    sampler = Sampler(cfg, tiny_lm.device)
    for raw, processed in zip(out.logits, out.scores):
        ours = sampler.processors(None, raw.float())
        assert torch.equal(torch.isinf(ours), torch.isinf(processed))
        finite = ~torch.isinf(processed)
        assert torch.allclose(ours[finite], processed[finite])


@pytest.mark.parametrize("bad", [dict(temperature=0), dict(top_p=0), dict(top_p=1.5), dict(top_k=-1)])
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValueError):
        SamplingConfig(**bad)


@pytest.mark.parametrize("make", [
    lambda lm, s: TokenRecyclingDecoder(lm, tree="tr-16", lookup=5, max_new_tokens=30, sampling=s),
    lambda lm, s: PromptLookupDecoder(lm, 30, sampling=s),
    lambda lm, s: ProgressiveTreeDecoder(lm, 30, sampling=s),
    lambda lm, s: GreedyDecoder(lm, 30, sampling=s),
])
def test_same_seed_same_output(tiny_lm, make):
    a = make(tiny_lm, SamplingConfig(seed=7, **CONFIG)).generate(PROMPT)
    b = make(tiny_lm, SamplingConfig(seed=7, **CONFIG)).generate(PROMPT)
    others = {tuple(make(tiny_lm, SamplingConfig(seed=s, **CONFIG)).generate(PROMPT)) for s in range(8, 12)}
    assert a == b and len(others | {tuple(a)}) > 1


@pytest.mark.parametrize("make", [
    # the cost-aware auto tree, as PTD's below: refitted on the timings it sees, starting cheap (a curve
    # measured on this tiny model under a loaded suite can otherwise plan no tree at all)
    lambda lm, s: TokenRecyclingDecoder(lm, max_new_tokens=30, sampling=s, planner=TreePlanner(
        dataclasses.replace(lm, cost_curve=CostCurve([1, 101], [1.0, 1.3])))),
    lambda lm, s: ProgressiveTreeDecoder(lm, 30, PTDConfig.default(), s, planner=PTDPlanner(
        CostCurve([1, 101], [1.0, 1.3]), 48)),  # cost-aware: refitted on the timings it sees; cheap at first
    lambda lm, s: PromptLookupDecoder(lm, 30, sampling=s),
])
def test_a_seed_gives_plain_samplings_text_whatever_the_tree(tiny_lm, make):
    """A draw depends on the seed and the position only, so trees chosen by timing change nothing: in
    float32 the text is plain sampling's with the same seed, token for token."""
    accepted = 0
    for seed in range(4):
        plain = GreedyDecoder(tiny_lm, 30, sampling=SamplingConfig(seed=seed, **CONFIG)).generate(PROMPT)
        dec = make(tiny_lm, SamplingConfig(seed=seed, **CONFIG))
        assert dec.generate(PROMPT) == plain, seed
        accepted += sum(s.accepted_drafts for s in dec.steps)
    assert accepted > 0, "no draft was accepted: the walk was not exercised"


def test_step_trace_shows_the_draws(tiny_lm):
    dec = TokenRecyclingDecoder(tiny_lm, tree="tr-16", lookup=0, max_new_tokens=30,
                                sampling=SamplingConfig(seed=1, **CONFIG))
    dec.generate(PROMPT)
    for s in dec.steps:
        assert s.sampled
        path = s.accepted_path
        for parent, child in zip(path, path[1:]):  # each accepted node is the draw at its parent
            assert s.tree.tokens[child] == s.model_choices[parent]
        assert s.committed[-1] == s.model_choices[path[-1]] or s.done


# ---- the distribution of the first two tokens -------------------------------------------------
def exact_two_token_distribution(lm, cfg: SamplingConfig) -> torch.Tensor:
    """``[V, V]``: P(first = a, second = b) under plain sampling, computed from the model."""
    sampler = Sampler(cfg, lm.device)
    with torch.no_grad():
        p1 = sampler.probabilities(lm.model(torch.tensor([PROMPT])).logits[0, -1:])[0]
        batch = torch.tensor([PROMPT + [a] for a in range(lm.vocab_size)])
        p2 = sampler.probabilities(lm.model(batch).logits[:, -1])
    return p1[:, None] * p2


def chi_square_p(counts: torch.Tensor, expected: torch.Tensor) -> float:
    """Goodness of fit; outcomes expected fewer than 5 times are pooled into one bin."""
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum()[None]]).double()
    exp = torch.cat([expected[big], expected[~big].sum()[None]]).double()
    keep = exp > 0
    stat = ((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum()
    df = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.double), stat / 2))


def sample_first_two(lm, runs: int, make, together: int = 50) -> tuple[torch.Tensor, int]:
    """``(counts [V, V] of the first two tokens, runs that committed a drafted token)`` over ``runs``
    decoders (``make(config)``, seeds 0, 1, ...), ``together`` at a time stepping as a class's tabs do
    (their forwards shared): each run's draws depend on its seed alone, so this is plain sampling's
    distribution only if the batched walk is also exact."""
    counts = torch.zeros(lm.vocab_size, lm.vocab_size)
    drafted = 0
    for first in range(0, runs, together):
        decoders = [make(SamplingConfig(seed=seed, **CONFIG)) for seed in range(first, min(first + together, runs))]
        lockstep(lm, decoders, [PROMPT] * len(decoders))
        for dec in decoders:
            a, b = dec.output
            counts[a, b] += 1
            drafted += sum(s.accepted_drafts for s in dec.steps) > 0
    return counts, drafted


@pytest.fixture(scope="module")
def class_lm():
    """The tiny model on the project's attention, so that runs stepping together share their forwards
    (:mod:`tr_core.batching`), as a class's tabs do on the app's models."""
    from tr_core import wrap_model
    from tr_core.attention import register
    from tr_core.batching import can_pack

    model = make_tiny_model()
    model.set_attn_implementation(register())
    lm = wrap_model(model, make_tiny_tokenizer(), name="tiny-llama")
    assert can_pack(lm)
    return lm


@pytest.fixture(scope="module")
def warm_matrix(class_lm):
    """A matrix filled by a few decodes, copied afresh for every run so runs stay independent."""
    m = AdjacencyMatrix(class_lm.vocab_size, 8, fingerprint=class_lm.fingerprint)
    for seed in range(6):
        TokenRecyclingDecoder(class_lm, tree="paper-80", matrix=m, lookup=0, max_new_tokens=40,
                              sampling=SamplingConfig(seed=seed, **CONFIG)).generate(PROMPT)
    return m.table.clone()


def tr_maker(lm, table):
    def make(cfg):
        m = AdjacencyMatrix(lm.vocab_size, 8, fingerprint=lm.fingerprint)
        m.table.copy_(table)
        return TokenRecyclingDecoder(lm, tree="paper-80", matrix=m, lookup=0, max_new_tokens=2, sampling=cfg)
    return make


RUNS = 2000
WRONG_RUNS = 800  # the biased rule below already fails with 800 runs (p measured at 0.0): the test has the power


def test_tr_sampling_has_plain_sampling_distribution(class_lm, warm_matrix):
    expected = exact_two_token_distribution(class_lm, SamplingConfig(**CONFIG)) * RUNS
    counts, drafted = sample_first_two(class_lm, RUNS, tr_maker(class_lm, warm_matrix))
    assert drafted > RUNS // 3, "most runs should commit a drafted token, or the walk is not tested"
    assert chi_square_p(counts, expected) > 1e-3
    plain, _ = sample_first_two(class_lm, RUNS, lambda cfg: GreedyDecoder(class_lm, 2, sampling=cfg))
    assert chi_square_p(plain, expected) > 1e-3


def test_a_wrong_rule_fails_the_same_test(class_lm, warm_matrix, monkeypatch):
    """'Accept the model's most likely child, then sample its own token' is biased: the test sees it."""
    def most_likely_child(tokens, logits, tree, sampler, positions):
        greedy = verify_greedy(tokens, logits, tree)
        draws = sampler.draw(logits, positions)
        return Verdict(path=greedy.path, bonus=draws[greedy.path[-1]], choices=draws)

    import tr_core.decoders.tree_step as tree_step

    monkeypatch.setattr(tree_step, "verify_sampled", most_likely_child)
    expected = exact_two_token_distribution(class_lm, SamplingConfig(**CONFIG)) * WRONG_RUNS
    counts, _ = sample_first_two(class_lm, WRONG_RUNS, tr_maker(class_lm, warm_matrix))
    assert chi_square_p(counts, expected) < 1e-6
