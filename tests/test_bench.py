"""The benchmark command end to end on the tiny model saved to a folder."""
import pytest
import csv
import json

from tr_core.bench.cli import main
from tr_core.bench.data import load_prompts

from .conftest import SPEC_BENCH


def write_prompts(path):
    rows = [("1", "writing", "w5 w9 w14"), ("2", "roleplay", "w30 w31 w32 w30 w31"), ("3", "qa", "w7 w8"),
            ("4", "qa", "w60 w2 w60 w2"), ("5", "qa", "w11")]
    path.write_text("\n".join(json.dumps({"question_id": q, "category": c, "turns": [t]}) for q, c, t in rows))


def save_tiny(lm, tmp_path):
    """The tiny model and tokenizer saved as a model folder (what ``--model`` takes)."""
    folder = tmp_path / "tiny"
    lm.model.save_pretrained(folder)
    lm.tokenizer.save_pretrained(folder)
    return folder


def test_prompts_are_grouped_and_limited(tmp_path):
    f = tmp_path / "q.jsonl"
    write_prompts(f)
    prompts = load_prompts(f, limit=2)
    assert [(p.question_id, p.category) for p in prompts] == [("1", "mt_bench"), ("2", "mt_bench"),
                                                              ("3", "qa"), ("4", "qa")]
    assert {p.category for p in load_prompts(f, group=False)} == {"writing", "roleplay", "qa"}


def test_offset_splits_each_category_into_disjoint_parts(tmp_path):
    f = tmp_path / "q.jsonl"
    write_prompts(f)
    first = load_prompts(f, limit=1)
    rest = load_prompts(f, offset=1)
    assert [p.question_id for p in first] == ["1", "3"] and [p.question_id for p in rest] == ["2", "4", "5"]
    assert [p.question_id for p in load_prompts(f, limit=1, offset=1)] == ["2", "4"]


