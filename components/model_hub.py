"""One loaded model per spec, shared by every session of the app (never module-level state).

Switching models frees the old one first (and gives the GPU's cached blocks back), then loads the
new one: two 7B models need not fit one card, and the free memory that picks the new model's dtype
is then the card's, not what the previous model left.  ``frozen`` (ZeroGPU): only the models loaded
at start-up are served; nothing is ever loaded inside a GPU call, whose memory is thrown away.
"""
from __future__ import annotations

import re
import threading
from pathlib import Path

from tr_core.devices import release_device_memory
from tr_core.models import EMBEDDED, LoadedModel, ModelLoadError, load_model

from .memory import collect_all


HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
PROBE_SECONDS = 4.0


def check_hub_id(spec: str) -> None:
    """A model a visitor names is a Hub id (never a server path), answered within seconds: found in the
    local cache, or asked of the Hub with a short timeout (offline, an unknown id fails at once).

    ``org/name`` is also a relative path, and the loaders read a folder or ``.gguf`` file of that name
    on the server's disk before the Hub: such a name is refused with the very words of a missing one,
    and only after the Hub was asked, so neither the answer nor its delay tells what is on the disk."""
    if not HUB_ID.fullmatch(spec) or ".." in spec:
        raise ModelLoadError(f"Could not load {spec[:80]!r}: name a Hugging Face model id such as "
                             "Qwen/Qwen2.5-0.5B-Instruct.")
    from huggingface_hub import model_info, try_to_load_from_cache

    reason = ""
    if not isinstance(try_to_load_from_cache(spec, "config.json"), str):
        try:
            model_info(spec, timeout=PROBE_SECONDS)
        except Exception as err:  # not found, gated, offline, unreachable: all mean "cannot load it now"
            reason = f" ({type(err).__name__})"
    if reason or Path(spec).exists():
        raise ModelLoadError(f"Could not load {spec!r}: it is not in the server's model cache and the Hub "
                             f"did not offer it{reason or ' (RepositoryNotFoundError)'}.")


class ModelHub:
    """Loads models on demand and keeps the last ``keep`` of them; thread-safe."""

    def __init__(self, device: str | None = None, dtype: str | None = None, keep: int = 1,
                 allow_other_models: bool = True, default: str | None = None,
                 loaded: dict[str, LoadedModel] | None = None, loader=load_model):
        """``loaded``: models already in memory, by spec (tests, notebooks); ``loader(spec, device,
        dtype)``: how a model is loaded (``load_model``)."""
        self.device, self.dtype, self.keep, self.loader = device, dtype, keep, loader
        self.default = self.normalise(default)
        self.allow_other_models = allow_other_models
        self.frozen = False  # ZeroGPU: serve only what is loaded (``freeze``)
        self.start_error = ""  # why the start-up load failed (ZeroGPU), said for every later request
        self.on_evict = []  # callbacks(lm) that drop every other reference to an evicted model (the sessions')
        self._models: dict[str, LoadedModel] = {self.normalise(k): v for k, v in (loaded or {}).items()}
        self._lock = threading.Lock()

    def freeze(self) -> None:
        """From now on, serve only the models already loaded (ZeroGPU, after start-up)."""
        self.frozen = True

    @staticmethod
    def normalise(spec: str | None) -> str:
        spec = (spec or "").strip()
        return EMBEDDED if spec in ("", EMBEDDED) or spec.startswith("SmolLM2-135M-Instruct") else spec

    def get(self, spec: str | None = None) -> LoadedModel:
        """The model for ``spec`` (None or empty: the server's default), loaded on first use."""
        key = self.normalise(spec) if spec else self.default
        if key not in (EMBEDDED, self.default) and key not in self._models and not self.allow_other_models:
            raise ModelLoadError("This server only runs the embedded model.")
        with self._lock:
            if key not in self._models and key != self.default and key != EMBEDDED:
                check_hub_id(key)  # a visitor's choice; the operator's default may be a folder or file
            if key not in self._models and self.frozen:
                raise ModelLoadError(self.start_error or "This Space serves only the model it loaded at start-up.")
            if key not in self._models:
                self.evict(self.keep - 1)
                self._models[key] = self.loader(None if key == EMBEDDED else key, self.device, self.dtype)
            return self._models[key]

    def peek(self, spec: str | None = None) -> LoadedModel | None:
        """The model for ``spec`` if it is loaded, else None (never loads, never asks the Hub)."""
        return self._models.get(self.normalise(spec) if spec else self.default)

    def evict(self, keep: int) -> None:
        """Free the oldest models until ``keep`` are left, then give their memory back (GPU and host)."""
        while len(self._models) > max(keep, 0):
            lm = self._models.pop(next(iter(self._models)))
            for forget in self.on_evict:
                forget(lm)
            del lm
        collect_all()
        release_device_memory()

    def loaded(self) -> list[str]:
        return list(self._models)
