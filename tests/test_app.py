"""The app: the session logic called directly, the launched app through gradio_client, the panels."""
from __future__ import annotations

import pytest
import torch

from components.model_hub import ModelHub
from components.session import Session, Settings, UserError
from tr_core import AdjacencyMatrix
from tr_core.models import EMBEDDED_LABEL

from .conftest import free_port, local_client

PROMPT = "List three colours of the rainbow."


def settings(**kw) -> Settings:
    base = dict(model=EMBEDDED_LABEL, tree="paper-80", k=8, max_new_tokens=24, hot_start=True)
    base.update(kw)
    return Settings(**base)


def test_steps_render_every_panel(hub):
    sess = Session()
    for _ in range(3):
        sess.step(hub, PROMPT, settings(), cap=256)
    tree_fig, draft_fig, heat_fig, text, counters, charts, phases, acc_map, alt = sess.views()
    nodes = [t for t in tree_fig.data if (t.mode == "markers+text" or t.name == "model's own")
             and t.name != "left out"]  # not the ∅ leaves
    step = sess.live.race.decoder.steps[-1]
    assert step.tree.size + step.blank_drafts >= 80  # the paper tree (blank drafts left out), plus any lookup
    assert sum(len(t.x) for t in nodes) == step.tree.size + 2  # + the root and the bonus token
    assert heat_fig.data and len(heat_fig.data[0].z) > 0
    assert "speedup" in counters and "identical to greedy" in counters
    assert text.count('title="step ') == len(sess.live.race.decoder.output)
    assert "recycle" in phases and "accept" in phases
    assert len(charts.data[1].y) == 3  # speedup after each of the three steps
    figs = sess.live.race.figures()
    assert figs["tr"]["forwards"] == 3 and figs["greedy"]["tokens"] >= figs["tr"]["tokens"]


def test_ptd_session_draws_both_trees(hub):
    sess = Session()
    for _ in range(3):
        sess.step(hub, PROMPT, settings(method="ptd"), cap=256)
    tree_fig, draft_fig, heat_fig, text, counters, charts, phases, _, _ = sess.views()
    step = sess.live.race.decoder.steps[-1]
    assert step.method == "ptd" and step.draft_tree is not None
    drawn = [t for t in draft_fig.data if t.mode == "markers+text"]
    assert sum(len(t.x) for t in drawn) == len(step.draft_tree.tokens)
    assert "new" in step.draft_tree.sources and "expand" in phases
    from components.session import PAGE_MIN_DRAFT  # the page keeps a draft tree to watch, paying or not
    assert all(s.forward_tokens - 1 - s.tree.size > 0 for s in sess.live.race.decoder.steps)
    assert sess.live.race.decoder.config.max_nodes >= PAGE_MIN_DRAFT
    assert "PTD keeps no matrix" in str(heat_fig.layout.annotations[0].text)
    assert "Progressive Tree Drafting" in counters and "identical to greedy" in counters
    while not sess.live.race.done:
        sess.advance()
    assert sess.live.race.figures()["identical"]
    with pytest.raises(UserError, match="Unknown method"):
        Session().step(hub, PROMPT, settings(method="medusa"), cap=256)


def test_tree_layout_never_crosses_edges():
    from components.tree_plot import tree_layout

    # PTD's draft view: a branch added last at depth 1; rows whose node numbers iterate out of order as a set
    for parents, depths in (([-1, 0, 0, 0, 0, 1, 1, 2, 3, 0], [0, 1, 1, 1, 1, 2, 2, 2, 2, 1]),
                            ([-1, 0, 0, 2, 1, 1, 2, 0, 7, 3], [0, 1, 1, 2, 2, 2, 2, 1, 2, 3])):
        pos = tree_layout(parents, depths)
        assert all(pos[i][1] == -depths[i] for i in range(len(depths)))
        edges = [(pos[p][0], pos[i][0], depths[i]) for i, p in enumerate(parents) if p >= 0]
        for a_top, a_low, da in edges:
            for b_top, b_low, db in edges:
                if da == db:  # two edges between the same rows cross when their ends swap order
                    assert (a_top - b_top) * (a_low - b_low) >= 0, (parents, pos)


