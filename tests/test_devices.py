"""Device decisions (tr_core.devices), without a GPU and without assuming anything of this CPU."""
from __future__ import annotations

import pytest
import torch

from tr_core import devices

from .conftest import make_tiny_model


def test_devices_are_compared_normalised_not_as_strings():
    assert devices.normalise_device("cuda") == torch.device("cuda", 0)  # no CUDA here: index 0
    assert devices.same_device("cuda", torch.device("cuda:0")) and devices.same_device("cpu", torch.device("cpu"))
    assert not devices.same_device("cuda:1", "cuda:0") and not devices.same_device("cpu", "cuda")


def test_a_hot_start_matrix_follows_the_model_to_its_device(tiny_lm):
    from components.session import Session

    import dataclasses

    sess = Session()
    m = sess.matrix_state.for_race(tiny_lm, 8, True)
    m.table[5, 0], m.writes = 7, 5
    assert sess.matrix_state.for_race(tiny_lm, 8, True) is m  # same device: the same matrix, kept
    elsewhere = dataclasses.replace(tiny_lm, device=torch.device("meta"))  # the model on another device
    moved = sess.matrix_state.for_race(elsewhere, 8, True)
    assert moved.table.device.type == "meta" and moved.writes == 5 and sess.matrix_state.matrix is moved  # not a fresh one
    assert m.to("cpu") is m and m.to(torch.device("cpu")) is m


def test_the_out_of_memory_message_names_model_dtype_device_and_room(monkeypatch):
    text = devices.oom_message("Qwen/Qwen2.5-7B", torch.bfloat16, "cpu")
    assert "Qwen/Qwen2.5-7B" in text and "bfloat16" in text and "cpu" in text
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (3 * 2**30, 24 * 2**30))
    text = devices.oom_message("m", "float32", torch.device("cuda", 0))
    assert "3.0 GiB free of 24.0 GiB" in text and "cuda:0" in text


def test_the_app_says_out_of_memory_in_those_words(monkeypatch):
    from components.handlers import error_text

    text = error_text(torch.OutOfMemoryError("CUDA out of memory"), {"model": "lmsys/vicuna-7b-v1.3",
                                                                      "dtype": "float32", "device": "cpu"})
    assert "lmsys/vicuna-7b-v1.3" in text and "float32" in text and "Traceback" not in text


def test_a_model_switch_frees_the_old_model_before_loading_the_new_one(monkeypatch):
    import components.model_hub as model_hub

    events = []
    monkeypatch.setattr(model_hub, "release_device_memory", lambda device=None: events.append("empty cache"))
    hub = model_hub.ModelHub(keep=1, loader=lambda spec, d, t: events.append(f"load {spec} beside "
                                                                             f"{hub.loaded()}") or spec)
    monkeypatch.setattr(model_hub, "check_hub_id", lambda spec: None)
    hub.get("org/a")
    hub.get("org/b")
    assert events == ["empty cache", "load org/a beside []", "empty cache", "load org/b beside []"]
    hub.freeze()  # ZeroGPU: only what was loaded at start-up
    assert hub.get("org/b") == "org/b"
    with pytest.raises(model_hub.ModelLoadError, match="only"):
        hub.get("org/c")


def tiny_loader(spec, device, dtype):
    from tr_core import wrap_model

    from .conftest import make_tiny_tokenizer

    return wrap_model(make_tiny_model(seed=len(spec)), make_tiny_tokenizer(), name=spec)


def two_tabs(hub, settings):
    """The app's handlers on ``hub`` with two live tabs, each one step into a race."""
    from components.handlers import Handlers
    from components.session import Session

    h, tabs = Handlers(hub, cap=64), (Session(), Session())
    h.live.update(enumerate(tabs))
    for sess in tabs:
        sess.step(hub, "w3 w4 w5", settings, cap=64)
    return h, *tabs


def test_after_a_model_switch_nothing_holds_the_old_model(monkeypatch):
    """Not the hub, not the tab that switched, not another tab's race: the old model is gone."""
    import gc
    import weakref

    import components.model_hub as model_hub
    from components.session import Settings

    monkeypatch.setattr(model_hub, "check_hub_id", lambda spec: None)
    hub = model_hub.ModelHub(keep=1, default="org/a", loader=tiny_loader)
    _, mine, other = two_tabs(hub, Settings(model="org/a", tree="auto", k=8, max_new_tokens=8, hot_start=True))
    old = weakref.ref(hub.get("org/a"))
    mine.step(hub, "w3 w4 w5", Settings(model="org/bb", tree="auto", k=8, max_new_tokens=8, hot_start=True), cap=64)
    gc.collect()
    assert old() is None and other.live.race is None and mine.live.race.decoder.lm.name == "org/bb"


