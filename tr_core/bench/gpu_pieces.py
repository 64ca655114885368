"""What travels to a bare GPU host, and how it is put back together there.

A bare host has PyTorch with CUDA, transformers, safetensors, tokenizers and numpy, and nothing that
is not already on it can be installed (no package registry, no model hub).  Files reach it in
pieces of at most 64 MiB.  So the prepared folder (``python -m tr_core.bench.gpu_prepare``) holds:

* ``model/``: a model file (the embedded ``.gguf``, 94 MiB) cut into ``PART_BYTES`` parts, with
  ``manifest.json`` (the file's name, size and SHA-256, and each part's);
* ``wheels/``: pure-Python packages the host may lack, each a zip that works on ``sys.path`` as
  it is (``gguf``, which transformers needs to read a ``.gguf`` file, and ``yaml``, which ``gguf``
  imports; numpy is on the host already);
* ``question.jsonl``: a few Spec-Bench prompts of each category.

On the host :func:`reassemble` joins the parts (checking every checksum) and :func:`use_wheels` puts
the wheels on ``sys.path`` for whichever of their packages are missing.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import sys
import zipfile
from pathlib import Path

PART_BYTES = 48 * 2**20  # under the 64 MiB a copy may carry, with room to spare
MANIFEST = "manifest.json"
MODEL_DIR, WHEEL_DIR, PROMPTS = "model", "wheels", "question.jsonl"
WHEEL_PACKAGES = {"gguf": "gguf", "pyyaml": "yaml"}  # distribution -> the package it provides


class PiecesError(RuntimeError):
    """A prepared folder that is incomplete or damaged (the message says which file)."""


def sha256(path: Path, chunk: int = 2**20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def split_file(src: Path, out: Path, part_bytes: int = PART_BYTES) -> dict:
    """Cut ``src`` into ``out/NAME.partNNN`` of at most ``part_bytes`` each; write and return the manifest."""
    out.mkdir(parents=True, exist_ok=True)
    parts = []
    with open(src, "rb") as f:
        while block := f.read(part_bytes):
            part = out / f"{src.name}.part{len(parts):03d}"
            part.write_bytes(block)
            parts.append({"name": part.name, "bytes": len(block), "sha256": hashlib.sha256(block).hexdigest()})
    manifest = {"file": src.name, "bytes": src.stat().st_size, "sha256": sha256(src), "parts": parts}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2))
    return manifest


def reassemble(folder: Path, dest: Path | None = None) -> Path:
    """The file described by ``folder/manifest.json``, joined from its parts into ``dest`` (default:
    ``folder``); every part and the whole checked against their SHA-256.  A file already joined and
    whole is used as it is."""
    folder = Path(folder)
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError) as err:
        raise PiecesError(f"{folder} has no readable {MANIFEST} ({err}); prepare it with "
                          "python -m tr_core.bench.gpu_prepare") from None
    dest = Path(dest or folder)
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / manifest["file"]
    if target.is_file() and target.stat().st_size == manifest["bytes"] and sha256(target) == manifest["sha256"]:
        return target
    tmp = target.with_name(target.name + ".joining")
    with open(tmp, "wb") as out:
        for p in manifest["parts"]:
            path = folder / p["name"]
            if not path.is_file():
                raise PiecesError(f"part {p['name']} is missing from {folder}: copy every part of {manifest['file']}")
            data = path.read_bytes()
            if len(data) != p["bytes"] or hashlib.sha256(data).hexdigest() != p["sha256"]:
                raise PiecesError(f"part {p['name']} is damaged (size or SHA-256 differs): copy it again")
            out.write(data)
    if sha256(tmp) != manifest["sha256"]:
        tmp.unlink()
        raise PiecesError(f"{manifest['file']} joined from its parts does not match its SHA-256")
    tmp.replace(target)
    return target


def wheel_from_installed(dist_name: str, package: str, out: Path) -> Path:
    """A zip of the installed ``package`` (Python files only) and its distribution's metadata, named
    as a pure-Python wheel: importable from ``sys.path`` as it is, and ``importlib.metadata`` finds
    its version there (transformers checks gguf's)."""
    import importlib.metadata as md

    dist = md.distribution(dist_name)
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise PiecesError(f"the package {package!r} is not installed here")
    root = Path(next(iter(spec.submodule_search_locations)))
    info = Path(dist._path)  # noqa: SLF001 - the .dist-info folder
    out.mkdir(parents=True, exist_ok=True)
    wheel = out / f"{dist.metadata['Name'].replace('-', '_')}-{dist.version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        for f in sorted(root.rglob("*.py")) + sorted(root.rglob("*.typed")):
            z.write(f, f"{package}/{f.relative_to(root).as_posix()}")
        for name in ("METADATA", "top_level.txt"):
            if (info / name).is_file():
                z.write(info / name, f"{info.name}/{name}")
    return wheel


def importable(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


def use_wheels(folder: Path | None) -> dict[str, str]:
    """Put each wheel of ``folder`` on ``sys.path`` whose package cannot be imported here; returns
    ``{package: where it comes from}`` ("installed", the wheel's path, or "missing")."""
    status = {}
    wheels = sorted(Path(folder).glob("*.whl")) if folder and Path(folder).is_dir() else []
    for dist, package in WHEEL_PACKAGES.items():
        if importable(package):
            status[package] = "installed"
            continue
        mine = [w for w in wheels if w.name.lower().startswith(dist.replace("-", "_").lower() + "-")]
        if mine:
            sys.path.insert(0, str(mine[-1]))
            importlib.invalidate_caches()
        status[package] = str(mine[-1]) if mine and importable(package) else "missing"
    return status
