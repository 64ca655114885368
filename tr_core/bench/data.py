"""Prompts in Spec-Bench format: one JSON object a line with ``question_id``, ``category``, ``turns``."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


# Spec-Bench's MT-bench questions carry their eight subcategories; the paper reports them as one.
MT_BENCH = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
PAPER_ORDER = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag", "code")


def paper_category(category: str) -> str:
    """The paper's column for a Spec-Bench category (MT-bench's subcategories together)."""
    return "mt_bench" if category in MT_BENCH else category


@dataclass(frozen=True)
class BenchPrompt:
    question_id: str
    category: str
    text: str  # the first turn
    turns: tuple[str, ...] = ()  # all user turns (MT-bench has two)


EVAL_PER_CATEGORY = 10  # the evaluation split: the first 10 questions of each category
SPLITS = {"eval": 0, "calib": EVAL_PER_CATEGORY}  # split name -> questions skipped per category


def load_prompts(path: str | Path, limit: int | None = None, group: bool = True,
                 offset: int = 0) -> list[BenchPrompt]:
    """Questions with all their turns, at most ``limit`` per category after skipping the first
    ``offset`` of each, in file order.  The reported figures use ``offset`` 0 and at most
    ``EVAL_PER_CATEGORY`` a category (the evaluation split); whatever is learnt from data comes
    from ``offset`` ``EVAL_PER_CATEGORY`` on (the calibration split), so the two never overlap.

    ``group``: MT-bench's eight subcategories count as one category, ``mt_bench``, as in the paper.
    """
    out, per_cat = [], {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                turns = tuple(str(t) for t in row["turns"])
                text = turns[0]
                cat = str(row.get("category", "default"))
                cat = paper_category(cat) if group else cat
            except (json.JSONDecodeError, KeyError, IndexError, TypeError) as err:
                raise ValueError(f"{path}:{n}: not a Spec-Bench question ({err})") from None
            seen = per_cat[cat] = per_cat.get(cat, 0) + 1
            if seen <= offset or (limit is not None and seen > offset + limit):
                continue
            out.append(BenchPrompt(str(row.get("question_id", n)), cat, text, turns))
    return out


PROMPTS_HELP = ("Spec-Bench-format JSONL, one question a line (Spec-Bench's data/spec_bench/question.jsonl "
                "for the reported figures)")


def is_spec_bench(path) -> bool:
    """Whether ``path`` is Spec-Bench's question file (in a folder named ``spec_bench``), the file the
    evaluation and calibration splits are defined on."""
    return Path(path).expanduser().parent.name == "spec_bench"


def calibration_overlap(prompts, offset: int, limit: int, no_group: bool) -> str | None:
    """A warning when the prompts picked include those the shipped priors were learnt on (read from
    the ``"calibration"`` record ``python -m tr_core.bench.calibrate --write`` left in the presets)."""
    from ..trees import preset_data

    if not is_spec_bench(prompts):
        return None
    try:
        record = preset_data("paper-80").get("calibration") or {}
        lo, n = int(record["offset"]), int(record["limit"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if no_group or (offset < lo + n and lo < offset + limit):
        return (f"these prompts include questions {lo + 1}-{lo + n} of a category (or, with --no-group, may), "
                "which the shipped priors and presets were learnt on (python -m tr_core.bench.calibrate): "
                "figures from them are optimistic; --split eval reports the others.")
    return None
