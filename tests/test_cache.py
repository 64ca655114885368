import torch
from transformers import DynamicCache

from tr_core.cache import keep_accepted_kv
from tr_core.trees import TreeShape


def run(model, ids, cache, positions=None, mask=None):
    with torch.inference_mode():
        return model(input_ids=ids[None], position_ids=positions, attention_mask=mask, cache=cache,
                     use_cache=True).logits[0]


def test_pruned_cache_equals_fresh_forward_of_accepted_sequence(tiny_lm):
    model = tiny_lm.model
    prefix = torch.tensor([5, 9, 14, 3, 22])
    tree = TreeShape.from_paths([[0], [1], [0, 0], [0, 1], [1, 0], [0, 1, 0]]).tensors()
    nodes = torch.tensor([40, 41, 42, 43, 44, 45, 46])  # root + 6 drafts
    for path in ([0, 1, 4, 6], [0, 2, 5], [0], [0, 1, 3]):
        cache = DynamicCache(config=model.config)
        run(model, prefix, cache)
        run(model, nodes, cache, tree.position_ids(len(prefix)), tree.attention_mask(len(prefix)))
        keep_accepted_kv(cache, len(prefix), path)
        assert cache.get_seq_length() == len(prefix) + len(path)
        nxt = torch.tensor([77])
        got = run(model, nxt, cache)[-1]

        fresh = DynamicCache(config=model.config)
        seq = torch.cat([prefix, nodes[path], nxt])
        want = run(model, seq, fresh)[-1]
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_growing_cache_gives_the_dynamic_caches_logits_bit_for_bit(tiny_lm, monkeypatch):
    """Tree steps and prunes on the in-place cache and on transformers' DynamicCache: the same logits,
    bit for bit, across many growths of its buffers (grown 3 tokens at a time here), and entries
    written in place of pruned ones."""
    import tr_core.cache as kv

    monkeypatch.setattr(kv, "GROW_TOKENS", 3)
    model = tiny_lm.model
    tree = TreeShape.from_paths([[0], [1], [0, 0], [0, 1], [1, 0], [0, 1, 0]]).tensors()
    growing, dynamic = kv.new_cache(), DynamicCache(config=model.config)
    prefix = torch.tensor([5, 9, 14, 3, 22])
    torch.testing.assert_close(run(model, prefix, growing), run(model, prefix, dynamic), rtol=0, atol=0)
    length = len(prefix)
    for step, path in enumerate(([0, 1, 4, 6], [0], [0, 2, 5], [0, 1, 3], [0], [0, 1, 4, 6]) * 3):
        nodes = torch.arange(7) + 30 + step
        positions, mask = tree.position_ids(length), tree.attention_mask(length)
        got, want = run(model, nodes, growing, positions, mask), run(model, nodes, dynamic, positions, mask)
        assert torch.equal(got, want), f"step {step}"
        for cache in (growing, dynamic):
            keep_accepted_kv(cache, length, path)
        length += len(path)
        assert growing.get_seq_length() == dynamic.get_seq_length() == length
    assert growing.layers[0].key_buffer.shape[-2] < length + max(3, length // 4) + 8  # spare room bounded
