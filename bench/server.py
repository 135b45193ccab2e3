"""The benchmark's loopback server: flowmagic.testing.loopback with room for 500 connections at once.

`python bench/server.py --latency 0.05:0.5 --seed 1` takes the options of
`python -m flowmagic.testing.loopback`; `spawn(...)` starts it as a child process of the harness.
"""

from __future__ import annotations

import json
import sys

from flowmagic.testing import loopback

__all__ = ["spawn"]

# A fan-out of 500 nodes opens 500 connections at once. With the module's backlog of 128
# (plenty for tests) the kernel can drop handshakes while the accept loop catches up; the
# client then resends after 1 s or gives up with a read error, which would measure the
# kernel's retransmit timer rather than a scheduler.
BACKLOG = 4096


def spawn(*, latency: tuple[float, float], seed: int, faults: dict | None = None):
    """A `SpawnedLoopback` running this script (same handle as `LoopbackServer.spawn`)."""
    argv = [sys.executable, __file__, "--latency", f"{latency[0]!r}:{latency[1]!r}",
            "--seed", str(seed), "--faults", json.dumps(faults or {}), "--exit-on-stdin-eof",
            # the model every runner names (runners.MODEL): configure() now checks that the
            # endpoint serves it
            "--model", "m"]
    return loopback.SpawnedLoopback(argv, 20.0)


if __name__ == "__main__":
    loopback._HTTPServer.request_queue_size = BACKLOG
    sys.exit(loopback.main())
