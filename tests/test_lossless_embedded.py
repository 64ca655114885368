"""The methods' promise on real weights: TR and PTD output ids == model.generate(do_sample=False)."""
import pytest

from tr_core import AdjacencyMatrix, TokenRecyclingDecoder

from .conftest import reference_greedy

PROMPTS = [
    "Write a short poem about the sea.",  # creative
    "Translate to French: The cat sleeps on the warm windowsill.",  # translation
    "Summarize: Token Recycling stores candidate tokens from past forward passes in a matrix "
    "and reuses them as drafts, so decoding needs fewer forward passes without changing the output.",  # summary
    "What is 17 times 23? Explain step by step.",  # math
    "Write a Python function that returns the n-th Fibonacci number.",  # code
    "Who wrote Pride and Prejudice, and when was it published?",  # qa
]
NEW_TOKENS = 64


@pytest.fixture(scope="module")
def references(embedded_lm):
    return {p: reference_greedy(embedded_lm, embedded_lm.encode_prompt(p), NEW_TOKENS) for p in PROMPTS}


def test_embedded_model_facts(embedded_lm):
    assert embedded_lm.vocab_size == 49152
    assert embedded_lm.eos_token_ids == (2,)
    assert str(embedded_lm.dtype) == "torch.float32"


@pytest.mark.parametrize("tree, min_accepted", [("paper-80", 0.3), ("default", 0.1)])
def test_token_recycling_is_lossless(embedded_lm, references, tree, min_accepted):
    """The paper's tree, and the CPU default (cost-aware tree + prompt lookup, which drafts less)."""
    matrix = AdjacencyMatrix(embedded_lm.vocab_size, 8, embedded_lm.device, embedded_lm.fingerprint)
    accepted = steps = 0
    for prompt in PROMPTS:  # hot start: one matrix across prompts
        dec = TokenRecyclingDecoder(embedded_lm, tree=tree, matrix=matrix, max_new_tokens=NEW_TOKENS,
                                    trace_rows=False)
        out = dec.generate(embedded_lm.encode_prompt(prompt))
        assert out == references[prompt], f"mismatch on {prompt!r} with tree {tree}"
        accepted += sum(s.accepted_drafts for s in dec.steps)
        steps += len(dec.steps)
    assert accepted / steps > min_accepted, "drafts are hardly ever accepted: the matrix is not learning"


def test_progressive_tree_drafting_is_lossless(embedded_lm, references):
    """PTD with the paper's settings (the most drafting): candidates verified with the draft tree riding along."""
    from tr_core.decoders import ProgressiveTreeDecoder
    from tr_core.progressive import PTDConfig

    candidates = 0
    for prompt in PROMPTS:
        dec = ProgressiveTreeDecoder(embedded_lm, NEW_TOKENS, config=PTDConfig.paper())
        assert dec.generate(embedded_lm.encode_prompt(prompt)) == references[prompt], f"mismatch on {prompt!r}"
        candidates += sum(s.tree.size for s in dec.steps)
    assert candidates > 0, "the tries never offered a candidate: the harvest is not working"