def test_a_model_switch_after_run_to_end_frees_the_old_model(monkeypatch):
    """Run to end keeps its run in ``Session.flight.running`` for its ticks; a switch, in this tab or
    another, lets the old model go all the same, and the run's last tick lets it go too."""
    import gc
    import weakref

    import components.model_hub as model_hub
    from components.session import Settings

    monkeypatch.setattr(model_hub, "check_hub_id", lambda spec: None)
    hub = model_hub.ModelHub(keep=1, default="org/a", loader=tiny_loader)
    s = Settings(model="org/a", tree="auto", k=8, max_new_tokens=8, hot_start=True)
    h, mine, other = two_tabs(hub, s)
    mine.flight.running, other.flight.running = mine.current(), other.current()  # as Run to end leaves them
    old = weakref.ref(hub.get("org/a"))
    mine.step(hub, "w3 w4 w5", Settings(model="org/bb", tree="auto", k=8, max_new_tokens=8, hot_start=True), cap=64)
    gc.collect()
    assert old() is None and mine.flight.running is None and other.flight.running is None
    mine.flight.running = mine.current()
    mine.flight.stop = True
    h.run_tick(None, mine, prompt="w3 w4 w5")  # the run's last tick: nothing holds it any more
    assert mine.flight.running is None


def test_idle_tabs_give_their_kv_caches_back(tiny_lm):
    import time

    from components.handlers import IDLE_SECONDS
    from components.model_hub import ModelHub
    from components.session import Settings

    s = Settings(model="tiny", tree="tr-8", k=8, max_new_tokens=30, hot_start=True)
    h, idle, busy = two_tabs(ModelHub(loaded={"tiny": tiny_lm}, default="tiny"), s)
    busy.flight.last_active = idle.flight.last_active + IDLE_SECONDS
    assert h.free_idle(now=idle.flight.last_active + IDLE_SECONDS + 1) == 1
    assert idle.live.race.decoder.cache is None and busy.live.race.decoder.cache is not None
    h.advance(idle, "w3 w4 w5", s)  # it steps again: rebuilt, and still greedy's text
    assert idle.live.race.decoder.cache is not None and idle.live.race.figures()["identical"]
    assert time.monotonic() - idle.flight.last_active < 5


def test_onednn_packing_is_probed_and_its_absence_falls_back_to_plain_weights(monkeypatch, tmp_path, tiny_lm):
    """A CPU without the instructions (e.g. AVX2 only, in bfloat16) refuses oneDNN's reorder; simulated."""
    from tr_core import load_model
    from tr_core.prepack import prepack_linears

    def refuse(weight, batch_hint):
        raise RuntimeError("mkldnn_reorder_linear_weight: bf16 path needs the cpu support avx_ne_convert "
                           "or avx512bw, avx512vl and avx512dq")
    monkeypatch.setattr(devices, "_reorder", refuse)
    devices.onednn_linear_works.cache_clear()
    try:
        assert not devices.onednn_linear_works(torch.bfloat16) and not devices.prepack_available(
            torch.device("cpu"), torch.bfloat16)
        assert devices.cpu_info()["onednn_packed"] == []
        tiny_lm.model.save_pretrained(tmp_path)
        tiny_lm.tokenizer.save_pretrained(tmp_path)
        lm = load_model(str(tmp_path), device="cpu", dtype="bfloat16")
        assert lm.prepacked == 0 and lm.dtype == torch.bfloat16
        with torch.inference_mode():
            assert lm.model(input_ids=torch.tensor([[3, 4, 5]])).logits.shape[-1] == lm.vocab_size
    finally:
        devices.onednn_linear_works.cache_clear()
    # a probe that passes but a layer that fails (a shape the probe did not try): nothing is swapped
    import tr_core.prepack as prepack

    class Refusing(prepack.PackedLinear):
        def __init__(self, *a, **k):
            raise RuntimeError("oneDNN refused this shape")
    monkeypatch.setattr(prepack, "PackedLinear", Refusing)
    model = make_tiny_model()
    assert prepack_linears(model) == 0 and all(type(m) is not Refusing for m in model.modules())


def curve(one_ms: float, at81_ms: float):
    """A synthetic cost curve, linear from 1 to 81 query tokens."""
    from tr_core.planner import CostCurve

    return CostCurve([1, 81, 96], [one_ms / 1e3, at81_ms / 1e3, (at81_ms + (at81_ms - one_ms) * 15 / 80) / 1e3])


