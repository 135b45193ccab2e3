"""The loopback server as a local model server: slots, and the work spent on abandoned requests.

A local server (llama.cpp, llama-cpp-python, Ollama) runs a fixed number of requests at once,
its slots; the others wait in its queue, unseen by the client. `Slots` gives the loopback
that shape: a chat request holds the server from its arrival (`in_flight`, whose peak is
`max_in_flight`) and its latency starts only once it has a slot. It reports its slots on
GET /props as llama.cpp's server does (`total_slots`).

Work on an abandoned request is waste: nobody reads its answer. The server looks for a
client that went away before each piece of the answer it sends (a stream's events, the whole
body), as a server that stops generating when its client leaves does; the seconds such a
request held a slot are counted as abandoned work (`stats()["abandoned_s"]`). Until it
writes, a non-streamed request cannot notice, as llama-cpp-python's server does not: it
generates to the end.
"""

from __future__ import annotations

import socket
import threading
from typing import Any

from .._internal.waiting import readable

__all__ = ["Slots", "peer_closed"]


class Slots:
    """At most `count` chat requests served at a time (None: no limit)."""

    def __init__(self, count: int | None, stopping: threading.Event) -> None:
        if count is not None and (not isinstance(count, int) or count < 1):
            raise ValueError(f"slots must be a whole number of at least 1, not {count!r}")
        self.count = count
        self._free = threading.Semaphore(count) if count else None
        self._stopping = stopping

    def take(self) -> bool:
        """Wait for a free slot; False when the server stops meanwhile."""
        if self._free is None:
            return True
        while not self._free.acquire(timeout=0.05):
            if self._stopping.is_set():
                return False
        return True

    def give_back(self) -> None:
        if self._free is not None:
            self._free.release()


def peer_closed(h: Any) -> bool:
    """Whether the client of a request (a thread handler's connection) has gone away: its
    socket reads as closed. The asyncio engine's exchanges have no socket here (False)."""
    sock = getattr(h, "connection", None)
    if not isinstance(sock, socket.socket):
        return False
    try:
        if not readable(sock.fileno(), 0):
            return False
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except (OSError, ValueError):
        return True