def test_sampling_session_races_plain_sampling(hub):
    sess = Session()
    for _ in range(2):
        sess.step(hub, PROMPT, settings(tree="tr-16", temperature=0.8, top_p=0.9, seed=3), cap=256)
    panels = sess.views()
    tree_fig, counters = panels.tree, panels.counters
    step = sess.live.race.decoder.steps[-1]
    assert step.sampled and sess.live.race.greedy.sampling == sess.live.race.decoder.sampling
    assert "Plain sampling" in counters and "same distribution" in counters
    assert any("sampled" in str(h) for t in tree_fig.data for h in (t.hovertext or []))
    first = list(sess.live.race.decoder.output)
    again = Session()
    for _ in range(2):
        again.step(hub, PROMPT, settings(tree="tr-16", temperature=0.8, top_p=0.9, seed=3), cap=256)
    assert again.live.race.decoder.output == first  # same seed and settings, same text
    with pytest.raises(UserError, match="top_p"):
        Session().step(hub, PROMPT, settings(temperature=0.8, top_p=0), cap=256)


def test_run_to_end_is_identical_to_greedy(hub):
    sess = Session()
    sess.step(hub, PROMPT, settings(tree="tr-16"), cap=256)
    while not sess.live.race.done:
        sess.live.race.step()
    figs = sess.live.race.figures()
    assert figs["identical"] and figs["tr"]["tokens"] == 24


def test_changed_prompt_or_settings_start_a_new_race(hub):
    sess = Session()
    sess.step(hub, PROMPT, settings(), cap=256)
    first = sess.live.race
    sess.step(hub, PROMPT, settings(), cap=256)
    assert sess.live.race is first
    sess.step(hub, PROMPT + "!", settings(), cap=256)
    assert sess.live.race is not first and len(sess.live.race.decoder.steps) == 1
    matrix = sess.matrix_state.matrix
    sess.step(hub, PROMPT, settings(tree="tr-8"), cap=256)
    assert sess.matrix_state.matrix is matrix and sess.live.race.decoder.tree.name == "tr-8"  # hot start kept the matrix


@pytest.mark.parametrize("prompt, kw, message", [
    ("", {}, "empty"),
    ("   ", {}, "empty"),
    ("x" * 30_000, {}, "limit"),
    (PROMPT, {"max_new_tokens": 0}, "between 1 and 256"),
    (PROMPT, {"max_new_tokens": 999}, "between 1 and 256"),
    (PROMPT, {"model": "no-such-org/no-such-model"}, "Could not load"),
    (PROMPT, {"max_new_tokens": -3}, "between 1 and 256"),
    (PROMPT, {"tree": "no-such-tree"}, "Unknown tree"),
    (PROMPT, {"tree": "[[0], [0]]"}, "uplicate"),
    (PROMPT, {"tree": "[[0, 1]]"}, "parent"),
    (PROMPT, {"tree": "[[0], [0, 0], [0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0], "
                      "[0, 0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0, 0, 0], "
                      "[0, 0, 0, 0, 0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], "
                      "[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], "
                      "[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], "
                      "[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], "
                      "[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]]"}, "deep"),
    (PROMPT, {"tree": "{not json"}, "not valid JSON"),
])
def test_bad_input_is_a_message(hub, prompt, kw, message):
    with pytest.raises(UserError, match=message):
        Session().step(hub, prompt, settings(**kw), cap=256)


def test_prompt_longer_than_context(embedded_lm):
    import dataclasses

    short = ModelHub(loaded={"embedded": dataclasses.replace(embedded_lm, max_context=64)})
    with pytest.raises(UserError, match="context of 64 tokens"):
        Session().step(short, "Tell me a long story about a dragon. " * 8, settings(), cap=256)


