"""Our side of a local server's queue: no more requests on it than it runs at once.

A local server runs a few requests at a time (its slots) and holds the rest in a queue
the client cannot see, so a client that sends all it has measures that queue with its
timeouts. Here the calls wait on our side instead, in arrival order, each told how many
requests are ahead of it ("waiting for the model (N ahead)"); only the model calls wait,
the nodes themselves still plan and run their code in parallel.

How many slots: `Endpoint.concurrency` when it is given (`configure(concurrency=N)`, the
embedded server's 1); else what the server says, asked once per process: llama.cpp's
server reports `total_slots` on GET /props; Ollama (GET /api/version answers) runs
OLLAMA_NUM_PARALLEL requests at once, a setting of its own we can read only when it is
set here too (else its default, 1); vLLM (GET /version answers) batches as many as it is
sent, so no limit of ours. Any other server: 1 (llama-cpp-python's server, LM Studio).
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import urllib.request
from collections import deque
from typing import Any, Callable
from urllib.parse import urlsplit

from .endpoints import Endpoint

__all__ = ["ServerQueue", "slots_of", "forget"]

_PROBE_S = 2.0   # each look at the server; a busy llama-cpp-python answers /models late
_lock = threading.Lock()
_learned: dict[str, int | None] = {}   # endpoint identity -> slots (None: no limit)

OnWait = Callable[[int | None], None]   # N requests ahead; None: the request went out


class ServerQueue:
    """At most `slots` requests on one server at a time (None: no limit); the others wait
    here first come, first served. One per server and event loop."""

    def __init__(self, slots: int | None) -> None:
        self.slots = slots
        self.running = 0
        self._waiting: deque[tuple[asyncio.Future, OnWait | None]] = deque()

    def ahead(self) -> int:
        """Requests that go before a new one: those running and those waiting."""
        return self.running + len(self._waiting)

    async def enter(self, on_wait: OnWait | None = None) -> None:
        """Wait for a place on the server; `on_wait(n)` hears how many are ahead whenever
        that changes, then `on_wait(None)` once the place is ours. Pair with `leave()`."""
        if self.slots is None or self.running < self.slots and not self._waiting:
            self.running += 1
            return
        entry = (asyncio.get_running_loop().create_future(), on_wait)
        self._waiting.append(entry)
        self._tell()
        try:
            await entry[0]
        except asyncio.CancelledError:
            if entry[0].done() and not entry[0].cancelled():
                self.leave()   # the place came with the cancellation: pass it on
            else:
                self._waiting.remove(entry)
                self._tell()
            raise
        if on_wait is not None:
            on_wait(None)

    def leave(self) -> None:
        self.running -= 1
        while self._waiting and (self.slots is None or self.running < self.slots):
            future, _ = self._waiting.popleft()
            if not future.done():
                self.running += 1
                future.set_result(None)
        self._tell()

    def _tell(self) -> None:
        for place, (future, on_wait) in enumerate(self._waiting):
            if on_wait is not None and not future.done():
                on_wait(self.running + place)


def slots_of(endpoint: Endpoint, base_url: str) -> int | None:
    """How many requests the server at `base_url` runs at once (see the module docstring);
    asked once per process and endpoint. Blocking: call it in a thread."""
    if endpoint.concurrency:
        return endpoint.concurrency
    with _lock:
        if endpoint.identity in _learned:
            return _learned[endpoint.identity]
    slots = _ask(base_url, endpoint.api_key)
    with _lock:
        _learned[endpoint.identity] = slots
    return slots


def forget() -> None:
    """Ask the servers again (tests; a server restarted with other slots)."""
    with _lock:
        _learned.clear()


def _ask(base_url: str, api_key: str) -> int | None:
    parts = urlsplit(base_url)
    origin = f"{parts.scheme}://{parts.netloc}"
    props = _get_json(f"{origin}/props", api_key)
    total = props.get("total_slots") if isinstance(props, dict) else None
    if isinstance(total, int) and not isinstance(total, bool) and 1 <= total <= 4096:
        return total
    if isinstance(_get_json(f"{origin}/api/version", api_key), dict):   # Ollama
        said = os.environ.get("OLLAMA_NUM_PARALLEL", "").strip()
        return int(said) if said.isdigit() and int(said) >= 1 else 1
    version = _get_json(f"{origin}/version", api_key)
    if isinstance(version, dict) and "version" in version:   # vLLM
        return None
    return 1


def _get_json(url: str, api_key: str) -> Any:
    request = urllib.request.Request(url)
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(request, timeout=_PROBE_S) as response:
            return json.loads(response.read(1_000_000))
    except (OSError, ValueError):
        return None