@pytest.mark.parametrize("m", [2, 3, 4, 5, 9])
def test_method_order_balances_places_and_predecessors(m):
    from collections import Counter

    from tr_core.bench.harness import MethodSpec, rotated, williams_orders

    specs = [MethodSpec(str(i), None) for i in range(m)]
    cycle = len(williams_orders(m))
    assert cycle == (m if m % 2 == 0 else 2 * m)
    orders = [[int(s.name) for s in rotated(specs, n)] for n in range(cycle)]
    assert all(sorted(o) == list(range(m)) for o in orders)  # each order runs every method once
    places = Counter((o[i], i) for o in orders for i in range(m))
    assert set(places.values()) == {cycle // m}  # every method in every place equally often
    follows = Counter((o[i], o[i + 1]) for o in orders for i in range(m - 1))
    assert len(follows) == m * (m - 1) and len(set(follows.values())) == 1  # ... and after every other one
    assert [s.name for s in rotated(specs, cycle)] == [s.name for s in rotated(specs, 0)]


def fake_runs(method, seconds, tokens=10, category="qa"):
    from tr_core.bench.harness import TimedRun

    return [TimedRun(method, str(i), category, tokens, s, tokens, True) for i, s in enumerate(seconds)]


def test_speedup_is_over_the_fastest_greedy_with_a_bootstrap_interval():
    from tr_core.bench.report import summarize

    greedy = [1.0, 2.0, 1.5, 1.2]
    runs = (fake_runs("greedy", greedy) + fake_runs("greedy-aa", greedy)
            + fake_runs("hf-greedy", [s / 1.25 for s in greedy]) + fake_runs("tr", [s / 2.5 for s in greedy]))
    summary = summarize(runs)
    assert summary["baseline"] == "hf-greedy"  # 1.25x faster than ours: every speedup is over it
    tr = summary["methods"]["tr"]
    assert tr["speedup"] == 2.0 and tr["speedup_ci"] == [2.0, 2.0]  # the same ratio on every prompt
    assert summary["methods"]["greedy"]["speedup"] == 0.8
    assert summary["aa"]["ratio"] == 1.0 and summary["aa"]["ok"] and summary["warnings"] == []
    noisy = [s * f for s, f in zip(greedy, (0.5, 1.6, 0.9, 1.4))]
    wide = summarize(runs + fake_runs("tr2", noisy))["methods"]["tr2"]["speedup_ci"]
    assert wide[0] < wide[1]


def test_tr_is_read_head_to_head_against_prompt_lookup_in_every_category():
    from tr_core.bench.report import format_table, summarize

    greedy = [1.0, 2.0, 1.5, 1.2]
    runs = fake_runs("greedy", greedy) + fake_runs("tr", [s / 2 for s in greedy])
    pld = fake_runs("hf-pld", [s / 2.5 for s in greedy])
    pld[1].seconds = greedy[1] / 1.6  # prompt lookup gains less on one prompt of the second category
    for r in runs + pld:
        r.category = "ab"[int(r.question_id) % 2]
    summary = summarize(runs + pld)
    v = summary["versus"]["tr / hf-pld"]
    assert v["per_category"]["a"] == pytest.approx(0.8) and v["per_category"]["b"] > 1.0
    assert v["worst"] == ["a", pytest.approx(0.8)] and v["ci"][0] <= v["ratio"] <= v["ci"][1]
    assert "tr / hf-pld" in format_table(summary) and "lowest category a 0.80x" in format_table(summary)


def test_an_aa_pair_outside_its_band_warns_that_the_machine_was_busy():
    from tr_core.bench.report import format_table, summarize

    greedy = [1.0, 2.0, 1.5, 1.2]
    summary = summarize(fake_runs("greedy", greedy) + fake_runs("greedy-aa", [s * 1.1 for s in greedy]))
    assert summary["aa"]["ratio"] == 0.9091 and not summary["aa"]["ok"]
    assert "busy" in summary["warnings"][0] and "OUTSIDE" in format_table(summary)


@pytest.mark.slow  # the command end to end
def test_bench_command_writes_json_csv_and_chart(tmp_path, tiny_lm, capsys):
    folder = save_tiny(tiny_lm, tmp_path)
    f = tmp_path / "q.jsonl"
    write_prompts(f)
    out = tmp_path / "out.json"
    rc = main(["--prompts", str(f), "--limit", "2", "--methods", "greedy,tr:tr-16,tr:chain-3+pld4,tr:best12,pld,hf-pld,hf-pld:same",
               "--max-new-tokens", "12", "--model", str(folder), "--json", str(out), "--csv", str(tmp_path / "o.csv"),
               "--chart", str(tmp_path / "chart.html"), "--quiet", "--warmup", "1", "--save-runs", str(tmp_path / "runs")])
    assert rc == 0
    summary = json.loads(out.read_text())
    saved = sorted(x.name.split("-", 1)[1] for x in (tmp_path / "runs").iterdir())  # step decoders only
    assert saved == sorted(["tr:tr-16.json", "tr:chain-3+pld4.json", "tr:best12.json", "pld.json"] * 4)
    methods = summary["methods"]
    assert list(methods) == ["greedy", "greedy-aa", "hf-greedy", "tr:tr-16", "tr:chain-3+pld4", "tr:best12", "pld",
                             "hf-pld", "hf-pld:same"]
    assert methods["tr:best12"]["mean_forward_tokens"] <= 13.0  # the budget: 12 draft nodes and the root
    assert summary["meta"]["trees"]["tr:best12"].startswith("the best 12 draft nodes a step")
    for name, m in methods.items():
        assert m["identical"] == 1.0, name
        assert m["prompts"] == 4 and m["new_tokens"] > 0
        assert set(m["per_category"]) == {"mt_bench", "qa"}
        assert {"tok_per_s", "mat", "speedup", "identical"} <= set(m)
    assert summary["baseline"] in ("greedy", "hf-greedy") and methods[summary["baseline"]]["speedup"] == 1.0
    assert methods["greedy"]["mat"] == 1.0 and summary["aa"]["pair"] == ["greedy-aa", "greedy"]
    lo, hi = methods["tr:tr-16"]["speedup_ci"]
    assert lo <= methods["tr:tr-16"]["speedup"] <= hi
    assert methods["tr:tr-16"]["mean_forward_tokens"] == 17.0  # the paper's method: the full shape every step
    assert summary["meta"]["trees"]["tr:tr-16"] == "tr-16 (16 nodes) (the paper's method)"
    trees = summary["meta"]["trees"]
    assert summary["meta"]["peers"] == "untouched" and "untouched" in trees["hf-greedy"] and "untouched" in trees["hf-pld"]
    assert "same model" in trees["hf-pld:same"]  # prompt lookup on our kernels: the algorithms compared alone
    assert summary["versus"] == {}  # no plain "tr" row in this run: nothing to read head to head
    rows = list(csv.DictReader(open(tmp_path / "o.csv")))
    assert {r["category"] for r in rows} == {"overall", "mt_bench", "qa"} and len(rows) == 9 * 3
    assert (tmp_path / "chart.html").stat().st_size > 1000
    printed = capsys.readouterr().out
    assert "speedup" in printed and "mt_bench" in printed


def test_bench_command_reports_bad_input(tmp_path, capsys):
    assert main(["--prompts", str(tmp_path / "absent.jsonl")]) == 2
    assert "error" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    assert main(["--prompts", str(bad)]) == 2


@pytest.mark.slow  # the command end to end
def test_bench_runs_ptd_second_turns_and_sampling(tmp_path, tiny_lm, capsys):
    folder = save_tiny(tiny_lm, tmp_path)
    f = tmp_path / "q.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in [
        {"question_id": "1", "category": "writing", "turns": ["w5 w9 w14", "w30 w31 w32"]},
        {"question_id": "2", "category": "qa", "turns": ["w7 w8 w7 w8"]}]))
    out = tmp_path / "out.json"
    common = ["--prompts", str(f), "--max-new-tokens", "10", "--model", str(folder), "--quiet", "--json", str(out)]
    assert main([*common, "--methods", "greedy,ptd,ptd:8x8,tr,tr:uniform,ptd:paper,hf-pld", "--turns", "2",
                 "--peers", "same"]) == 0
    methods = json.loads(out.read_text())["methods"]
    meta = json.loads(out.read_text())["meta"]
    assert meta["peers"] == "same" and "same model" in meta["trees"]["hf-pld"]  # no second copy loaded
    curve = meta["cost_curve"]  # this machine's measured forward cost, as the planners started from it
    assert curve["ratio_to_1"][0] == 1.0 and len(curve["ms"]) == len(curve["lengths"]) and curve["ms"][0] > 0
    assert list(methods) == ["greedy", "greedy-aa", "hf-greedy", "ptd", "ptd:8x8", "tr", "tr:uniform", "ptd:paper",
                             "hf-pld"]
    trees = json.loads(out.read_text())["meta"]["trees"]
    assert "uniform priors" in trees["tr:uniform"] and "cost-aware" in trees["ptd"] and "cost" not in trees["ptd:paper"]
    for m in methods.values():
        assert m["prompts"] == 3 and m["identical"] == 1.0  # two turns of question 1 + question 2
    assert main([*common, "--methods", "tr,ptd,pld", "--temperature", "0.7", "--top-p", "0.9"]) == 0
    summary = json.loads(out.read_text())
    assert list(summary["methods"]) == ["sample", "sample-aa", "tr", "ptd", "pld"]
    assert all(m["identical"] is None for m in summary["methods"].values())
    assert summary["meta"]["sampling"]["temperature"] == 0.7
    assert "n/a" in capsys.readouterr().out
    assert main([*common, "--methods", "tr", "--temperature", "0.5", "--top-p", "2"]) == 2