def test_matrix_save_load_and_foreign_file(hub, embedded_lm, tmp_path):
    sess = Session()
    sess.step(hub, PROMPT, settings(), cap=256)
    path = sess.save_matrix(str(tmp_path))
    saved = sess.matrix_state.matrix.table.clone()
    sess.matrix_state.matrix.reset()
    sess.load_matrix(hub, path, settings())
    assert (sess.matrix_state.matrix.table == saved).all()
    foreign = AdjacencyMatrix(100, 8, fingerprint="other")
    foreign.save(tmp_path / "foreign.safetensors")
    with pytest.raises(UserError, match="another vocabulary"):
        sess.load_matrix(hub, str(tmp_path / "foreign.safetensors"), settings())
    (tmp_path / "junk.safetensors").write_bytes(b"junk")
    with pytest.raises(UserError, match="corrupt"):
        sess.load_matrix(hub, str(tmp_path / "junk.safetensors"), settings())


def test_launched_app_through_gradio_client(launched):
    client = local_client(launched[1])
    args = (PROMPT, EMBEDDED_LABEL, "tr-16", 8, 16, True, True, "Token Recycling (TR)")
    first = client.predict(*args, api_name="/do_step")
    second = client.predict(*args, api_name="/do_step")
    counters_1, counters_2 = first[4], second[4]
    assert "speedup" in counters_1 and counters_1 != counters_2
    assert "identical to greedy" in counters_2
    bad = client.predict("", *args[1:], api_name="/do_step")
    assert "empty" in bad[-1]


def test_run_to_end_through_gradio_client(launched):
    client = local_client(launched[1])
    final = client.predict("Name a fruit.", EMBEDDED_LABEL, "auto", 8, 10, True, True, "Token Recycling (TR)",
                           api_name="/do_run")
    assert "Done" in final[-1]
    assert "identical to greedy" in final[4] and ">10<" in final[4]  # ten tokens on both sides
    ptd = client.predict("Name a fruit.", EMBEDDED_LABEL, "auto", 8, 10, True, True,
                         "Progressive Tree Drafting (PTD)", api_name="/do_run")
    assert "Done" in ptd[-1] and "Progressive Tree Drafting" in ptd[4] and "identical to greedy" in ptd[4]


def test_server_hot_start_file(hub, tmp_path):
    shared = tmp_path / "shared.safetensors"
    first = Session.starting_from(start_file=str(shared))
    first.step(hub, PROMPT, settings(tree="tr-16"), cap=256)  # no file yet: zeros
    first.save_matrix(folder=str(tmp_path))  # writes the shared file too, atomically
    assert shared.is_file() and not list(tmp_path.glob("*.tmp*"))
    second = Session.starting_from(start_file=str(shared))
    second.step(hub, PROMPT, settings(tree="tr-16"), cap=256)
    assert "hot start from the server's file" in second.message
    assert second.matrix_state.matrix is not first.matrix_state.matrix  # its own copy: what it learns stays in the session
    shared.write_bytes(shared.read_bytes()[:100])  # truncated, as after a crash of something else
    third = Session.starting_from(start_file=str(shared))
    third.step(hub, PROMPT, settings(tree="tr-16"), cap=256)
    assert "was not used" in third.message and int(third.matrix_state.matrix.table.count_nonzero()) > 0


def test_model_that_fails_to_load_is_a_message(hub, tmp_path):
    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text("{ this is not json")
    with pytest.raises(UserError, match="Could not load"):
        Session().step(hub, PROMPT, settings(model=str(broken)), cap=256)


