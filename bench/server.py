"""The benchmark's loopback server: flowmagic.testing.loopback on its asyncio engine.

`python bench/server.py --latency 0.05:0.5 --seed 1` takes the options of
`python -m flowmagic.testing.loopback`; `spawn(...)` starts it as a child process of the harness.

The asyncio engine reads every connection from one event loop (a fan-out of 500 opens 500
connections at once, with a listen backlog of 4096), counts a request's latency from its
arrival and sends the reply built meanwhile in one write when it is due, so the server adds
as little as it can to what the bound counts. With the thread-per-connection engine a
fan-out's requests were read late (the threads take turns on one interpreter lock): on
fan-200 the raw-socket floor read 1.11-1.16 of the bound and flowmagic 1.15-1.26, against
1.06-1.13 and 1.08-1.11 on this engine (three runs each, load about 1).
"""

from __future__ import annotations

import json
import sys

from flowmagic.testing import loopback

__all__ = ["spawn"]


def spawn(*, latency: tuple[float, float], seed: int, faults: dict | None = None):
    """A `SpawnedLoopback` running this script (same handle as `LoopbackServer.spawn`)."""
    argv = [sys.executable, __file__, "--latency", f"{latency[0]!r}:{latency[1]!r}",
            "--seed", str(seed), "--faults", json.dumps(faults or {}), "--exit-on-stdin-eof",
            # the model every runner names (runners.MODEL): configure() now checks that the
            # endpoint serves it
            "--model", "m", "--engine", "asyncio"]
    return loopback.SpawnedLoopback(argv, 20.0)


if __name__ == "__main__":
    sys.exit(loopback.main())
