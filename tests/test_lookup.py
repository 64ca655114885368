import torch

from tr_core.lookup import graft_point, lookup_continuation, lookup_with_ngram


def test_longest_ngram_first_and_earliest_match():
    ctx = torch.tensor([1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 2, 3])
    # the 3-gram [5, 2, 3] never occurred before; the 2-gram [2, 3] first occurs at 1 -> continue with 9, 9, ...
    assert lookup_continuation(ctx, max_draft=4) == [9, 9, 1, 2]
    ctx = torch.tensor([4, 1, 2, 3, 6, 6, 1, 2, 3])
    assert lookup_continuation(ctx, max_draft=3) == [6, 6, 1]  # 3-gram [1, 2, 3] at 1


def test_no_match_gives_nothing():
    assert lookup_continuation(torch.tensor([1, 2, 3, 4]), max_draft=5) == []
    assert lookup_continuation(torch.tensor([7]), max_draft=5) == []
    assert lookup_continuation(torch.tensor([5, 6, 5]), max_draft=5, min_ngram=2) == []


def test_continuation_stops_at_the_end_of_context():
    assert lookup_continuation(torch.tensor([5, 6, 5]), max_draft=5) == [6, 5]


def test_graft_point_skips_what_the_tree_already_holds():
    # tree: 0 -> 1(tok 10) -> 3(tok 12); 0 -> 2(tok 11)
    tokens = [99, 10, 11, 12]
    children = [[1, 2], [3], [], []]
    assert graft_point(tokens, children, [10, 12, 13, 14]) == (3, [13, 14])
    assert graft_point(tokens, children, [11, 5]) == (2, [5])
    assert graft_point(tokens, children, [7, 8]) == (0, [7, 8])
    assert graft_point(tokens, children, [10, 12]) == (3, [])


def test_suffix_retrieval_finds_the_longest_match_anywhere_in_the_context():
    from tr_core.lookup import lookup_longest, match_bucket

    # "1 2 3" occurs twice before the end; the later one is preceded by "9 1 2 3" as the end is
    ctx = torch.tensor([5, 1, 2, 3, 4, 4, 9, 1, 2, 3, 7, 8, 6, 9, 1, 2, 3])
    assert lookup_longest(ctx, 3) == ([7, 8, 6], 4)
    assert lookup_with_ngram(ctx, 3)[0] == [4, 4, 9]  # the 3-gram lookup takes the first "1 2 3"
    assert lookup_longest(torch.tensor([1, 2, 3]), 4) == ([], 0)  # the last token occurs nowhere before
    assert lookup_longest(torch.tensor([7]), 4) == ([], 0)
    tie = torch.tensor([1, 2, 8, 1, 2, 9, 1, 2])
    assert lookup_longest(tie, 1) == ([9], 2)  # equally long matches: the most recent
    assert lookup_longest(torch.tensor([4] * 50), 2, max_match=8)[1] == 8  # the match length is capped
    assert [match_bucket(n) for n in (0, 1, 3, 5, 8, 15, 16, 40)] == [0, 1, 3, 4, 8, 8, 16, 16]


def test_suffix_retrieval_runs_on_round_a_loop_past_the_end_of_the_context():
    from tr_core.lookup import lookup_longest

    chain, match = lookup_longest(torch.tensor([1, 2, 3, 4] * 10), 12)
    assert chain == [1, 2, 3, 4] * 3 and match == 32  # a loop of period 4: the copy goes on repeating it


def test_a_retrieved_copy_stops_before_the_chat_template_and_keeps_an_end_of_turn():
    from tr_core.lookup import until_control

    control, eos = frozenset({1, 2, 9}), (2,)  # 1: <|im_start|>, 2: <|im_end|> (an end of turn), 9: another
    assert until_control([5, 6, 1, 7, 8], control, eos) == [5, 6]  # never into the template's next turn
    assert until_control([5, 6, 2, 1, 7], control, eos) == [5, 6, 2]  # up to the end of a turn
    assert until_control([9, 5], control, eos) == []
    assert until_control([5, 6, 7], control, eos) == [5, 6, 7]


def test_no_draft_copies_the_chat_template_on_the_embedded_model(embedded_lm, monkeypatch):
    """The context holds the template (``<|im_start|>user`` …); a copy never drafts its control tokens."""
    from tr_core import TokenRecyclingDecoder
    from tr_core.decoders import recycling
    from tr_core.lookup import control_tokens

    control = control_tokens(embedded_lm.tokenizer) - set(embedded_lm.eos_token_ids)
    assert {"<|im_start|>"} <= {embedded_lm.token_text(t) for t in control}
    cuts, original = [], recycling.until_control
    def recorded(chain, *args):
        out = original(chain, *args)
        cuts.append(len(out) < len(chain))
        return out
    monkeypatch.setattr(recycling, "until_control", recorded)
    ids = embedded_lm.encode_prompt("Say hello.")  # short: the reply soon comes back to the template's words
    dec = TokenRecyclingDecoder(embedded_lm, max_new_tokens=24)
    dec.start(ids)
    looked = []
    while not dec.done:
        step = dec.step()
        looked += [t for t, src in zip(step.tree.tokens, step.tree.sources) if src == "lookup"]
    assert any(cuts), "no copy ran into the template: this prompt proves nothing"
    assert looked and not set(looked) & control