class _OutOfMemoryModel(torch.nn.Module):
    """Stands in for a model whose forward exhausts the device's memory."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.config = inner, inner.config

    def forward(self, *args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    def get_decoder(self):  # the body without the output head runs out of memory the same way
        return self

    def get_output_embeddings(self):
        return self.inner.get_output_embeddings()


def test_out_of_memory_is_a_message_and_the_session_is_reset(embedded_lm):
    import dataclasses

    from app import build_app, serve

    lm = dataclasses.replace(embedded_lm, model=_OutOfMemoryModel(embedded_lm.model))
    demo = build_app(ModelHub(loaded={"embedded": lm}))
    port = free_port()
    serve(demo, "127.0.0.1", port, prevent_thread_lock=True, quiet=True)
    try:
        out = local_client(f"http://127.0.0.1:{port}/").predict(
            PROMPT, EMBEDDED_LABEL, "tr-16", 8, 16, True, True, "Token Recycling (TR)", api_name="/do_step")
        assert "ran out of memory" in out[-1] and "reset" in out[-1]
        assert "Counters appear after the first step" in out[4]  # the session was reset
    finally:
        demo.close()


def test_busy_server_queues_with_positions_and_refuses_beyond_the_queue_size(hub):
    """Steps share a concurrency group of ``batch_tabs`` tabs: past it (here 1, while one visitor runs
    to the end) the next waits with its place in the queue (Gradio shows "queue: N/M" on the waiting
    panels); past the queue's size a visitor is told the queue is full instead of waiting forever."""
    import time
    from gradio_client.utils import QueueError, Status

    from app import build_app, serve

    demo = build_app(hub, batch_tabs=1)
    port = free_port()
    serve(demo, "127.0.0.1", port, queue_size=2, prevent_thread_lock=True, quiet=True)
    url = f"http://127.0.0.1:{port}/"
    args = (PROMPT, EMBEDDED_LABEL, "tr-16", 8, 16, True, True, "Token Recycling (TR)")
    try:
        clients = [local_client(url) for _ in range(4)]
        running = clients[0].submit(*args[:4], 160, *args[5:], api_name="/do_run")
        deadline = time.time() + 60
        while running.status().code != Status.PROCESSING and time.time() < deadline:
            time.sleep(0.05)
        waiting = [c.submit(*args, api_name="/do_step") for c in clients[1:3]]
        deadline = time.time() + 30
        while time.time() < deadline and any(w.status().code != Status.IN_QUEUE for w in waiting):
            time.sleep(0.05)
        ranks = sorted(w.status().rank for w in waiting)
        assert ranks == [0, 1], [w.status() for w in waiting]  # positions 1 and 2 behind the run
        with pytest.raises(QueueError, match="Queue is full"):
            clients[3].predict(*args, api_name="/do_step")
        assert not running.done()  # all of this happened while the run held the model
        for w in waiting:
            assert "speedup" in w.result(timeout=300)[4]  # the queued visitors are served in turn
        assert "identical to greedy" in running.result(timeout=300)[4]
    finally:
        demo.close()


def test_settings_come_from_the_pages_fields_by_name():
    from components.session import SETTINGS_FIELDS
    from tr_core.decoders.recycling import DEFAULT_LOOKUP

    s = Settings.from_inputs(dict(model="m", tree="tr-16", k=4, max_new_tokens=12, hot_start=True, lookup=True,
                                  method="Progressive Tree Drafting (PTD)", temperature=0.5, seed=3, start="cold"))
    assert s == Settings("m", "tr-16", 4, 12, True, DEFAULT_LOOKUP, "ptd", 0.5, 1.0, 3, "cold")
    assert Settings.from_inputs({}) == Settings.from_inputs(dict.fromkeys(SETTINGS_FIELDS))  # not given: empty
    with pytest.raises(TypeError, match="max_new"):
        Settings.from_inputs({"max_new": 12})  # a name the settings do not have is refused, not dropped


def test_the_api_names_its_parameters_in_the_pages_order():
    from app import build_app
    from components.session import SETTINGS_FIELDS

    endpoints = build_app(ModelHub()).get_api_info()["named_endpoints"]
    for name in ("/do_step", "/do_run"):
        assert [p["parameter_name"] for p in endpoints[name]["parameters"]] == ["prompt", *SETTINGS_FIELDS, "teach"]


