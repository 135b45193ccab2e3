"""Scheduler overhead per node with a zero-latency model, and peak memory.

flowmagic: a Flow of the DAG (built with `Flow.from_dict`, which writes the run to
SQLite), then the executor the Flow runs with (`Flow.executor`), with the Flow's own hooks
(so every node state change is persisted by `Flow.emit`) and a work function that returns
at once instead of calling a model. LangGraph: the same DAG as a StateGraph whose nodes
return at once, compile included (timed apart from the run, with a collection between
them: see `_collected`). Each figure is the best of a few repeats: on a
shared 2-core machine the minimum is the least disturbed run.

Run as a script (`python bench/overhead.py memory N [langgraph] [untraced]`), it measures the
peak memory of one N-node workflow in a fresh process and prints JSON, so that the
peak resident size belongs to that workflow alone (and the imports before it).
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from dags import family  # noqa: E402

__all__ = ["flowmagic_overhead", "node_runner_overhead", "node_runner_once", "stub_endpoint", "langgraph_overhead", "executor_only",
           "memory", "memory_in_child"]

# A fixed chat completion, as the server would send it (the zero-latency model's answer).
_REPLY = {"id": "chatcmpl-0", "object": "chat.completion", "created": 0, "model": "m",
          "choices": [{"index": 0, "finish_reason": "stop",
                       "message": {"role": "assistant", "content": "ok"}}],
          "usage": {"prompt_tokens": 50, "completion_tokens": 1, "total_tokens": 51}}


async def _noop(node_id: str):
    from flowmagic.engine.scheduler import Outcome
    # Not "": the Flow's default update strategy treats an empty output as a failed
    # node and would call the updater (a model) after it.
    return Outcome(ok=True, output="ok")


def _build_flow(dag: dict, home: Path):
    from flowmagic.flow import Flow
    from flowmagic.llm import LLM
    from flowmagic.store import Store

    store = Store(home / "flowmagic.db")
    return Flow.from_dict(dag, task="Benchmark workflow: overhead.", llm=LLM(store),
                          store=store, consolidate=False, concurrency=1_000_000)


def _executor(flow):
    # The executor a run of the flow uses, with its hooks (so store writes are included),
    # and the no-op in place of the node runner.
    return flow.executor(_noop)


def _collected(t0: float) -> tuple[float, float]:
    """After a build that began at `t0`: (the build's seconds, the run's start), with a
    collection between them, on neither clock. The run starts with the collector's counts
    at zero, as every run of the bench does (compare.py): a full
    collection comes when the objects promoted since the last one pass a quarter of the
    oldest generation, and the build's own (the graph, the nodes, a compiled LangGraph) would
    otherwise count toward the run's. What the run promotes itself still counts."""
    build = time.perf_counter() - t0
    gc.collect()
    return build, time.perf_counter()


def _collections() -> list[int]:
    """The collections so far, per generation (the run's are the difference)."""
    return [g["collections"] for g in gc.get_stats()]


def _flowmagic_once(dag: dict) -> tuple[float, float, str]:
    with tempfile.TemporaryDirectory(prefix="fm-bench-") as tmp:
        gc.collect()
        t0 = time.perf_counter()
        flow = _build_flow(dag, Path(tmp))
        build, t1 = _collected(t0)
        state = asyncio.run(_executor(flow).run())
        t2 = time.perf_counter()
        flow.store.close()
    return build, t2 - t1, state


def flowmagic_overhead(n: int, repeats: int) -> dict:
    """Best-of-`repeats` seconds to build the Flow and to run it, and ms per node."""
    dag = family("layered", n)
    runs = [_flowmagic_once(dag) for _ in range(repeats)]
    build, run = min(r[0] for r in runs), min(r[1] for r in runs)
    return {"n": n, "build_s": build, "run_s": run, "states": sorted({r[2] for r in runs}),
            "run_ms": 1000 * run / n, "total_ms": 1000 * (build + run) / n, "repeats": repeats}


def _no_network():
    """The LLM door's transport with the HTTP call answered at once; the SDK client is still
    built per loop, and everything above the call (prompt, cache, call log, usage) is real."""
    from flowmagic.llm.transport import Transport

    class NoNetwork(Transport):
        async def post_json(self, client, path: str, body: dict, *, whole=None):
            return _REPLY

    return NoNetwork()


def stub_endpoint() -> None:
    """An endpoint for the runs with the HTTP call answered in-process (it is never reached).
    Like every loopback of the benchmark, it stands for a hosted endpoint."""
    import flowmagic

    flowmagic.configure(base_url="http://127.0.0.1:9/v1", model="m", self_hosted=False)


def node_runner_once(dag: dict, profiler=None,
                     clocks: dict | None = None) -> tuple[float, float, str, int]:
    """(build s, run s, run state, calls logged) of one `Flow.arun()` with the HTTP call
    answered in-process; `profiler` (a cProfile.Profile) is enabled around the run alone.
    `clocks` gets the run's CPU seconds (`cpu_s`: this process's, which a busy machine does
    not inflate as it does the wall clock) and the collections the run triggered per
    generation (`gc`)."""
    from flowmagic.flow import Flow
    from flowmagic.llm import LLM
    from flowmagic.store import Store

    with tempfile.TemporaryDirectory(prefix="fm-bench-") as tmp:
        gc.collect()
        t0 = time.perf_counter()
        store = Store(Path(tmp) / "flowmagic.db")
        llm = LLM(store, concurrency=1_000_000, transport=_no_network())
        flow = Flow.from_dict(dag, task="Benchmark workflow: overhead.", llm=llm, store=store,
                              consolidate=False, concurrency=1_000_000, max_tokens=64)
        build, t1 = _collected(t0)

        async def go():
            try:
                return await flow.arun()
            finally:
                await llm.aclose()
        if profiler is not None:
            profiler.enable()
        gc0, c1 = _collections(), time.process_time()
        state = asyncio.run(go())
        c2 = time.process_time()
        if profiler is not None:
            profiler.disable()
        t2 = time.perf_counter()
        if clocks is not None:
            clocks.update(cpu_s=c2 - c1, gc=[b - a for a, b in zip(gc0, _collections())])
        calls = store.count_calls(cached=False)
        store.close()
    return build, t2 - t1, state, calls


