"""Pausing Python's cyclic garbage collector around work that builds a large, acyclic heap.

A scheduling cycle (and a trace replay) allocates hundreds of thousands of small objects
that stay alive until it ends and form no reference cycles; the collector would re-scan
them over and over as they grow (a third of plan() at 100k GPUs, half of loading a
33,000-GPU snapshot). Reference counting frees them; the collector resumes afterwards.
"""
from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def gc_paused(*, promote: bool = False) -> Iterator[None]:
    """No cyclic collection inside; restored afterwards if it was on.

    ``promote``: what was built stays alive after the block (a replay's results), so move
    it to the oldest generation unscanned (freeze + unfreeze) rather than have the next
    young collection walk all of it.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            if promote:
                gc.freeze()
                gc.unfreeze()
            gc.enable()
