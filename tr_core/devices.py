"""Every device decision in one place: which device, which dtype, which CPU kernels, what a device has.

Nothing here assumes a machine.  What a CPU or GPU can do is probed on the machine itself, on tiny
tensors, once per process, and every probe has a fallback:

* **Devices** are compared as normalised ``torch.device`` objects (``cuda`` and ``cuda:0`` are the
  same GPU), never as strings (:func:`normalise_device`, :func:`same_device`).
* **CPU kernels.**  oneDNN's pre-packed linear kernels (``tr_core.prepack``) need instructions some
  CPUs lack: bfloat16 packing needs AVX512-BW/VL/DQ or AVX-NE-CONVERT, which AMD EPYCs of the AVX2
  generation do not have.  :func:`onednn_linear_works` tries a 16 x 16 product in the dtype and
  compares it with PyTorch's plain kernel; where it fails, the model keeps its plain weights.
* **The dtype** (:func:`pick_dtype`).  The rule, stated once:

  - asked for: that dtype;
  - on a CPU: float32 (exact), always;
  - on a GPU: float32 (exact) when the float32 weights take at most ``FLOAT32_SHARE`` of the free
    memory **and** a 32-token forward of the model's own layer shapes in float32 costs at most
    ``EXACT_MAX_RATIO`` times a 1-token one, measured on this GPU at load
    (:func:`float32_token_ratio`: one whole layer, its linear maps and its attention over a
    ``PROBE_CACHE``-token cache, the fastest of several runs).  Otherwise half precision, where extra
    query tokens are nearly free and each divergence from greedy is a near-tie the race explains:
    bfloat16 where the GPU runs it natively, float16 where it would only emulate it (T4, V100:
    ``torch.cuda.is_bf16_supported(including_emulation=False)`` is False there).  The reason is kept
    with the model and shown in the status line.
  - a ratio within ``BAND`` of ``EXACT_MAX_RATIO`` (a model near the threshold, e.g. 7B on an H100)
    keeps the verdict this GPU gave the same shapes before (``dtype_rule.json`` in ``TR_CACHE`` or
    ``~/.cache/token_recycling``), so timing noise does not flip the dtype from one restart to the next.
* **Idle CPUs** are woken before a timed step (:func:`wake`): the first forward after a pause is slower.
* **Memory**: free bytes of a device and the words for running out of it (:func:`oom_message`).
"""
from __future__ import annotations

import os
import platform
import threading
import time
from dataclasses import dataclass
from functools import lru_cache

import torch

FLOAT32_SHARE = 0.5  # float32 only where its weights take at most this share of the free GPU memory
EXACT_MAX_RATIO = 1.5  # float32 only where a 32-token float32 forward costs at most this many 1-token ones
PROBE_TOKENS = 32
PROBE_CACHE = 256  # cached tokens the probe's attention reads
BAND = 0.15  # ratios within this share of EXACT_MAX_RATIO keep the verdict remembered for these shapes


class DeviceError(RuntimeError):
    """A device asked for that this machine does not have (the message says so)."""


# ---- devices ------------------------------------------------------------------------------------
def on_zero_gpu() -> bool:
    """Whether this process is a Hugging Face ZeroGPU Space: the ``spaces`` package says so
    (``spaces.config.Config.zero_gpu``).  There, each ``spaces.GPU`` call runs in a process forked
    for it: the app loads its model at start-up, outside any GPU call, and only small, picklable
    data crosses a call (``components.recorded``)."""
    import importlib

    try:
        spaces = importlib.import_module("spaces")
    except ImportError:
        return False
    config = getattr(getattr(spaces, "config", None), "Config", None)
    return bool(getattr(config, "zero_gpu", False))


def normalise_device(device) -> torch.device:
    """``"cuda"``, ``"cuda:0"`` and ``torch.device("cuda", 0)`` are one device: ``cuda:<index>``
    (the current GPU where no index is given, 0 where CUDA cannot say); ``cpu`` stays ``cpu``."""
    dev = device if isinstance(device, torch.device) else torch.device(str(device))
    if dev.type in ("cuda", "xpu", "mps") and dev.index is None:
        index = 0
        if dev.type == "cuda" and torch.cuda.is_available():
            index = torch.cuda.current_device()
        return torch.device(dev.type, index)
    return dev


def same_device(a, b) -> bool:
    return normalise_device(a) == normalise_device(b)


