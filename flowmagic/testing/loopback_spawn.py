"""A handle on a loopback server running in a child process.

`LoopbackServer.spawn(...)` (in `loopback`) builds the command line and returns this handle;
a server in its own process does not share the GIL with the code being measured. The child
exits when its stdin closes, so it never outlives the process that started it.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import subprocess
import tempfile
import threading
import urllib.request
from typing import Any

__all__ = ["SpawnedLoopback"]


class SpawnedLoopback:
    """Handle on a loopback server in a child process; the child exits when this process does."""

    def __init__(self, argv: list[str], startup_timeout: float) -> None:
        env = dict(os.environ)
        # The child must import this very package even when it is not installed.
        pkg_parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_parent, env.get("PYTHONPATH")) if p)
        self._stderr = tempfile.TemporaryFile()  # a file, not a pipe: nobody has to drain it
        self._proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=self._stderr, env=env, text=True)
        atexit.register(self.stop)
        lines: queue.Queue[str] = queue.Queue()
        reader = threading.Thread(target=lambda: lines.put(self._proc.stdout.readline()),
                                  name="loopback-spawn-reader", daemon=True)
        reader.start()
        try:
            line = lines.get(timeout=startup_timeout).strip()
        except queue.Empty:
            line = ""
        if not line.startswith("http://"):
            self._proc.kill()
            self._proc.wait(timeout=5)
            reader.join(timeout=5)
            self._stderr.seek(0)
            tail = self._stderr.read().decode("utf-8", "replace")[-2000:] or "(no stderr)"
            self.stop()
            raise RuntimeError(f"the loopback child did not start: {tail}")
        reader.join(timeout=5)
        self.base_url = line

    def _call(self, path: str, method: str = "GET") -> dict:
        url = self.base_url.removesuffix("/v1") + path
        request = urllib.request.Request(url, data=b"{}" if method == "POST" else None, method=method)
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def stats(self, bodies: bool = False) -> dict:
        return self._call("/_stats?bodies=1" if bodies else "/_stats")

    def reset(self) -> None:
        self._call("/_reset", "POST")

    def stop(self) -> None:
        """Close the child's stdin (it exits cleanly), then terminate or kill it if it lingers."""
        proc = self._proc
        if proc.poll() is None:
            proc.stdin.close()
            for ender in (None, proc.terminate, proc.kill):
                if ender is not None:
                    ender()
                try:
                    proc.wait(timeout=5)
                    break
                except subprocess.TimeoutExpired:
                    continue
        for stream in (proc.stdin, proc.stdout):
            stream.close()
        self._stderr.close()
        atexit.unregister(self.stop)

    def __enter__(self) -> SpawnedLoopback:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
