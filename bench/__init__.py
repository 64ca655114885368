"""Benchmarks of the app's drawing (the method's own benchmarks, UI-free, are ``tr_core.bench``)."""