def test_the_planner_picks_a_small_tree_for_float32_on_a_gpu_and_a_large_one_for_bfloat16(tiny_lm):
    """fp32 on a GPU: 1 token 15 ms, 81 tokens 56 ms; bf16: 81 tokens 17 ms.  Each curve gets its own
    tree, and each tree beats the other curve's choice on its own curve."""
    import dataclasses

    from tr_core.planner import TreePlanner

    trees = {}
    for name, c in (("fp32", curve(15, 56)), ("bf16", curve(15, 17))):
        planner = TreePlanner(dataclasses.replace(tiny_lm, cost_curve=c))
        trees[name] = (planner.tree.size, planner.expected, c)
    small, large = trees["fp32"][0], trees["bf16"][0]
    assert 0 < small <= 24 and large >= 48 and large > 2 * small, trees  # most of the 80 nodes

    def rate(size, expected, c):
        return expected / c(1 + size)
    for mine, other in (("fp32", "bf16"), ("bf16", "fp32")):
        c = trees[mine][2]
        other_planner = TreePlanner(dataclasses.replace(tiny_lm, cost_curve=trees[other][2]))
        assert rate(trees[mine][0], trees[mine][1], c) > rate(other_planner.tree.size, other_planner.expected, c)


def test_a_released_kv_cache_is_rebuilt_and_the_output_stays_greedy(tiny_lm):
    from tr_core import GreedyDecoder, TokenRecyclingDecoder
    from tr_core.race import Race

    from .conftest import reference_greedy

    prompt = [5, 9, 14, 3, 22, 9, 14]
    race = Race(TokenRecyclingDecoder(tiny_lm, tree="tr-16", max_new_tokens=40), GreedyDecoder(tiny_lm, 40))
    race.start(prompt)
    for n in range(200):
        if race.done:
            break
        race.step()
        if n % 3 == 1:
            assert race.release_caches() and race.decoder.cache is None  # an idle tab's caches go
    assert race.decoder.output == reference_greedy(tiny_lm, prompt, 40) == race.greedy.output[:40]
    assert all(s.wall is not None and s.seconds == s.wall for s in race.decoder.steps)  # whole-step wall clock


def test_the_race_wakes_the_cpu_before_it_times_the_method_and_not_a_gpu(monkeypatch, tiny_lm):
    """A step of the race first keeps the CPU busy (untimed), so a CPU that idled while the page drew
    does not charge its slow first forward to the method; a GPU is not woken."""
    import time

    import tr_core.race as race_mod
    from tr_core.decoders import GreedyDecoder, TokenRecyclingDecoder
    from tr_core.devices import wake

    t0 = time.perf_counter()
    wake(torch.device("cpu"), 0.02)
    assert time.perf_counter() - t0 >= 0.02
    t0 = time.perf_counter()
    wake(torch.device("meta"), 5.0)  # not a CPU: nothing to wake here
    wake(torch.device("cpu"), 5.0, idle=0.01)  # the model ran just now (other tabs' forwards): not idle
    assert time.perf_counter() - t0 < 1.0
    t0 = time.perf_counter()
    wake(torch.device("cpu"), 0.02, idle=2.0)  # idle for seconds: woken
    assert time.perf_counter() - t0 >= 0.02
    events = []
    monkeypatch.setattr(race_mod, "wake", lambda device, seconds=None, idle=None: events.append(("wake", device.type)))
    real = race_mod.timed_stepping

    def spied(dec):
        events.append(("step", type(dec).__name__))
        return (yield from real(dec))
    monkeypatch.setattr(race_mod, "timed_stepping", spied)
    race = race_mod.Race(TokenRecyclingDecoder(tiny_lm, tree="tr-16", max_new_tokens=8), GreedyDecoder(tiny_lm, 8))
    race.start([5, 9, 14, 3])  # the prompt is read in the first step, timed too: after its wake
    assert events == []
    race.step()
    assert events[:2] == [("wake", "cpu"), ("step", "TokenRecyclingDecoder")] and race.reading["method"] > 0
    assert events.count(("wake", "cpu")) == 1
    # each side's first step carries its reading of the prompt, in its wall clock and as a phase
    first_tr, first_greedy = race.decoder.steps[0], race.greedy.steps[0]
    assert first_tr.timings["reading"] == race.reading["method"] > 0 and first_tr.seconds >= race.reading["method"]
    assert first_greedy.timings["reading"] == race.reading["greedy"] > 0 == race.baseline[0]["reading"] - race.reading["greedy"]
    race.step()
    assert "reading" not in race.decoder.steps[1].timings


