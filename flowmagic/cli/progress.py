"""Progress lines on stderr while a command works: one per node event or notebook cell,
and a "still working" line when nothing happened for a while."""

from __future__ import annotations

import sys
import threading
import time

from .._internal.text import one_line

__all__ = ["Progress"]

_QUIET_S = 15.0   # a "still working" line after this long without any other line


class Progress:
    """Lines on stderr: `[  12.3s] message`, plus a heartbeat while nothing happens."""

    def __init__(self, stream=None, quiet_s: float = _QUIET_S):
        self.stream = stream or sys.stderr
        self.t0 = time.perf_counter()
        self.quiet_s = quiet_s
        self.doing = ""
        self.running: dict[str, str] = {}
        self.waiting: dict[str, int] = {}   # node -> requests ahead of its model call
        self._last = self.t0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def say(self, message: str) -> None:
        now = time.perf_counter()
        self._last = now
        print(f"[{now - self.t0:7.1f}s] {message}", file=self.stream, flush=True)

    def __enter__(self) -> "Progress":
        self._thread = threading.Thread(target=self._beat, name="flowmagic-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _beat(self) -> None:
        while not self._stop.wait(1.0):
            if self.doing and time.perf_counter() - self._last >= self.quiet_s:
                busy = ", ".join(self._busy(node) for node in self.running) or (
                    "the final write-up" if self.doing == "running" else "")
                busy = f": {busy}" if busy else ""
                self.say(f"… still {self.doing}{busy}")

    def _busy(self, node: str) -> str:
        ahead = self.waiting.get(node)
        return node if ahead is None else f"{node} (waiting for the model, {ahead} ahead)"

    def event(self, e: dict) -> None:
        """A Flow event, as one line."""
        kind, node = e.get("kind"), e.get("node")
        if kind == "waiting":   # a line when a node starts waiting; the heartbeat counts down
            ahead = e.get("ahead")
            if ahead is None:
                self.waiting.pop(node, None)
                return
            first = node not in self.waiting
            self.waiting[node] = ahead
            if first:
                self.say(f"⧗ {node} waiting for the model ({ahead} ahead)")
        elif kind == "started":
            self.running[node] = e.get("clone") or e.get("agent") or ""
            self.say(f"▶ {node} ({self.running[node]})")
        elif kind == "finished":
            self.running.pop(node, None)
            self.waiting.pop(node, None)
            self.say(f"✓ {node}" + (" (output masked: fault injection)" if e.get("masked") else ""))
        elif kind == "failed":
            self.running.pop(node, None)
            self.waiting.pop(node, None)
            self.say(f"✗ {node}: {one_line(e.get('error') or '', 100)}")
        elif kind == "stopped":
            self.running.pop(node, None)
        elif kind == "updated":
            self.say("↻ the workflow was updated" + (" (no change)" if e.get("no_change") else ""))
        elif kind == "update_capped":
            self.say(f"↻ {e.get('message')}")
        elif kind == "budget":
            self.say(f"$ {e.get('message')}")