def test_a_session_keeps_its_planner_across_runs_like_its_matrix(tiny_lm):
    import dataclasses

    from components.session import Session

    s = Session()
    first = s.matrix_state.planner_for(tiny_lm, 8, hot_start=True)
    first.stats.record(first.universe, [first.universe.paths[0]])  # something learnt
    assert s.matrix_state.planner_for(tiny_lm, 8, hot_start=True) is first and first.stats.trials  # hot start: kept
    assert s.matrix_state.planner_for(tiny_lm, 8, hot_start=False) is first and not first.stats.trials  # cold: forgotten
    other = dataclasses.replace(tiny_lm)  # another model loaded: a planner of its own
    assert s.matrix_state.planner_for(other, 8, hot_start=True) is not first


def test_where_the_matrix_came_from_is_data_and_its_note_is_derived(tiny_lm):
    from components.session import MatrixOrigin, MatrixState, Origin

    ms = MatrixState()  # no file fits the tiny model: zeros
    ms.for_race(tiny_lm, 8, hot_start=True)
    assert ms.origin == MatrixOrigin(Origin.EMPTY) and ms.origin.note() == "an empty matrix (none is shipped for this model)"
    ms.for_race(tiny_lm, 8, hot_start=True)
    assert ms.origin == MatrixOrigin(Origin.EMPTY, carried=True)
    assert ms.origin.note().endswith(", then this tab's earlier prompts")
    ms.for_race(tiny_lm, 8, hot_start=True)  # carried over again: said once
    assert ms.origin.note().count("earlier prompts") == 1
    ms.for_race(tiny_lm, 8, hot_start=True, cold=True)  # a hot start's matrix never carries into a cold start
    assert ms.origin == MatrixOrigin(Origin.COLD) and ms.cold
    ms.for_race(tiny_lm, 8, hot_start=True, cold=True)
    assert ms.origin.note() == "cold start, then this tab's earlier prompts"
    ms.empty()
    assert ms.origin.kind is Origin.EMPTIED and ms.matrix.writes == 0
    shipped = MatrixOrigin(Origin.SHIPPED, carried=True, detail="warmed on 40 calibration prompts")
    assert shipped.note() == "hot start: a matrix warmed on 40 calibration prompts, then this tab's earlier prompts"


def test_a_page_or_client_load_copies_no_weights(launched, monkeypatch):
    """Gradio copies the app's config for every page and client that connects: nothing in it may lead
    to the model (a bound method of the handlers would: a copy of the weights per visitor)."""
    from gradio import utils

    copied = []
    for cls in (torch.Tensor, torch.nn.Parameter):
        original = cls.__deepcopy__
        monkeypatch.setattr(cls, "__deepcopy__", lambda self, memo, _o=original: copied.append(1) or _o(self, memo))
    utils.safe_deepcopy(launched[0].config)
    assert not copied, f"{len(copied)} tensors copied with the app's config"


def test_choosing_ptd_hides_the_matrix_and_its_buttons_and_tr_shows_them_again():
    """PTD keeps no matrix: the Method box hides TR's settings and the matrix buttons for it."""
    import gradio as gr
    from app import build_app

    demo = build_app(ModelHub())
    blocks = demo.blocks.values()
    method = next(b for b in blocks if isinstance(b, gr.Dropdown) and b.label == "Method")
    buttons = {b._id for b in blocks if getattr(b, "value", None) in ("Reset matrix", "Save matrix")} | \
              {b._id for b in blocks if isinstance(b, gr.UploadButton) and b.label == "Load matrix"}
    assert len(buttons) == 3
    change = next(f for f in demo.fns.values() if (method._id, "change") in f.targets)
    outputs = [b._id for b in change.outputs]
    assert buttons <= set(outputs)
    for label, shown in (("Progressive Tree Drafting (PTD)", False), ("Token Recycling (TR)", True)):
        updates = dict(zip(outputs, change.fn(label)))
        assert all(updates[b]["visible"] is shown for b in buttons), label
