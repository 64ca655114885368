"""Every decoder on the families users bring: token-identical to ``generate(do_sample=False)`` in
float32, with prompts longer than the sliding window; architectures a tree step cannot serve are
refused before any weights load."""
import pytest
import torch

from tr_core import GreedyDecoder, ModelLoadError, PromptLookupDecoder, TokenRecyclingDecoder, load_model
from tr_core.decoders import ProgressiveTreeDecoder
from tr_core.layout import AttentionLayout
from tr_core.progressive import PTDConfig

from .conftest import make_tiny_tokenizer, reference_greedy
from .families import WINDOW, family_configs, make_family_model

PROMPT_TOKENS, NEW_TOKENS = 3 * WINDOW, 3 * WINDOW
DECODERS = {
    "greedy": lambda lm: GreedyDecoder(lm, NEW_TOKENS),
    "tr": lambda lm: TokenRecyclingDecoder(lm, tree="auto", max_new_tokens=NEW_TOKENS),
    "tr:paper-80": lambda lm: TokenRecyclingDecoder(lm, tree="paper-80", lookup=0, max_new_tokens=NEW_TOKENS),
    "tr:tr-16": lambda lm: TokenRecyclingDecoder(lm, tree="tr-16", lookup=10, max_new_tokens=NEW_TOKENS),
    "ptd": lambda lm: ProgressiveTreeDecoder(lm, NEW_TOKENS),
    "ptd:paper": lambda lm: ProgressiveTreeDecoder(lm, NEW_TOKENS, config=PTDConfig.paper()),
    "pld": lambda lm: PromptLookupDecoder(lm, NEW_TOKENS),
}


def saved_family(name, root):
    """A family's tiny model saved as a Hugging Face folder and loaded the way users load theirs."""
    folder = root / name
    make_family_model(name).save_pretrained(folder)
    make_tiny_tokenizer().save_pretrained(folder)
    return load_model(str(folder), device="cpu")


@pytest.fixture(scope="module")
def family_lms(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {name: saved_family(name, root) for name in family_configs()}


def prompts():
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(2, 96, (PROMPT_TOKENS,), generator=gen).tolist() for _ in range(2)]


@pytest.mark.parametrize("family", list(family_configs()))
def test_every_decoder_is_greedy_on_every_family(family_lms, family):
    lm = family_lms[family]
    for ids in prompts():
        reference = reference_greedy(lm, ids, NEW_TOKENS)
        assert len(ids) > 2 * WINDOW  # the window bites from the prefill on
        for method, make in DECODERS.items():
            dec = make(lm)
            assert dec.generate(ids) == reference, f"{family}: {method} differs from greedy"
            if method in ("tr:paper-80", "tr:tr-16", "ptd:paper"):  # these draft whatever the costs
                assert any(s.accepted_drafts for s in dec.steps), f"{family}: {method} never accepted a draft"


def test_layouts_read_from_the_configs(family_lms):
    assert family_lms["llama"].layout.windows == {"full_attention": None}
    assert family_lms["mistral"].layout.windows == {"sliding_attention": WINDOW}
    assert family_lms["gemma2"].layout.windows == {"sliding_attention": WINDOW, "full_attention": None}
    assert family_lms["gemma3"].layout.describe() == f"sliding window {WINDOW} + full attention"
    assert family_lms["gemma2"].model.config._attn_implementation == "eager"  # soft-capped logits
    assert family_lms["gemma3"].model.config._attn_implementation == "sdpa_shared_kv"


@pytest.mark.parametrize("family", ["mistral", "gemma2"])
def test_the_window_bites(family_lms, family):
    """Masks without the window change the output: the tests above do exercise the window."""
    lm = family_lms[family]
    ids = prompts()[0]
    reference = reference_greedy(lm, ids, NEW_TOKENS)
    windowless = AttentionLayout({t: None for t in lm.layout.windows})
    saved, lm.layout = lm.layout, windowless
    try:
        out = TokenRecyclingDecoder(lm, tree="paper-80", lookup=0, max_new_tokens=NEW_TOKENS).generate(ids)
    finally:
        lm.layout = saved
    assert out != reference


def test_sliding_mask_matches_the_window():
    from tr_core.trees import TreeShape

    tree = TreeShape.from_paths([[0], [1], [0, 0]]).tensors()  # slots 10: root, 11: [0], 12: [1], 13: [0, 0]
    assert tree.position_ids(10).tolist() == [[10, 11, 11, 12]]
    mask = tree.attention_mask(past=10, window=4)[0, 0] == 0  # [4, 14]
    # the root at position 10 sees positions 7..10: cache slots 7, 8, 9 and itself
    assert mask[0].nonzero().squeeze(1).tolist() == [7, 8, 9, 10]
    # [1] at position 11 sees 8..11: slots 8, 9, the root and itself
    assert mask[2].nonzero().squeeze(1).tolist() == [8, 9, 10, 12]
    # [0, 0] at position 12 sees 9..12: slot 9, the root, [0] and itself, not its uncle [1]
    assert mask[3].nonzero().squeeze(1).tolist() == [9, 10, 11, 13]


@pytest.mark.parametrize("config_name, layer", [("Qwen3NextConfig", "linear_attention"),
                                                ("MambaConfig", "linear_attention"),
                                                ("JambaConfig", "linear_attention"),
                                                ("Llama4TextConfig", "chunked_attention")])
def test_unprunable_architectures_are_refused_before_loading_weights(tmp_path, config_name, layer):
    import transformers

    getattr(transformers, config_name)().save_pretrained(tmp_path)  # a config and no weights at all
    with pytest.raises(ModelLoadError, match=f"{layer} layers.*cannot prune.*use a transformer family"):
        load_model(str(tmp_path), device="cpu")


def test_generation_config_of_the_model_cannot_change_the_reference(tiny_lm):
    """A repetition penalty and a banned n-gram size in generation_config.json leave greedy alone."""
    from tr_core.bench.peers import HFPromptLookup

    ids = prompts()[0][:20]
    plain = GreedyDecoder(tiny_lm, 30).generate(ids)
    own = tiny_lm.model.generation_config
    saved = own.repetition_penalty, own.no_repeat_ngram_size
    own.repetition_penalty, own.no_repeat_ngram_size = 1.5, 2
    try:
        assert reference_greedy(tiny_lm, ids, 30) == plain
        assert HFPromptLookup(tiny_lm, 30).generate(ids) == plain
        x = torch.tensor([ids])  # the penalty is really there for a plain generate() call
        assert tiny_lm.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=30,
                                      pad_token_id=0)[0, 20:].tolist() != plain
    finally:
        own.repetition_penalty, own.no_repeat_ngram_size = saved