def node_runner_overhead(n: int, repeats: int) -> dict:
    """`Flow.arun()` on n nodes with every node's model call answered at once: the executor,
    the NodeRunner (prompt, context), the LLM door (cache look-up, call log, usage) and the
    store, with only the HTTP call replaced. Best of `repeats`, ms per node; with the
    least CPU time of a repeat per node (`run_cpu_ms`) and that run's collections per
    generation: whether a larger graph costs more per node in CPU or in wall time alone."""
    stub_endpoint()
    dag = family("layered", n)
    clocks = [{} for _ in range(repeats)]
    runs = [node_runner_once(dag, clocks=c) for c in clocks]
    build, run = min(r[0] for r in runs), min(r[1] for r in runs)
    cpu = min(clocks, key=lambda c: c["cpu_s"])
    return {"n": n, "build_s": build, "run_s": run, "states": sorted({r[2] for r in runs}),
            "calls": min(r[3] for r in runs), "run_ms": 1000 * run / n,
            "total_ms": 1000 * (build + run) / n, "repeats": repeats,
            "run_cpu_ms": 1000 * cpu["cpu_s"] / n, "gc_collections": cpu["gc"]}


def executor_only(n: int, repeats: int) -> dict:
    """The executor with no hooks at all: the floor that store writes add to."""
    from flowmagic.engine.scheduler import Executor

    dag = family("layered", n)
    best = float("inf")
    with tempfile.TemporaryDirectory(prefix="fm-bench-") as tmp:
        for _ in range(repeats):
            flow = _build_flow(dag, Path(tmp) / str(_))
            gc.collect()
            t0 = time.perf_counter()
            asyncio.run(Executor(flow.workflow, _noop, concurrency=None).run())
            best = min(best, time.perf_counter() - t0)
            flow.store.close()
    return {"n": n, "run_s": best, "run_ms": 1000 * best / n}


def _langgraph_once(dag: dict) -> tuple[float, float, int]:
    import runners as R

    def node_fn(nid: str):
        async def node(state: dict) -> None:
            return None
        return node

    gc.collect()
    t0 = time.perf_counter()
    app = R.build_langgraph(dag, node_fn)
    build, t1 = _collected(t0)
    ran = []

    async def go():
        # Count what ran, to be sure a fast time is not a graph that stopped early.
        async for chunk in app.astream({"out": {}}, R.langgraph_config(dag), stream_mode="updates"):
            ran.extend(chunk)
    asyncio.run(go())
    t2 = time.perf_counter()
    return build, t2 - t1, len(ran)


def langgraph_overhead(n: int, repeats: int) -> dict:
    dag = family("layered", n)
    runs = [_langgraph_once(dag) for _ in range(repeats)]
    build, run = min(r[0] for r in runs), min(r[1] for r in runs)
    return {"n": n, "compile_s": build, "run_s": run, "ran": min(r[2] for r in runs),
            "run_ms": 1000 * run / n, "total_ms": 1000 * (build + run) / n, "repeats": repeats}


def _rss_mb() -> float:
    """Peak resident memory of this process so far, in MiB.

    VmHWM belongs to this process's own address space; ru_maxrss would not do in a child
    started by a big parent, because Linux carries the parent's peak across fork and exec.
    """
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    scale = 1 if sys.platform == "darwin" else 1024   # ru_maxrss: bytes on macOS, KiB on Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**20


def memory(n: int, langgraph: bool = False, traced: bool = True) -> dict:
    """Peak memory while building and running one n-node workflow with no-op work.

    tracemalloc counts Python allocations exactly but slows the run and adds its own
    memory to the process's, so the peak RSS is also measured in a run without it.
    """
    import flowmagic.engine.scheduler  # noqa: F401 - imports are not the workflow's memory
    import flowmagic.flow  # noqa: F401
    if langgraph:
        import langgraph.graph  # noqa: F401
        import runners  # noqa: F401
    dag = family("layered", n)
    base_rss = _rss_mb()
    if traced:
        tracemalloc.start()
    t0 = time.perf_counter()
    if langgraph:
        _langgraph_once(dag)
    else:
        _flowmagic_once(dag)
    seconds = time.perf_counter() - t0
    peak = None
    if traced:
        peak = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
    return {"n": n, "runner": "langgraph" if langgraph else "flowmagic", "traced": traced,
            "tracemalloc_peak_mb": peak, "peak_rss_mb": _rss_mb(),
            "rss_before_mb": base_rss, "seconds": seconds}


def memory_in_child(n: int, langgraph: bool = False, traced: bool = True,
                    timeout: float = 300) -> dict:
    argv = [sys.executable, os.path.abspath(__file__), "memory", str(n)]
    argv += ["langgraph"] if langgraph else []
    argv += [] if traced else ["untraced"]
    env = dict(os.environ, FLOWMAGIC_HOME=tempfile.mkdtemp(prefix="fm-bench-mem-"))
    out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"memory child failed: {out.stderr[-1500:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "memory":
        flags = set(sys.argv[3:])
        print(json.dumps(memory(int(sys.argv[2]), langgraph="langgraph" in flags,
                                traced="untraced" not in flags)))
    else:
        sys.exit("usage: python bench/overhead.py memory N [langgraph] [untraced]")