def pick_device(device: str | None) -> torch.device:
    """The device for ``device`` (None, "" or "auto": the first CUDA GPU if there is one, else the CPU)."""
    if device in (None, "", "auto"):
        return normalise_device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise DeviceError(f"{device!r} is not a device; use cpu, cuda or cuda:N.") from err
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise DeviceError(f"Device {device!r} was asked for, but no CUDA GPU is available here.")
    if dev.type == "cuda" and (dev.index or 0) >= torch.cuda.device_count():
        raise DeviceError(f"Device {device!r} was asked for, but this machine has "
                          f"{torch.cuda.device_count()} GPU(s).")
    return normalise_device(dev)


def load_straight_to_device() -> bool:
    """Whether weights may be built straight on their device (``device_map``): where ``accelerate`` is
    installed and this is not ZeroGPU (there: on the host, then ``.to("cuda")``, as its docs ask)."""
    import importlib.util

    return importlib.util.find_spec("accelerate") is not None and not on_zero_gpu()


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on ``device`` (its own GPU, e.g. ``cuda:1``); nothing on CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


WAKE_SECONDS = 0.03  # busy work before a timed step on a CPU that may have been idle
WAKE_AFTER_IDLE = 0.1  # seconds without model work after which a CPU is slow to start again


@lru_cache(maxsize=1)
def _wake_operands() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.full((256, 256), 0.5), torch.full((256, 256), 0.25)  # no random generator: nothing to lock


def wake(device: torch.device, seconds: float = WAKE_SECONDS, idle: float | None = None) -> None:
    """Keep every CPU thread busy for ``seconds`` before a timed step (nothing on a GPU), unless the
    caller knows the model ran within the last ``WAKE_AFTER_IDLE`` seconds (``idle``: seconds since its
    last forward, e.g. other tabs' on a server; None: unknown).

    A CPU idle for a few hundred milliseconds (a page drawing its last step, a person pressing Step)
    runs its next forward slower: measured on the embedded model, the median 1-token forward after
    0.3-1 s idle took 15% longer and the slowest quarter over 50% longer, and 30 ms of busy work
    first took it back to the time of forwards run back to back.  That slowness belongs to the
    machine, not to the method being timed, and only the first step after the pause pays it."""
    if device.type != "cpu" or (idle is not None and idle < WAKE_AFTER_IDLE):
        return
    a, b = _wake_operands()
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        torch.mm(a, b)


def serial_torch_here() -> None:
    """Torch work on the calling thread runs on it alone, with no OpenMP team of its own: for a server's
    event threads while its forwards run on one model thread (:mod:`tr_core.model_thread`).  Each thread
    that runs a parallel region keeps a team of OpenMP workers, and once the process has more workers
    than cores, every team's workers sleep between regions: measured on 2 cores, a greedy step of the
    embedded model took 34 ms while one thread ran torch and 59-67 ms once a second one had too.  (The
    count is per thread, but torch settles a thread's count at its first parallel work from the last
    count set on any thread: a model thread settles its own when it is made, :mod:`tr_core.model_thread`.)
    The main thread keeps its count: a script or a test that calls a handler directly is no event
    thread."""
    if threading.current_thread() is not threading.main_thread() and torch.get_num_threads() > 1:
        torch.set_num_threads(1)


def free_memory(device: torch.device) -> int | None:
    """Bytes free on a CUDA device (0 elsewhere; None where CUDA cannot tell, e.g. outside a ZeroGPU call)."""
    if device.type != "cuda":
        return 0
    try:
        return torch.cuda.mem_get_info(device)[0]
    except (RuntimeError, AssertionError):  # no CUDA in this build or process
        return None


def total_memory(device: torch.device) -> int:
    return torch.cuda.mem_get_info(device)[1] if device.type == "cuda" else 0


def release_device_memory(device: torch.device | None = None) -> None:
    """Give the CUDA caching allocator's free blocks back (after a model or a cache was dropped)."""
    if torch.cuda.is_available() and (device is None or device.type == "cuda"):
        torch.cuda.empty_cache()


def oom_message(what: str, dtype, device) -> str:
    """Words for an out-of-memory error: the model, dtype, device and what is free there now."""
    try:
        dev = normalise_device(device)
    except (RuntimeError, TypeError):
        dev = device  # e.g. "auto": said as given
    name = str(dtype).replace("torch.", "")
    if getattr(dev, "type", "cuda") == "cuda":
        try:
            free, total = torch.cuda.mem_get_info(dev)
            room = f"{free / 2**30:.1f} GiB free of {total / 2**30:.1f} GiB"
        except (RuntimeError, AssertionError, ValueError):
            room = "free memory unknown"
    else:
        room = "host memory"
    return (f"The device ({dev}) ran out of memory running {what} in {name} ({room}). Try fewer new tokens, "
            "a smaller tree, bfloat16, or a smaller model.")


