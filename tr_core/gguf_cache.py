"""A GGUF file's weights, dequantised once and kept as a model folder.

Reading a GGUF file with transformers parses its metadata three times (config, tokenizer, weights) and
dequantises every tensor on the host: about 30 s for the embedded 94 MiB file on a 2-core machine.  The
dequantised float32 weights, the config and the tokenizer are the same every time, so the first load
writes them as an ordinary model folder (safetensors) under the local cache, and every later load reads
that folder in a second or two.  The folder is named after the GGUF file's SHA-256 and the transformers
version that converted it; it is written to a temporary folder and renamed, so a crash or two processes
converting at once never leave half a folder.  Nothing is downloaded: the cache only ever holds
conversions of files on this machine.

``TR_CACHE`` (default ``~/.cache/token_recycling``) is the cache's root; ``TR_GGUF_CACHE=0`` turns the
cache off (every load then reads the GGUF file).
"""
from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

import torch

DONE = "converted.txt"  # written last: a folder without it is not used


def cache_root() -> Path:
    """Where this project keeps what it derives from local files (``TR_CACHE``)."""
    return Path(os.environ.get("TR_CACHE") or Path.home() / ".cache" / "token_recycling")


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def converted_folder(gguf: Path) -> Path:
    """The cache folder for ``gguf`` (whether or not it exists yet)."""
    import transformers

    return cache_root() / "gguf" / f"{file_digest(gguf)[:24]}-transformers-{transformers.__version__}"


def enabled() -> bool:
    return os.environ.get("TR_GGUF_CACHE", "1") != "0"


def cached(gguf: Path) -> Path | None:
    """The converted folder of ``gguf``, converting it first where it is missing; None where the cache
    is off or cannot be written (the caller then reads the GGUF file itself)."""
    if not enabled():
        return None
    try:
        folder = converted_folder(gguf)
        if (folder / DONE).is_file():
            return folder
        convert(gguf, folder)
        return folder if (folder / DONE).is_file() else None
    except Exception:  # a full disk, a read-only home, a file transformers cannot convert: read the GGUF file
        return None


def convert(gguf: Path, folder: Path) -> None:
    """Dequantise ``gguf`` to float32 and write it as a model folder at ``folder`` (atomically)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=".converting-"))
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        write_folder(model, tokenizer, tmp)
        (tmp / DONE).write_text(f"{gguf.name}\n")
        del model
        try:
            tmp.rename(folder)
        except OSError:  # another process finished first: its folder is as good
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_folder(model, tokenizer, folder: Path) -> None:
    """An ordinary model folder: transformers' ``save_pretrained`` refuses a model read from GGUF
    (it counts as quantised), so the config loses its GGUF mark and the weights are written as they
    are in memory (float32; tied weights once)."""
    from safetensors.torch import save_model

    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(folder)
    model.generation_config.save_pretrained(folder)
    save_model(model, str(folder / "model.safetensors"), metadata={"format": "pt"})
    tokenizer.save_pretrained(folder)


def forget(folder: Path) -> None:
    """Remove a converted folder that failed to load (it is converted again next time)."""
    shutil.rmtree(folder, ignore_errors=True)
