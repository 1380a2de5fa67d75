"""The event loop a task runs on: uvloop where available (asyncpg's recommended loop)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["new_event_loop", "run_task"]

T = TypeVar("T")


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A uvloop loop (its socket and callback paths are several times cheaper), else asyncio's."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a pinned dependency on Linux and macOS
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


def run_task(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a task's coroutine on a fresh loop of its own (the task's mailbox thread)."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(main())