def test_lookup_prior_is_replayed_from_known_outputs():
    from tr_core.bench.calibrate import MIN_TRIALS, PSEUDO_TRIALS, lookup_acceptance
    from tr_core.planner import ChainStats

    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    out = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]  # copies the prompt, then leaves it
    n = MIN_TRIALS
    table = lookup_acceptance([prompt] * n, [out] * n, span=12)
    # t=0: "10" occurs nowhere earlier, no continuation; one token committed.  t=1: "1" continues as
    # 2..10, 1, 2 (past the context's end, round the loop) against 2..10, 11, 12 (cut to the 11 tokens
    # left): nine accepted, the tenth not; then nothing matches "11" or "12".
    geo = [ChainStats.PRIOR_RATE[1] ** (i + 1) for i in range(11)]
    expect = [(n * hit + PSEUDO_TRIALS * g) / (n + PSEUDO_TRIALS) for hit, g in zip([1] * 9 + [0, 0], geo)]
    assert table["1"]["cold"][:11] == pytest.approx(expect, abs=1e-4) and table["1"]["cold"][11:] == [None]
    assert all(r > 0 for r in table["1"]["cold"][:10])  # small where the geometric prior is, never a hard 0
    assert 0 < table["1"]["cold"][9] < 0.001  # a miss seen 20 times
    assert table["1"]["hot"] == [None] * 12 and table["3"] == {"cold": [None] * 12, "hot": [None] * 12}
    few = lookup_acceptance([prompt] * (n - 1), [out] * (n - 1), span=12)
    assert few["1"]["cold"] == [None] * 12  # too few observations: no prior (the geometric one holds)
    copy = lookup_acceptance([prompt + prompt] * n, [prompt + prompt] * n, span=4)  # copying throughout
    assert all(r > 0.9 for r in copy["16"]["hot"])  # after a run of 4, the next continuation is hot
    assert all(r > 0.9 for r in copy["8"]["cold"])  # matched over 8+ tokens: a copy, trusted cold too


