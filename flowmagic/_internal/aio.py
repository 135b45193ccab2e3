"""Await a coroutine to its end from sync code, also inside a running event loop.

A notebook cell runs inside the kernel's loop, where `asyncio.run` is refused; there the
coroutine runs in a worker thread with a loop of its own, and the cell waits for it (so
`flowmagic.plan`, `flow.map`, `slim`, `importance`, `orchestrate` and `trials` block a cell
the way `%%flow` does, and a plain script gets `asyncio.run`).
The HTTP clients the coroutine opened belong to that short-lived loop, so the caller hands
in `close` (e.g. an LLM's `aclose`), awaited in that loop before it ends. Ctrl-C while
waiting calls `on_interrupt(loop)` in that loop (e.g. to stop a run cleanly) and then
re-raises.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Awaitable, Callable, Iterable


__all__ = ["in_loop", "run_blocking", "gather_all"]


async def gather_all(coros: Iterable[Awaitable[Any]]) -> list:
    """Every coroutine's result, in order, run concurrently in one `asyncio.TaskGroup`: when
    one raises, the others are cancelled and awaited before its exception is raised (itself,
    not wrapped in a group, as `gather` would); cancelling the caller cancels them all."""
    tasks: list[asyncio.Task] = []
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(c) for c in coros]
    except BaseExceptionGroup as group_error:
        first = group_error.exceptions[0]
        raise first.with_traceback(first.__traceback__) from None
    return [t.result() for t in tasks]


def in_loop() -> bool:
    """True inside a running event loop (a notebook cell, a coroutine)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def run_blocking(make: Callable[[], Awaitable[Any]], *,
                 close: Callable[[], Awaitable[Any]] | None = None,
                 on_interrupt: Callable[[], None] | None = None,
                 name: str = "flowmagic") -> Any:
    """The result of `await make()`, then `await close()` in the same loop."""
    box: dict[str, Any] = {}

    async def main():
        box["loop"] = asyncio.get_running_loop()
        try:
            return await make()
        finally:
            if close is not None:
                await close()

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(main())

    def worker() -> None:
        try:
            box["value"] = asyncio.run(main())
        except BaseException as exc:   # handed back to the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=worker, name=name, daemon=True)
    thread.start()
    try:
        thread.join()
    except KeyboardInterrupt:
        if on_interrupt is not None and "loop" in box:
            box["loop"].call_soon_threadsafe(on_interrupt)
        thread.join()
        raise
    if "error" in box:
        raise box["error"]
    return box.get("value")
