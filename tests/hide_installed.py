"""Copied as ``sitecustomize.py`` into a folder on PYTHONPATH, it hides the packages named in
``TR_HIDE`` (comma-separated) from that process, as if they were not installed: the finders of the
installed packages' folders answer None for them, while other paths (a wheel put on sys.path) still
offer them.  Used to run the GPU check as a bare GPU host would (no gradio, no gguf)."""
import importlib.machinery
import os
import site
import sys

HIDDEN = {n for n in os.environ.get("TR_HIDE", "").split(",") if n}
SITE = {os.path.realpath(p) for p in site.getsitepackages() + [site.getusersitepackages()]}


class Hiding:
    def __init__(self, inner):
        self.inner = inner

    def find_spec(self, name, target=None):
        if name.split(".")[0] in HIDDEN:
            return None
        return self.inner.find_spec(name, target)

    def __getattr__(self, attr):
        return getattr(self.inner, attr)


def hook(path):
    if os.path.realpath(path) not in SITE:
        raise ImportError
    return Hiding(importlib.machinery.FileFinder(path, *__import__("importlib._bootstrap_external", fromlist=["x"])._get_supported_file_loaders()))


if HIDDEN:
    sys.path_hooks.insert(0, hook)
    for p in list(sys.path_importer_cache):
        if os.path.realpath(p) in SITE:
            del sys.path_importer_cache[p]
