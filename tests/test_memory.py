"""Memory the server gives back: objects set aside from Python's collector once loaded, and looked at
again when a model is freed."""
from __future__ import annotations

import gc
import weakref

from components.memory import collect_all, set_aside_long_lived


def test_objects_set_aside_are_skipped_by_collections_until_a_model_is_freed():
    """``set_aside_long_lived`` hides what is alive from the collector (a closed tab's collection then
    walks only newer objects); ``collect_all`` (a model evicted) looks at them again."""

    class Node:
        pass

    a, b = Node(), Node()
    a.other, b.other = b, a  # a cycle: only the collector frees it
    gone = weakref.ref(a)
    try:
        assert set_aside_long_lived() > 0
        del a, b
        gc.collect()
        assert gone() is not None  # set aside: a full collection does not look at it
        collect_all()
        assert gone() is None and gc.get_freeze_count() > 0  # looked at, freed, the rest set aside again
    finally:
        gc.unfreeze()


def test_a_later_page_load_sets_aside_nothing_of_its_visitors(hub):
    """Start-up sets the model aside once; each later page's load (which runs start-up's handler again)
    leaves alone what the visitors' sessions hold, so a closed tab's cycles are still collected."""
    from components.startup import warm_up

    def quiet(*_args, **_kw):
        return None

    try:
        warm_up(hub, quiet)
        frozen = gc.get_freeze_count()
        visitors = [[object()] for _ in range(1000)]  # a tab's objects, alive at the next page's load
        warm_up(hub, quiet)
        assert gc.get_freeze_count() == frozen, "a page's load set its visitors' objects aside"
        del visitors
    finally:
        gc.unfreeze()