def test_zero_priors_are_floored_so_nothing_is_shut_for_good():
    from tr_core.planner import RATE_FLOOR, ChainStats

    stats = ChainStats(prior={(2, True, 1): 0.0})
    assert stats.estimate(2, 1, hot=True) == pytest.approx(RATE_FLOOR)
    stats.record(2, 2, 2, hot=True)  # offered and accepted once: the estimate moves off the floor
    assert stats.estimate(2, 1, hot=True) > 0.1


def test_presets_grow_best_first_from_the_rates():
    from tr_core.bench.calibrate import grow_preset
    from tr_core.trees import TreeShape

    u = TreeShape.from_paths([[0], [1], [0, 0], [0, 1], [1, 0]])
    rates = [0.5, 0.1, 0.4, 0.05, 0.3]  # [1, 0] is rated above [1] but needs its parent first
    assert grow_preset(u, rates, 2) == [[0], [0, 0]]
    assert grow_preset(u, rates, 4) == [[0], [1], [0, 0], [1, 0]]


@pytest.mark.slow  # the command end to end
def test_calibrate_command_writes_priors_presets_and_where_they_came_from(tmp_path, tiny_lm):
    import shutil

    from tr_core.bench.calibrate import main as calibrate
    from tr_core.planner import lookup_prior
    from tr_core.trees import PRESET_DIR, TreeShape

    folder = save_tiny(tiny_lm, tmp_path)
    prompts = tmp_path / "q.jsonl"
    write_prompts(prompts)
    presets = tmp_path / "presets"
    presets.mkdir()
    shutil.copy(PRESET_DIR / "paper-80.json", presets / "paper-80.json")
    assert calibrate(["--prompts", str(prompts), "--offset", "1", "--limit", "2", "--max-new-tokens", "12",
                      "--model", str(folder), "--write", str(presets)]) == 0
    data = json.loads((presets / "paper-80.json").read_text())
    assert data["calibration"]["offset"] == 1 and data["calibration"]["prompt_count"] == 3  # ids 2, 4, 5
    assert len(data["acceptance"]) == 80 and set(data["lookup_acceptance"]) == {"1", "2", "3", "4", "8", "16"}
    tr8 = json.loads((presets / "tr-8.json").read_text())
    assert len(tr8["nodes"]) == 8 and "--offset 1" in tr8["calibration"]["command"]
    TreeShape.from_paths(tr8["nodes"])  # a valid tree: every parent is in
    shipped = json.loads((PRESET_DIR / "paper-80.json").read_text())
    assert shipped["calibration"]["offset"] >= 10  # the shipped priors never saw the evaluation split
    assert lookup_prior("paper-80")


@pytest.mark.slow  # the command end to end
def test_bench_reads_tr_against_prompt_lookup_and_refuses_bad_settings(tmp_path, tiny_lm, capsys):
    folder = save_tiny(tiny_lm, tmp_path)
    f = tmp_path / "q.jsonl"
    write_prompts(f)
    out = tmp_path / "out.json"
    common = ["--prompts", str(f), "--max-new-tokens", "10", "--model", str(folder), "--quiet"]
    assert main([*common, "--limit", "1", "--methods", "tr,pld", "--peers", "same", "--json", str(out)]) == 0
    versus = json.loads(out.read_text())["versus"]["tr / pld"]
    assert set(versus["per_category"]) == {"mt_bench", "qa"} and versus["worst"][0] in versus["per_category"]
    assert "tr / pld:" in capsys.readouterr().out
    for bad in (["--methods", "tr,tr"], ["--methods", "pld:3"], ["--methods", "hf-pld:other"], ["--methods", "tr:best"],
                ["--methods", "tr:best0"]):
        assert main([*common, *bad]) == 2
        assert "error" in capsys.readouterr().err
    for bad in (["--warmup", "-1"], ["--offset", "-2"], ["--temperature", "-0.5"], ["--k", "0"], ["--lookup", "-1"]):
        with pytest.raises(SystemExit):
            main([*common, *bad])


