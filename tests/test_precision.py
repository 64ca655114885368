"""Exact or explained: every divergence from greedy decoding in reduced precision is measured by the
reference's own logit margin and classified; rounding reads as a near-tie, a wrong verifier as a bug."""
import re

import pytest
import torch

from tr_core import GreedyDecoder, TokenRecyclingDecoder
from tr_core.precision import BUG, NEAR_TIE, describe, explain_divergence, rounding_bound, ulp
from tr_core.verify import Verdict

from .conftest import DEVICE

NEW_TOKENS = 48
# Prompts whose bf16 Token Recycling output leaves bf16 greedy's within NEW_TOKENS on this model.
BF16_PROMPTS = [
    "Who wrote Pride and Prejudice, and when was it published?",
    "List three uses of copper.",
    "Summarize: Token Recycling stores candidate tokens from past forward passes in a matrix "
    "and reuses them as drafts, so decoding needs fewer forward passes without changing the output.",
]


def accept_drafts_unchecked(tokens, logits, tree) -> Verdict:
    """A deliberately wrong verifier: follows the last child at every level (the lowest-ranked draft;
    the first is often right, e.g. step 1's, drafted from the prompt's own logits) without comparing
    it with the model's choice, then adds the model's token."""
    choices = logits.argmax(dim=-1)
    path, nodes = [0], torch.arange(tokens.shape[0], device=tokens.device)
    while True:
        kids = nodes[(tree.parents == path[-1]) & (nodes > 0)]
        if not len(kids):
            break
        path.append(int(kids[-1]))
    return Verdict(path=torch.tensor(path, device=tokens.device), bonus=choices[path[-1]], choices=choices)


def test_units_of_rounding():
    assert ulp(20.0, torch.bfloat16) == 0.125 and ulp(40.0, torch.bfloat16) == 0.25
    assert ulp(20.0, torch.float16) == 2.0 ** -6
    assert ulp(20.0, torch.float32) == 2.0 ** -19
    assert rounding_bound(20.0, torch.bfloat16) == 1.0  # 8 ulps
    assert rounding_bound(20.0, torch.float32) < 2e-5  # float32: any visible divergence is a bug


def wrong_tr(lm, monkeypatch, ids):
    monkeypatch.setattr("tr_core.decoders.tree_step.verify_greedy", accept_drafts_unchecked)
    return TokenRecyclingDecoder(lm, tree="tr-16", lookup=0, max_new_tokens=NEW_TOKENS).generate(ids)


def test_a_wrong_verifier_is_a_bug_in_float32(tiny_lm, monkeypatch):
    ids = [5, 6, 7, 8, 9, 10, 11]
    reference = GreedyDecoder(tiny_lm, NEW_TOKENS).generate(ids)
    assert TokenRecyclingDecoder(tiny_lm, tree="tr-16", max_new_tokens=NEW_TOKENS).generate(ids) == reference
    div = explain_divergence(tiny_lm, ids, reference, wrong_tr(tiny_lm, monkeypatch, ids))
    assert div is not None and div.cause == BUG and div.margin > div.bound
    assert "bug" in describe(div)


@pytest.fixture(scope="module")
def bf16_lm():
    from tr_core import load_model

    return load_model(device=DEVICE, dtype="bfloat16")


@pytest.mark.slow
def test_bf16_divergences_on_the_embedded_model_are_near_ties(bf16_lm):
    lm, found = bf16_lm, []
    # Where forwards round apart depends on the CPU's kernels: tr-24's 25-token forwards first (a third of
    # paper-80's cost where there are no packed bfloat16 kernels, on AVX2-only CPUs), paper-80 if they do not
    for tree, size in (("tr-24", 25), ("paper-80", 81)):
        for prompt in BF16_PROMPTS:
            ids = lm.encode_prompt(prompt)
            reference = GreedyDecoder(lm, NEW_TOKENS).generate(ids)
            dec = TokenRecyclingDecoder(lm, tree=tree, lookup=0, max_new_tokens=NEW_TOKENS)
            div = explain_divergence(lm, ids, reference, dec.generate(ids), forward_tokens=size)
            if div is not None:
                assert div.cause == NEAR_TIE, f"{prompt!r}: {div}"
                assert 0 <= div.margin <= div.bound
                found.append(div)
        if found:
            break
    assert found, "no prompt diverged: the classification above was never exercised"
    text = describe(found[0], lm.token_text)
    assert f"token {found[0].position + 1}" in text and f"{size}-token forward" in text and "float32 mode avoids it" in text


@pytest.mark.slow
def test_bf16_wrong_verifier_is_a_bug(bf16_lm, monkeypatch):
    ids = bf16_lm.encode_prompt(BF16_PROMPTS[1])
    reference = GreedyDecoder(bf16_lm, NEW_TOKENS).generate(ids)
    div = explain_divergence(bf16_lm, ids, reference, wrong_tr(bf16_lm, monkeypatch, ids))
    assert div is not None and div.cause == BUG


def test_the_race_explains_the_first_divergence_and_the_run_file_keeps_it(tiny_lm, monkeypatch):
    """The app's race (here through a run file made by it) says where the outputs part and why."""
    import json

    from components.panels import PANELS, draw_panels
    from components.run_view import RunView
    from tr_core.runs import RunFileError, read_run, record_run

    monkeypatch.setattr("tr_core.decoders.tree_step.verify_greedy", accept_drafts_unchecked)
    run = record_run(tiny_lm, "w3 w4 w5 w6 w7 w8 w9",
                     TokenRecyclingDecoder(tiny_lm, tree="tr-16", lookup=0, max_new_tokens=NEW_TOKENS),
                     GreedyDecoder(tiny_lm, NEW_TOKENS))
    div = run.header["divergence"]
    assert div["cause"] == BUG
    doc = run.to_dict()
    panels = dict(zip(PANELS, draw_panels(RunView.of_run(read_run(json.dumps(doc))))))
    assert f"token {div['position'] + 1}:" in panels["counters"] and "bug" in panels["counters"]
    assert re.search(f'class="[^"]*tok-mark[^"]*" data-step="\\d+" data-pos="{div["position"]}"', panels["text"])
    doc["header"]["divergence"]["cause"] = "<script>"  # an uploaded file is checked field by field
    with pytest.raises(RunFileError):
        read_run(json.dumps(doc))


def test_bench_mismatches_carry_margin_and_cause(tiny_lm, monkeypatch):
    """Each mismatch in the bench's JSON has position, both tokens, the margin and its cause."""
    from tr_core.bench.data import BenchPrompt
    from tr_core.bench.harness import parse_methods, run_benchmark
    from tr_core.bench.report import format_table, summarize

    monkeypatch.setattr("tr_core.decoders.tree_step.verify_greedy", accept_drafts_unchecked)
    prompts = [BenchPrompt("1", "qa", "w3 w4 w5 w6 w7"), BenchPrompt("2", "qa", "w9 w8 w7 w6")]
    specs = parse_methods("tr:tr-16", tiny_lm)
    summary = summarize(run_benchmark(tiny_lm, prompts, specs, 24, warmup=0, progress=False))
    wrong = summary["methods"]["tr:tr-16"]["mismatches"]
    assert wrong and all(m["cause"] == BUG and m["margin"] > m["bound"] for m in wrong)
    assert {"position", "greedy_token", "method_token", "margin", "cause", "forward_tokens"} <= set(wrong[0])
    assert not summary["methods"]["greedy-aa"]["mismatches"]
    assert f"bug {len(wrong)}" in format_table(summary)
