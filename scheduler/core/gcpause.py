"""Pausing Python's cyclic garbage collector around work that builds a large, acyclic heap.

A scheduling cycle (and a trace replay) allocates hundreds of thousands of small objects
that stay alive until it ends and form no reference cycles; the collector would re-scan
them over and over as they grow (a third of plan() at 100k GPUs, half of loading a
33,000-GPU snapshot). Reference counting frees them; the collector resumes afterwards.
"""
from __future__ import annotations

import gc
from types import TracebackType


class gc_paused:  # noqa: N801 - used like the function it was: ``with gc_paused():``
    """No cyclic collection inside; restored afterwards if it was on.

    ``promote``: what was built stays alive after the block (a replay's results), so move
    it to the oldest generation unscanned (freeze + unfreeze) rather than have the next
    young collection walk all of it.

    A class rather than a generator context manager: ``plan()`` enters it once per
    cycle, and a replay runs hundreds of thousands of cycles.
    """

    __slots__ = ("promote", "was_enabled")

    def __init__(self, *, promote: bool = False) -> None:
        self.promote = promote
        self.was_enabled = False

    def __enter__(self) -> None:
        self.was_enabled = gc.isenabled()
        if self.was_enabled:
            gc.disable()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.was_enabled:
            if self.promote:
                gc.freeze()
                gc.unfreeze()
            gc.enable()
