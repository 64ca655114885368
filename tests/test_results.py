"""The shipped result files and the benchmark page made from them."""
from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIELDS = {"commit", "cpu", "date", "command", "torch", "transformers"}


def test_every_result_file_says_how_it_was_made():
    files = sorted((ROOT / "assets" / "bench").glob("*.json"))
    assert files and [f.name for f in (ROOT / "assets" / "bench").iterdir() if f.suffix != ".json"] == []
    for f in files:
        p = json.loads(f.read_text())["provenance"]
        assert FIELDS <= set(p) and all(p[k] for k in FIELDS), f.name
        assert p["command"].startswith("python -m tr_core.bench"), f.name


def test_the_benchmark_page_is_what_the_result_files_give(monkeypatch):
    from tr_core.bench.docs import main, render

    monkeypatch.chdir(ROOT)
    page = (ROOT / "docs" / "benchmark.md").read_text(encoding="utf-8")
    assert page == render("assets/bench", "docs/benchmark.md"), \
        "run: python -m tr_core.bench.docs assets/bench docs/benchmark.md"
    assert main(["assets/bench", "docs/benchmark.md", "--check"]) == 0
    for f in sorted((ROOT / "assets" / "bench").glob("*.json")):
        assert f"## `{f.name}`" in page


def test_the_page_command_notices_a_stale_page(tmp_path, capsys):
    from tr_core.bench.docs import main

    folder = tmp_path / "results"
    folder.mkdir()
    src = ROOT / "assets" / "bench" / "cpu_ablation_eval.json"
    (folder / src.name).write_text(src.read_text())
    page = tmp_path / "page.md"
    assert main([str(folder), str(page), "--check"]) == 1  # none yet
    assert main([str(folder), str(page)]) == 0 and main([str(folder), str(page), "--check"]) == 0
    (folder / "cpu_kernels.json").write_text((ROOT / "assets" / "bench" / "cpu_kernels.json").read_text())
    assert main([str(folder), str(page), "--check"]) == 1 and "is not what" in capsys.readouterr().err


def test_a_result_file_records_commit_cpu_date_and_command(tmp_path):
    from tr_core.bench.report import write_json

    out = tmp_path / "r.json"
    write_json({"methods": {}}, out, "python -m tr_core.bench", ["--limit", "2", "--prompts", "a b.jsonl"])
    p = json.loads(out.read_text())["provenance"]
    assert FIELDS <= set(p) and p["command"] == "python -m tr_core.bench --limit 2 --prompts 'a b.jsonl'"
    assert p["commit"] == "unknown" or len(p["commit"].split("+")[0]) == 40
    assert p["date"].endswith("Z") and "cores)" in p["cpu"]
