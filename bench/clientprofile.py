"""Where flowmagic's client time goes: one run under cProfile, its CPU split by layer.

The run is flowmagic alone on one DAG against the benchmark's loopback server (in its own
process, so none of its time is counted). Every function's own time (cProfile's tottime)
(CPU time, so waiting for the server counts nothing) is put in the bucket of the file it
is defined in; the buckets are the layers a request passes through. Only the run call
(`Flow.arun()`) is profiled, as only it is inside the makespan. cProfile slows Python code down, so the shares matter, not the seconds.
"""

from __future__ import annotations

import asyncio
import cProfile
import pstats
import time

import runners as R
from dags import family

__all__ = ["client_profile", "node_runner_profile"]

# (bucket, path fragments), first match wins.
_BUCKETS = [
    ("HTTP: flowmagic's transport and HTTP/1.1 client (llm/transport.py, llm/http1.py, httptools)",
     ("flowmagic/llm/http1", "flowmagic/llm/transport", "/httptools/")),
    ("HTTP: aiohttp (proxied endpoints; the SDK's own calls)", ("/aiohttp/", "/multidict/", "/yarl/",
                                                                "/aiohappyeyeballs/", "/propcache/")),
    ("HTTP: openai SDK and httpx (clients, errors)", ("/openai/", "/httpx", "/httpcore", "/anyio/",
                                                       "/pydantic")),
    # the json package and its C module (_json.*), not functions named *_json (post_json)
    ("JSON encode/decode", ("/json/", "_json.")),
    ("flowmagic: LLM door (cache key, call log rows, reply)", ("flowmagic/llm/",)),
    ("flowmagic: store (SQLite: call log, cache, node states)", ("flowmagic/store", "sqlite3")),
    ("flowmagic: node runner and prompt", ("flowmagic/engine/node_runner",)),
    ("flowmagic: executor, Flow events, graph", ("flowmagic/",)),
    ("asyncio event loop and sockets", ("/asyncio/", "select", "socket", "_ssl", "ssl.py")),
    ("Python's dataclasses, copy, re (flowmagic's callers)", ("/dataclasses.py", "/copy.py", "/re/")),
]


def _bucket(filename: str, name: str) -> str:
    where = f"{filename}:{name}"
    for bucket, parts in _BUCKETS:
        if any(p in where for p in parts):
            return bucket
    return "other (interpreter built-ins, harness)"


def _split(profiler) -> tuple[float, list, list]:
    """(profiled CPU seconds, [(layer, seconds, share)] heaviest first, the 8 heaviest functions)."""
    stats = pstats.Stats(profiler).stats
    buckets: dict[str, float] = {}
    funcs = []
    for (filename, line, name), (_, calls, tottime, _, callers) in stats.items():
        funcs.append((tottime, calls, f"{filename.rsplit('site-packages/', 1)[-1]}:{line}({name})"))
        if filename == "~" and callers:   # a built-in (isinstance, dict.get, ...): its callers' layer
            for (c_file, _, c_name), edge in callers.items():
                bucket = _bucket(c_file, c_name) if c_file != "~" else _bucket(filename, name)
                buckets[bucket] = buckets.get(bucket, 0.0) + edge[2]
            continue
        buckets[_bucket(filename, name)] = buckets.get(_bucket(filename, name), 0.0) + tottime
    total = sum(buckets.values()) or 1.0
    return (total, sorted(((b, t, t / total) for b, t in buckets.items()), key=lambda x: -x[1]),
            sorted(funcs, reverse=True)[:8])


def client_profile(fam: str, n: int, max_tokens: int = 64) -> dict:
    """cProfile of one flowmagic run of `fam`-`n`; CPU seconds per bucket and the top functions."""
    dag = family(fam, n)
    task = f"Benchmark workflow {fam}-{n}: do every step in order."
    # CPU time, not wall time: waiting in epoll for the server is not client time.
    profiler = cProfile.Profile(time.process_time)
    result = asyncio.run(R.run_flowmagic(dag, task, max_tokens, profiler=profiler))
    total, buckets, top = _split(profiler)
    return {"case": f"{fam}-{n}", "nodes": len(result.spans), "wall_s": result.makespan,
            "profiled_s": total, "buckets": buckets, "top": top}


def node_runner_profile(n: int) -> dict:
    """cProfile of `Flow.arun()` on a layered DAG of n nodes through the node runner and the
    LLM door with the HTTP call answered in-process (`overhead.node_runner_overhead`'s run):
    where the per-node overhead goes, by layer."""
    import overhead

    overhead.stub_endpoint()
    profiler = cProfile.Profile(time.process_time)
    _, run_s, _, calls = overhead.node_runner_once(family("layered", n), profiler=profiler)
    total, buckets, top = _split(profiler)
    return {"case": f"layered-{n}, HTTP answered in-process", "nodes": n, "calls": calls,
            "wall_s": run_s, "profiled_s": total, "buckets": buckets, "top": top}