def exact_float32(device: torch.device) -> None:
    """Float32 matmuls and convolutions in full IEEE precision on ``device`` (TF32 off): what
    "identical to greedy" needs on a GPU.  Process-wide, as PyTorch's setting is."""
    if device.type != "cuda":
        return
    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):  # torch >= 2.9
        torch.backends.cuda.matmul.fp32_precision = "ieee"
        torch.backends.cudnn.fp32_precision = "ieee"
    else:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


# ---- the CPU -------------------------------------------------------------------------------------
def _reorder(weight: torch.Tensor, batch_hint: int):
    return torch.ops.mkldnn._reorder_linear_weight(weight, batch_hint)


def _packed_linear(x: torch.Tensor, packed, bias):
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


@lru_cache(maxsize=None)
def onednn_linear_works(dtype: torch.dtype) -> bool:
    """Whether oneDNN's pre-packed linear kernel runs on this CPU in ``dtype`` and computes what the
    plain kernel does: tried once on a 16 x 16 weight (never decided from the CPU's name)."""
    if dtype not in (torch.float32, torch.bfloat16) or not torch.backends.mkldnn.is_available():
        return False
    try:
        gen = torch.Generator().manual_seed(0)
        w = torch.randn(16, 16, generator=gen).to(dtype)
        x = torch.randn(3, 16, generator=gen).to(dtype)
        y = _packed_linear(x, _reorder(w, 3), None)
        want = torch.nn.functional.linear(x.float(), w.float())
        return bool(torch.allclose(y.float(), want, rtol=0.05, atol=0.05))
    except (RuntimeError, NotImplementedError, AttributeError):
        return False


def prepack_available(device: torch.device, dtype: torch.dtype) -> bool:
    """oneDNN packing applies to CPU models in a dtype this CPU's oneDNN kernels run."""
    return device.type == "cpu" and onednn_linear_works(dtype)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16", "avx512_vnni",
             "avx_ne_convert", "amx_bf16", "amx_tile", "neon", "asimd", "sve")


def cpu_info() -> dict:
    """What a benchmark report says of the CPU: its model, the ISA PyTorch dispatches to, the vector
    flags that matter for the kernels here, and which oneDNN packings work (probed)."""
    capability = torch_isa()
    flags = _cpu_flags()
    return {"model": _cpu_model(), "arch": platform.machine(), "cores": os.cpu_count(),
            "threads": torch.get_num_threads(), "torch_isa": capability,
            "flags": [f for f in ISA_FLAGS if f in flags],
            "onednn_packed": [str(d).replace("torch.", "") for d in (torch.float32, torch.bfloat16)
                              if onednn_linear_works(d)]}


# ---- the dtype -----------------------------------------------------------------------------------
DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


@dataclass(frozen=True)
class DtypeChoice:
    dtype: torch.dtype
    reason: str  # in words, for the status line and a benchmark's meta
    ratio32: float | None = None  # a 32-token float32 forward over a 1-token one, where measured


def parse_dtype(dtype) -> torch.dtype | None:
    """``None``/"auto" -> None (the default rule); a name or ``torch.dtype`` -> that dtype."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "", "auto"):
        return None
    if dtype not in DTYPES:
        raise ValueError(f"Unknown dtype {dtype!r}; use one of {sorted(DTYPES)}.")
    return DTYPES[dtype]


def fast_bf16(device: torch.device) -> bool:
    """Whether ``device`` runs bfloat16 natively (not emulated: T4 and V100 emulate it, slowly).
    True where CUDA cannot say (no CUDA here): bfloat16 stays the default of an unknown GPU."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return True
    try:
        return bool(torch.cuda.is_bf16_supported(including_emulation=False))
    except TypeError:  # torch < 2.3: no emulation flag
        return bool(torch.cuda.is_bf16_supported())
    except (RuntimeError, AssertionError):
        return True


def half_dtype(device: torch.device) -> torch.dtype:
    """The fast dtype of ``device``: bfloat16 where it is native, else float16."""
    return torch.bfloat16 if fast_bf16(device) else torch.float16


