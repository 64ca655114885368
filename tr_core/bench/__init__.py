"""The benchmark harness: ``python -m tr_core.bench``.  Methods are timed interleaved, prompt by
prompt, after a warm-up, in one process; every output is checked against greedy."""
from .data import BenchPrompt, load_prompts
from .harness import MethodSpec, parse_methods, run_benchmark
from .report import format_table, summarize

__all__ = ["BenchPrompt", "MethodSpec", "format_table", "load_prompts", "parse_methods", "run_benchmark",
           "summarize"]
