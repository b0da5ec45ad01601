"""Numbers in the words of reasons, shared by the stages that write them."""

from __future__ import annotations


def gib(mib: int) -> str:
    return f"{mib / 1024:g}"


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"
