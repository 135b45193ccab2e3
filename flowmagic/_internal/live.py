"""What a run shown live has in common, a Flow's and an orchestration's: the listeners told of
each of its events (a widget, the chat view, a progress line) and the asyncio task it runs as
on a notebook's loop, so the cell returns and buttons stay live."""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Coroutine

__all__ = ["LiveRun"]

Listener = Callable[[dict], None]


class LiveRun:
    """`subscribe` a listener, `tell` every listener an event, run as a task (`in_task`),
    `busy` while that task runs. Subclasses call `__init__` before they emit anything."""

    def __init__(self, listener: Listener | None = None) -> None:
        self._subscribers: list[Listener] = [listener] if listener else []
        self._task: asyncio.Task | None = None

    def subscribe(self, callback: Listener) -> Callable[[], None]:
        """Call `callback(event)` after every state change; returns the unsubscribe function."""
        self._subscribers.append(callback)
        return lambda: self._subscribers.remove(callback) if callback in self._subscribers else None

    def tell(self, event: dict) -> None:
        """Tell every listener (one that unsubscribes meanwhile is still told this one)."""
        for callback in list(self._subscribers):
            callback(event)

    def in_task(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
        """Run `coro` as a task on the running loop (a notebook's) and keep it for `busy`."""
        self._task = asyncio.get_running_loop().create_task(coro)
        return self._task

    @property
    def busy(self) -> bool:
        """Started as a task and not finished."""
        return self._task is not None and not self._task.done()
