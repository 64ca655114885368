"""One loaded model per spec, shared by every session of the app (never module-level state)."""
from __future__ import annotations

import threading

from tr_core.models import EMBEDDED, LoadedModel, ModelLoadError, load_model


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
            if key not in self._models:
                lm = load_model(None if key == EMBEDDED else key, self.device, self.dtype)
                while len(self._models) >= self.keep:
                    self._models.pop(next(iter(self._models)))
                self._models[key] = lm
            return self._models[key]

    def loaded(self) -> list[str]:
        return list(self._models)
