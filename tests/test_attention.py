"""The shared-KV SDPA attention gives transformers' SDPA results for tree masks, without repeat_kv."""
import torch

from tests.conftest import make_tiny_model, make_tiny_tokenizer
from tr_core import wrap_model
from tr_core.attention import ATTENTION, register, sdpa_shared_kv
from tr_core.trees import load_tree


class _Grouped(torch.nn.Module):
    """An attention module's attributes as transformers' SDPA function reads them: 2 query heads a KV head."""

    num_key_value_groups = 2
    is_causal = True


def test_tree_forward_equals_transformers_sdpa_and_skips_the_kv_copy(monkeypatch):
    model = make_tiny_model()  # 4 query heads, 2 KV heads
    assert model.model.layers[0].self_attn.num_key_value_groups == 2
    tree = load_tree("tr-10").tensors("cpu", torch.float32)
    ids = torch.randint(2, 96, (1, 20), generator=torch.Generator().manual_seed(1))
    draft = torch.randint(2, 96, (1, tree.parents.shape[0]), generator=torch.Generator().manual_seed(2))

    def tree_logits():
        from transformers import DynamicCache

        cache = {wrap_model(model, make_tiny_tokenizer()).cache_arg: DynamicCache(config=model.config)}
        with torch.inference_mode():
            model(input_ids=ids, use_cache=True, **cache)
            return model(input_ids=draft, position_ids=tree.position_ids(20), attention_mask=tree.attention_mask(20),
                         use_cache=True, **cache).logits

    reference = tree_logits()  # transformers' sdpa: repeat_kv, then the kernel
    model.set_attn_implementation(register())
    assert model.config._attn_implementation == ATTENTION
    import transformers.integrations.sdpa_attention as sdpa

    copies = []
    monkeypatch.setattr(sdpa, "repeat_kv", lambda x, n: copies.append(n) or x.repeat_interleave(n, 1))
    ours = tree_logits()
    assert copies == [] and torch.equal(ours, reference)


def test_other_cases_go_to_transformers_own_function():
    q, kv = torch.randn(1, 4, 3, 8), torch.randn(1, 2, 5, 8)
    causal = torch.ones(3, 5, dtype=torch.bool).tril(2)[None, None]
    out, _ = sdpa_shared_kv(_Grouped(), q, kv, kv, causal)
    expected = torch.nn.functional.scaled_dot_product_attention(q, kv.repeat_interleave(2, 1), kv.repeat_interleave(2, 1),
                                                                attn_mask=causal).transpose(1, 2)
    assert torch.allclose(out, expected, atol=1e-6)
    unmasked, _ = sdpa_shared_kv(_Grouped(), q, kv, kv, None)  # no mask: transformers' path (causal)
    assert unmasked.shape == (1, 3, 4, 8)


def test_folded_query_groups_give_the_kv_copy_s_result_without_the_copy(monkeypatch):
    """The CUDA way (query heads of a group folded into the query length) checked on the CPU: the same
    logits as transformers' repeat_kv path, for a tree mask, and no copy of the cache."""
    import transformers.integrations.sdpa_attention as sdpa

    import tr_core.attention as attention
    from tr_core.attention import folded_attention

    q, kv = torch.randn(2, 6, 5, 8), torch.randn(2, 3, 9, 8)
    mask = torch.rand(1, 1, 5, 9) > 0.3
    mask[..., 0] = True
    want = torch.nn.functional.scaled_dot_product_attention(q, kv.repeat_interleave(2, 1), kv.repeat_interleave(2, 1),
                                                            attn_mask=mask).transpose(1, 2)
    assert torch.allclose(folded_attention(q, kv, kv, mask), want, atol=1e-6)

    model = make_tiny_model()
    tree = load_tree("tr-10").tensors("cpu", torch.float32)
    ids = torch.randint(2, 96, (1, 20), generator=torch.Generator().manual_seed(1))
    draft = torch.randint(2, 96, (1, tree.parents.shape[0]), generator=torch.Generator().manual_seed(2))

    def logits(way):
        from transformers import DynamicCache

        monkeypatch.setitem(attention.MASKED_GQA, "cpu", way)
        cache = {wrap_model(model, make_tiny_tokenizer()).cache_arg: DynamicCache(config=model.config)}
        with torch.inference_mode():
            model(input_ids=ids, use_cache=True, **cache)
            return model(input_ids=draft, position_ids=tree.position_ids(20), attention_mask=tree.attention_mask(20),
                         use_cache=True, **cache).logits

    model.set_attn_implementation(register())
    reference = logits("repeat_kv")
    copies = []
    monkeypatch.setattr(sdpa, "repeat_kv", lambda x, n: copies.append(n) or x.repeat_interleave(n, 1))
    folded = logits("fold")
    assert copies == [] and torch.allclose(folded, reference, atol=1e-5)


def test_a_one_token_step_without_a_mask_is_transformers_own_call():
    """The project makes that call itself (so that a packed forward lays outputs out once): bit for bit."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    q, kv = torch.randn(1, 4, 1, 8), torch.randn(1, 2, 7, 8)
    ours, _ = sdpa_shared_kv(_Grouped(), q, kv, kv, None)
    theirs, _ = sdpa_attention_forward(_Grouped(), q, kv, kv, None)
    assert ours.shape == (1, 1, 4, 8) and torch.equal(ours, theirs)


def test_packed_segments_each_get_their_own_attention_bit_for_bit():
    """Segments of every kind in one packed call (a masked tree, a one-token step without a mask, a
    prompt's unmasked queries): each equals its own call alone, exactly."""
    from types import SimpleNamespace

    from tr_core.attention import packed_attention
    from tr_core.batching import Segment

    gen = torch.Generator().manual_seed(3)
    sizes = [(3, 9), (1, 6), (4, 4)]  # (queries, keys) of each request
    query = torch.randn(1, 4, sum(q for q, _ in sizes), 8, generator=gen)
    parts = [(torch.randn(1, 2, k, 8, generator=gen), torch.randn(1, 2, k, 8, generator=gen)) for _, k in sizes]
    mask = torch.zeros(1, 1, query.shape[2], sum(k for _, k in sizes), dtype=torch.bool)
    tree = torch.rand(3, 9, generator=gen) > 0.4
    tree[:, 0] = True
    mask[0, 0, 0:3, 0:9] = tree
    segments = [Segment(0, 3, 0, 9, True), Segment(3, 4, 9, 15, False), Segment(4, 8, 15, 19, False)]
    packed = SimpleNamespace(parts=parts, layer=0)
    out = packed_attention(_Grouped(), query, mask, segments, packed)  # [1, Q, heads, d]
    for s, (keys, values) in zip(segments, parts):
        own = mask[:, :, s.q0:s.q1, s.k0:s.k1] if s.masked else None
        alone, _ = sdpa_shared_kv(_Grouped(), query[:, :, s.q0:s.q1], keys, values, own)
        assert torch.equal(out[:, s.q0:s.q1], alone)
