"""Run a coroutine to completion on an event loop of its own, in a thread of its own.

Not `asyncio.run` in the test's thread: a session-scoped Playwright (the console's browser
tests) keeps an event loop running in the main thread for the rest of the session, and
`asyncio.run` refuses to start under a running loop.
"""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any


def run_in_own_loop(coro: Coroutine[Any, Any, Any], timeout: float = 20) -> Any:
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = asyncio.run(asyncio.wait_for(coro, timeout))
        except BaseException as exc:  # handed back to the test's thread
            outcome["error"] = exc

    thread = threading.Thread(target=target, name="own-loop", daemon=True)
    thread.start()
    thread.join(timeout + 10)
    if thread.is_alive():
        raise TimeoutError(f"the coroutine's loop did not end within {timeout + 10} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")