def exact_mode_rule(parameters: int | None, free_bytes: int | None, ratio32: float | None,
                    half: torch.dtype = torch.bfloat16, remembered: torch.dtype | None = None) -> DtypeChoice:
    """The GPU default (module doc) from the facts measured at load: the model's parameter count,
    the device's free bytes, and the 32-to-1-token cost ratio of its shapes in float32; ``half``:
    the GPU's fast dtype (:func:`half_dtype`); ``remembered``: the verdict this GPU gave these shapes
    before, kept where the ratio is within ``BAND`` of the threshold."""
    name = str(half).replace("torch.", "")
    why = "" if half == torch.bfloat16 else " (this GPU emulates bfloat16)"
    if parameters is None or free_bytes is None:
        return DtypeChoice(half, f"{name}{why}: the model's size or the free memory was unknown")
    need = 4 * parameters
    if need > FLOAT32_SHARE * free_bytes:
        return DtypeChoice(half, f"{name}{why}: float32 weights ({need / 2**30:.1f} GiB) would take over "
                                 f"{FLOAT32_SHARE:.0%} of the {free_bytes / 2**30:.1f} GiB free")
    if ratio32 is None:
        return DtypeChoice(half, f"{name}{why}: the float32 forward cost could not be measured here")
    near = abs(ratio32 / EXACT_MAX_RATIO - 1.0) <= BAND
    if near and remembered in (torch.float32, half):
        kept = "float32" if remembered == torch.float32 else name
        return DtypeChoice(remembered, f"{kept}: a {PROBE_TOKENS}-token float32 layer costs {ratio32:.2f}x a 1-token "
                                       f"one, near the {EXACT_MAX_RATIO}x threshold: this GPU's earlier verdict for "
                                       "these shapes is kept", ratio32)
    if ratio32 > EXACT_MAX_RATIO:
        return DtypeChoice(half, f"{name}{why}: a {PROBE_TOKENS}-token float32 layer costs {ratio32:.1f}x "
                                 f"a 1-token one on this GPU (exact mode needs at most {EXACT_MAX_RATIO}x)", ratio32)
    return DtypeChoice(torch.float32, f"float32: it fits, and a {PROBE_TOKENS}-token layer costs {ratio32:.2f}x "
                                      "a 1-token one on this GPU", ratio32)


class LayerShapes(list):
    """(in, out) of one decoder layer's linear maps; ``attention``: (heads, kv heads, head dim)."""

    attention: tuple[int, int, int] | None = None


def layer_shapes(config) -> LayerShapes:
    """One decoder layer's linear maps and attention heads, from a transformers config."""
    h = int(getattr(config, "hidden_size", 0) or getattr(config, "n_embd", 0) or 0)
    inter = int(getattr(config, "intermediate_size", 0) or 4 * h)
    heads = int(getattr(config, "num_attention_heads", 0) or 1)
    kv = int(getattr(config, "num_key_value_heads", 0) or heads)
    head_dim = int(getattr(config, "head_dim", 0) or (h // heads if h else 0))
    out = LayerShapes()
    if not h:
        return out
    out += [(h, heads * head_dim), (h, 2 * kv * head_dim), (heads * head_dim, h), (h, 2 * inter), (inter, h)]
    out.attention = (heads, kv, head_dim)
    return out


@torch.inference_mode()
def float32_token_ratio(device: torch.device, shapes: list[tuple[int, int]], tokens: int = PROBE_TOKENS,
                        repeats: int = 9) -> float | None:
    """Seconds of one decoder layer for ``tokens`` query rows over those for 1 row, in float32 with
    TF32 off, on ``device``: its linear maps and (where ``shapes.attention`` says the heads) its
    attention over a ``PROBE_CACHE``-token cache with the tree mask; the fastest of ``repeats`` runs
    (noise only ever adds time).  None where it cannot be measured (no room, no shapes, no GPU work
    possible in this process)."""
    if not shapes:
        return None
    heads = getattr(shapes, "attention", None)
    try:
        exact_float32(device)
        weights = [torch.randn(o, i, device=device) * 0.02 for i, o in shapes]
        if heads:
            n, kv, d = heads
            keys = torch.randn(1, kv, PROBE_CACHE + tokens, d, device=device)

        def run(q: int) -> float:
            x = torch.randn(q, max(i for i, _ in shapes), device=device)
            if heads:
                from .attention import folded_attention

                query = torch.randn(1, n, q, d, device=device)
                mask = torch.ones(1, 1, q, PROBE_CACHE + q, dtype=torch.bool, device=device).tril(PROBE_CACHE)
            times = []
            for r in range(repeats + 1):
                synchronize(device)
                t0 = time.perf_counter()
                for w in weights:
                    torch.nn.functional.linear(x[:, :w.shape[1]], w)
                if heads:
                    k = keys[:, :, :PROBE_CACHE + q]
                    folded_attention(query, k, k, mask)
                synchronize(device)
                if r:
                    times.append(time.perf_counter() - t0)
            return min(times)
        one, many = run(1), run(tokens)
        del weights
        release_device_memory(device)
        return many / one if one > 0 else None
    except (RuntimeError, AssertionError, torch.OutOfMemoryError):
        release_device_memory(device)
        return None


def _memory_file():
    from .gguf_cache import cache_root

    return cache_root() / "dtype_rule.json"


def _shapes_key(device: torch.device, parameters, shapes) -> str:
    try:
        gpu = torch.cuda.get_device_name(device)
    except (RuntimeError, AssertionError, ValueError):
        gpu = "GPU"
    return f"{gpu}|{parameters}|{list(shapes or [])}|{getattr(shapes, 'attention', None)}"


def remembered_verdict(key: str) -> torch.dtype | None:
    import json

    try:
        name = json.loads(_memory_file().read_text()).get(key)
    except (OSError, ValueError, AttributeError):
        return None
    return DTYPES.get(name) if isinstance(name, str) else None


def remember_verdict(key: str, dtype: torch.dtype) -> None:
    """Keep this GPU's verdict for these shapes (only asked for ratios near the threshold)."""
    import json

    path = _memory_file()
    try:
        data = json.loads(path.read_text()) if path.is_file() else {}
        data[key] = str(dtype).replace("torch.", "")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=1))
    except (OSError, ValueError, TypeError):
        pass  # a read-only disk: the rule still decides, only without memory


