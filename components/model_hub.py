"""One loaded model per spec, shared by every session of the app (never module-level state)."""
from __future__ import annotations

import re
import threading
from pathlib import Path

from tr_core.models import EMBEDDED, LoadedModel, ModelLoadError, load_model


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
                 loaded: dict[str, LoadedModel] | None = None):
        """``loaded``: models already in memory, by spec (tests, notebooks)."""
        self.device, self.dtype, self.keep = device, dtype, keep
        self.default = self.normalise(default)
        self.allow_other_models = allow_other_models
        self._models: dict[str, LoadedModel] = {self.normalise(k): v for k, v in (loaded or {}).items()}
        self._lock = threading.Lock()

    @staticmethod
    def normalise(spec: str | None) -> str:
        spec = (spec or "").strip()
        return EMBEDDED if spec in ("", EMBEDDED) or spec.startswith("SmolLM2-135M-Instruct") else spec

    def get(self, spec: str | None = None) -> LoadedModel:
        """The model for ``spec`` (None or empty: the server's default), loaded on first use."""
        key = self.normalise(spec) if spec else self.default
        if key != EMBEDDED and not self.allow_other_models:
            raise ModelLoadError("This server only runs the embedded model.")
        with self._lock:
            if key not in self._models and key != self.default and key != EMBEDDED:
                check_hub_id(key)  # a visitor's choice; the operator's default may be a folder or file
            if key not in self._models:
                lm = load_model(None if key == EMBEDDED else key, self.device, self.dtype)
                while len(self._models) >= self.keep:
                    self._models.pop(next(iter(self._models)))
                self._models[key] = lm
            return self._models[key]

    def loaded(self) -> list[str]:
        return list(self._models)