def test_the_bench_uses_one_copy_where_a_second_does_not_fit(monkeypatch, tiny_lm):
    import dataclasses

    import tr_core.bench.peers as bench

    gpu = dataclasses.replace(tiny_lm, device=torch.device("cuda", 0))
    size = bench.model_bytes(gpu)
    monkeypatch.setattr(bench, "free_memory", lambda device: 10 * size)
    assert bench.second_copy_fits(gpu)
    monkeypatch.setattr(bench, "free_memory", lambda device: size)
    assert not bench.second_copy_fits(gpu) and bench.second_copy_fits(tiny_lm)  # a CPU's host memory


@pytest.mark.skipif(__import__("platform").machine() not in ("x86_64", "AMD64"), reason="x86 ISA limits")
def test_on_an_avx2_only_cpu_bfloat16_loads_with_plain_weights(tmp_path, tiny_lm):
    """oneDNN and PyTorch told to use AVX2 at most (as on an AMD EPYC without AVX-512), in a fresh
    process: bfloat16 packing is refused there, so the model keeps plain weights and still decodes."""
    import json
    import os
    import subprocess
    import sys

    tiny_lm.model.save_pretrained(tmp_path)
    tiny_lm.tokenizer.save_pretrained(tmp_path)
    code = ("import json, torch; from tr_core import load_model, devices, TokenRecyclingDecoder; "
            f"lm = load_model({str(tmp_path)!r}, 'cpu', 'bfloat16'); "
            "out = TokenRecyclingDecoder(lm, tree='tr-8', max_new_tokens=6).generate([5, 9, 14]); "
            "print(json.dumps([lm.prepacked, devices.cpu_info(), len(out)]))")
    env = dict(os.environ, ONEDNN_MAX_CPU_ISA="AVX2", ATEN_CPU_CAPABILITY="avx2")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert done.returncode == 0, done.stderr[-2000:]
    packed, cpu, n = json.loads(done.stdout.strip().splitlines()[-1])
    assert packed == 0 and "bfloat16" not in cpu["onednn_packed"] and cpu["torch_isa"] in ("AVX2", "DEFAULT")
    assert n == 6


def test_a_gpu_that_emulates_bfloat16_gets_float16(monkeypatch):
    """T4/V100: ``is_bf16_supported(including_emulation=False)`` is False there (faked here)."""
    monkeypatch.setattr(devices, "free_memory", lambda device: 16 * 2**30)
    monkeypatch.setattr(devices, "float32_token_ratio", lambda device, shapes: 3.0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    asked = []
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: asked.append(
        including_emulation) or False)
    gpu = torch.device("cuda", 0)
    choice = devices.pick_dtype("auto", gpu, parameters=7_000_000_000)  # too big for float32
    assert choice.dtype == torch.float16 and "emulates bfloat16" in choice.reason and asked == [False]
    assert devices.pick_dtype("auto", gpu, parameters=1_000_000_000).dtype == torch.float16  # float32 dear
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    assert devices.pick_dtype("auto", gpu, parameters=7_000_000_000).dtype == torch.bfloat16


def test_near_the_threshold_the_dtype_rule_keeps_its_earlier_verdict(monkeypatch, tmp_path):
    """A ratio near 1.5x (a 7B model on an H100) measured 1.45 at one start and 1.55 at the next keeps
    the first verdict; far from the threshold the measurement decides."""
    monkeypatch.setenv("TR_CACHE", str(tmp_path))
    monkeypatch.setattr(devices, "free_memory", lambda device: 80 * 2**30)
    gpu = torch.device("cuda", 0)
    shapes = devices.layer_shapes(type("C", (), dict(hidden_size=64, num_attention_heads=4))())

    def pick(ratio):
        return devices.pick_dtype("auto", gpu, 7_000_000_000, shapes, measure=lambda device, s: ratio)
    assert pick(1.45).dtype == torch.float32
    assert pick(1.55).dtype == torch.float32 and "earlier verdict" in pick(1.55).reason
    assert pick(2.0).dtype == torch.bfloat16 and pick(1.2).dtype == torch.float32  # outside the band
    (tmp_path / "dtype_rule.json").unlink()
    assert pick(1.55).dtype == torch.bfloat16 and pick(1.45).dtype == torch.bfloat16  # the other way round


def test_the_dtype_probe_times_a_whole_layer_with_its_attention():
    shapes = devices.layer_shapes(type("C", (), dict(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                                     num_key_value_heads=2))())
    assert shapes.attention == (4, 2, 16) and len(shapes) == 5
    ratio = devices.float32_token_ratio(torch.device("cpu"), shapes, repeats=2)
    assert ratio is not None and ratio > 0