def pick_dtype(dtype, device: torch.device, parameters: int | None = None, shapes=None,
               measure=None) -> DtypeChoice:
    """The dtype for ``dtype`` ("auto"/None: the rule of the module doc); ``shapes``: one layer's
    linear maps (:func:`layer_shapes`), timed on ``device`` by ``measure``."""
    asked = parse_dtype(dtype)
    if asked is not None:
        return DtypeChoice(asked, f"{str(asked).replace('torch.', '')}: asked for")
    if device.type != "cuda":
        return DtypeChoice(torch.float32, "float32: the default on a CPU")
    free, half = free_memory(device), half_dtype(device)
    first = exact_mode_rule(parameters, free, 1.0, half)  # memory alone: measure only where float32 fits
    if first.dtype != torch.float32:
        return first
    if shapes is not None and not isinstance(shapes, LayerShapes):
        shapes = LayerShapes(shapes)
    ratio = (measure or float32_token_ratio)(device, shapes if shapes is not None else LayerShapes())
    key = _shapes_key(device, parameters, shapes)
    choice = exact_mode_rule(parameters, free, ratio, half, remembered_verdict(key))
    if ratio is not None and abs(ratio / EXACT_MAX_RATIO - 1.0) <= BAND:
        remember_verdict(key, choice.dtype)
    return choice


def precision_words(dtype: torch.dtype) -> str:
    """The promise a dtype makes and its price, in words for a status line."""
    if dtype == torch.float32:
        return "float32, exact: identical to greedy; tree tokens cost more"
    name = str(dtype).replace("torch.", "")
    return f"{name}: faster; divergences are near-ties, each explained"


def cuda_name(device: torch.device) -> str | None:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else None


def describe_machine(device: torch.device) -> str:
    """One line: the GPU's name, or the CPU's model and ISA with the torch threads of the calling thread
    (for reports and the status line, made where the forwards run)."""
    if device.type == "cuda":
        return cuda_name(device) or "GPU"
    info = cpu_info()
    return f"{info['model']} ({info['torch_isa']}, {plural(info['threads'], 'thread')})"


def name_machine(device: torch.device) -> str:
    """Which machine, whatever thread asks: the GPU's name, or the CPU's model, ISA and cores (what a run
    file records of the machine that timed it)."""
    if device.type == "cuda":
        return cuda_name(device) or "GPU"
    return f"{_cpu_model()} ({torch_isa()}, {plural(usable_cores(), 'core')})"


def torch_isa() -> str:
    """The instruction set PyTorch's CPU kernels dispatch to (e.g. "AVX2", "AVX512")."""
    return getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", lambda: "unknown")()


def usable_cores() -> int:
    """The cores this process may run on (a container's or a Space's share, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def plural(n: int, word: str) -> str:
    """``n`` and ``word``, in the plural unless ``n`` is 1."""
    return f"{n} {word}{'s' * (n != 1)}"