def test_overlap_with_the_calibration_split_is_warned_about_only_on_spec_bench(tmp_path):
    from tr_core.bench.data import calibration_overlap
    from tr_core.trees import PRESET_DIR

    record = json.loads((PRESET_DIR / "paper-80.json").read_text())["calibration"]
    lo, n = record["offset"], record["limit"]
    assert calibration_overlap(SPEC_BENCH, 0, 10, False) is None  # the evaluation split
    assert f"questions {lo + 1}-{lo + n}" in calibration_overlap(SPEC_BENCH, 0, lo + 1, False)
    assert calibration_overlap(SPEC_BENCH, lo, 2, False)  # --split calib: the very prompts learnt on
    assert calibration_overlap(tmp_path / "mbpp" / "question.jsonl", 0, 20, False) is None  # another file


def test_calibrate_refuses_to_write_priors_learnt_on_the_evaluation_split(capsys):
    from tr_core.bench.calibrate import main as calibrate

    for args in (["--offset", "0", "--write", "presets"], ["--limit", "0"], ["--max-new-tokens", "0"]):
        with pytest.raises(SystemExit):
            calibrate(["--prompts", str(SPEC_BENCH), *args])
    assert "calibration split" in capsys.readouterr().err


@pytest.mark.slow  # the command end to end
def test_ablation_command_prints_one_row_per_addition_all_lossless(tmp_path, tiny_lm, capsys):
    from tr_core.bench.ablate import VARIANTS, main as ablate

    folder = save_tiny(tiny_lm, tmp_path)
    prompts = tmp_path / "q.jsonl"
    write_prompts(prompts)
    out = tmp_path / "ablate.json"
    assert ablate(["--prompts", str(prompts), "--split", "eval", "--limit", "2", "--max-new-tokens", "12",
                   "--tree", "tr-16", "--lookup", "6", "--model", str(folder), "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["name"] for r in rows] == [name for name, _ in VARIANTS]
    assert all(r["identical"] == r["prompts"] == 4 for r in rows)  # every variant equals greedy
    assert rows[0]["mean_forward_tokens"] == 17.0 > rows[1]["mean_forward_tokens"]  # blank drafts left out
    assert "MAT/fwd" in capsys.readouterr().out


@pytest.mark.slow  # the command end to end
def test_kernel_command_times_every_size_per_kernel(tmp_path, tiny_lm, capsys):
    from tr_core.bench.kernels import SIZES, main as kernels

    folder = save_tiny(tiny_lm, tmp_path)
    out = tmp_path / "kernels.json"
    assert kernels(["--model", str(folder), "--repeats", "1", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert "plain" in data["seconds"] and all(len(v) == len(SIZES) for v in data["seconds"].values())
    assert set(data["fastest"].values()) <= set(data["seconds"])
    assert "fastest by size" in capsys.readouterr().out


def test_a_class_decodes_every_prompt_as_generate_does_with_its_slots_always_full(tiny_lm):
    """``--concurrency``'s decode: N slots in flight, each taking the next prompt when its sequence
    ends; every finished sequence is greedy's, and a changed token is caught by the comparison."""
    from tr_core.bench.classroom import ClassBench, agree, decode_class

    from .conftest import reference_greedy

    prompts = [[5, 9, 14], [30, 31, 32, 30, 31], [7, 8], [60, 2, 60, 2], [11]]
    bench = ClassBench(tiny_lm, 12)
    tr = decode_class(tiny_lm, bench.decoders("tr", 3), prompts, "tr", jobs=6)
    assert len(tr.done) == 6 and tr.steps == 3 * tr.forwards and tr.seconds > 0
    for j, out in tr.outputs.items():  # the slots still decoding when the sixth ended: greedy's so far
        reference = reference_greedy(tiny_lm, prompts[j % len(prompts)], 12)
        assert out == reference if j in tr.done else reference[:len(out)] == out, j
    # greedy's jobs take one step a token, whatever the machine: jobs 0-2 end together, 3-5 start, and
    # when the fourth is done the other two are still counted
    assert len(decode_class(tiny_lm, bench.decoders("greedy", 3), prompts, "greedy", jobs=4).outputs) == 6
    greedy = decode_class(tiny_lm, bench.decoders("greedy", 3), prompts, "greedy", jobs=6)
    assert agree(tr, greedy)
    shared = min(tr.done & greedy.done)
    greedy.outputs[shared] = greedy.outputs[shared][:-1] + [greedy.outputs[shared][-1] + 1]
    assert not agree(tr, greedy)
    rows = bench.run(prompts, [1, 2], repeats=1, progress=lambda *_: None)
    assert [r["n"] for r in rows] == [1, 2] and all(r["identical"] for r in rows)
    assert rows[1]["methods"]["tr"]["batch_tokens"] > rows[1]["methods"]["greedy"]["batch_tokens"] >= 1.9
