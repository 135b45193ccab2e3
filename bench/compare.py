"""Makespans side by side: flowmagic, level-synchronous, LangGraph, a bare openai SDK loop
and a raw-socket floor on the same DAGs.

For each case the runners take turns (the order rotates from case to case so
that a noisy neighbour does not always hit the same runner), each against the same
spawned loopback server, whose counters are reset before every run. After each run
the latency the server applied to every node is read back; the case is valid only
when every node got the same latency under every runner. The headline bound is the
critical path of those server latencies: no client can beat it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from dataclasses import dataclass, field
from statistics import mean

import runners as R
from dags import family, levels_of

__all__ = ["Case", "CaseResult", "run_case", "warm_up", "summarise", "fault_case",
           "explain_gap"]

RUNNERS = ("flowmagic", "level-sync", "langgraph", "sdk-loop", "floor")


@dataclass
class Case:
    family: str
    n: int
    seed: int = 0

    @property
    def name(self) -> str:
        return f"{self.family}-{self.n}" + (f"-s{self.seed}" if self.family == "layered" else "")


@dataclass
class CaseResult:
    case: Case
    edges: int
    depth: int
    results: dict[str, R.RunResult] = field(default_factory=dict)
    server_bound: float = 0.0           # critical path over the server's own latencies
    same_latency: bool = True
    latency_spread: float = 0.0         # largest difference for one node between runners
    barrier_starts: float = 0.0         # share of LangGraph nodes that started only after
                                        # the whole previous level had finished
    levels_ideal: float = 0.0           # sum over levels of the slowest latency / server bound:
                                        # what waiting for levels costs on this DAG, any runner

    def ratio(self, runner: str) -> float:
        return self.results[runner].makespan / self.results["flowmagic"].makespan

    def vs_server(self, runner: str) -> float:
        """A runner's makespan / the server-latency bound (1.0 = nothing added by the client)."""
        return self.results[runner].makespan / self.server_bound

    @property
    def fm(self) -> R.RunResult:
        return self.results["flowmagic"]


def _run_one(runner: str, dag: dict, task: str, max_tokens: int, base_url: str) -> R.RunResult:
    if runner == "flowmagic":
        return asyncio.run(R.run_flowmagic(dag, task, max_tokens))
    run = {"level-sync": R.run_levels, "langgraph": R.run_langgraph,
           "sdk-loop": R.run_sdk_loop, "floor": R.run_floor}[runner]
    return asyncio.run(run(dag, task, max_tokens, base_url))


def _barrier_share(dag: dict, spans: dict) -> float:
    """How many nodes waited for their whole previous level (1.0 = strictly level by level)."""
    levels = levels_of(dag)
    waited = total = 0
    for before, level in zip(levels, levels[1:]):
        last_end = max(spans[x][1] for x in before)
        for x in level:
            total += 1
            waited += spans[x][0] >= last_end - 1e-4
    return waited / total if total else 1.0


def run_case(case: Case, server, index: int, *, max_tokens: int = 64,
             log=print) -> CaseResult:
    dag = family(case.family, case.n, case.seed)
    task = f"Benchmark workflow {case.name}: do every step in order."
    out = CaseResult(case, len(dag["edges"]), len(levels_of(dag)))
    k = index % len(RUNNERS)
    order = RUNNERS[k:] + RUNNERS[:k]
    seen: dict[str, dict[str, float]] = {}
    for runner in order:
        server.reset()
        # Each run starts with the collector's counts at zero: a full collection comes when
        # the objects promoted since the last one pass a quarter of the oldest generation,
        # so without this a runner would pay for the objects its predecessor left promoted.
        gc.collect()
        cpu = time.process_time()
        with _gc_time() as collected:
            res = _run_one(runner, dag, task, max_tokens, server.base_url)
        # This process's CPU (the server is another process): what the runner itself costs.
        res.extra["cpu_s"] = time.process_time() - cpu
        res.extra["gc_s"], res.extra["gc_full"] = collected["s"], collected["full"]
        seen[runner] = R.latencies(server)
        _client_time(res, seen[runner], R.arrivals(server))
        res.extra["requests"] = sum(1 for r in server.stats()["requests"]
                                    if r["path"].endswith("/chat/completions"))
        out.results[runner] = res
        log(f"    {case.name:18s} {runner:10s} makespan {res.makespan:7.3f} s"
            f"  bound {res.bound:7.3f} s  ({res.state})")
    ids = {x["id"] for x in dag["nodes"]}
    base = seen["flowmagic"]
    out.same_latency = all(set(lat) == ids for lat in seen.values()) and all(
        lat == base for lat in seen.values())
    out.latency_spread = max((abs(lat.get(i, -1) - base.get(i, -1)) for lat in seen.values()
                              for i in ids), default=0.0)
    out.server_bound = R.critical_path(dag, base)
    if out.server_bound > 0 and set(base) == ids:
        out.levels_ideal = sum(max(base[x] for x in level) for level in levels_of(dag)) / out.server_bound
    out.barrier_starts = _barrier_share(dag, out.results["langgraph"].spans)
    return out


@contextlib.contextmanager
def _gc_time():
    """Seconds this process spent in the cyclic garbage collector meanwhile, and how many
    full (oldest-generation) collections it ran: a run that keeps many objects alive at
    once (500 requests in flight) makes the collector walk the whole heap."""
    out = {"s": 0.0, "full": 0, "t0": 0.0}

    def watch(phase: str, info: dict) -> None:
        if phase == "start":
            out["t0"] = time.perf_counter()
        else:
            out["s"] += time.perf_counter() - out["t0"]
            out["full"] += info.get("generation") == 2

    gc.callbacks.append(watch)
    try:
        yield out
    finally:
        gc.callbacks.remove(watch)


def _client_time(res: R.RunResult, latency: dict[str, float], arrived: list[float]) -> None:
    """What the client added: per call, its recorded duration minus the server's latency
    (median), and the head, from the run call to the first request reaching the server."""
    added = sorted(1000 * (end - start - latency[n]) for n, (start, end) in res.spans.items()
                   if n in latency)
    res.extra["client_ms"] = added[len(added) // 2] if added else None
    t0 = res.extra.get("t0")
    res.extra["head_ms"] = 1000 * (arrived[0] - t0) if arrived and t0 else None


def explain_gap(dag: dict, res: R.RunResult) -> dict:
    """Where the time above the bound went, along the chain that finished last.

    Walking back from the last node to finish, through the parent each node waited for
    (the one that finished last), the makespan is exactly: head (run call to first start)
    + the chain's durations + the gaps (a parent finished, its child had not started)
    + tail (last end to the run call's return). The chain's durations are at most the
    bound, so the excess over the bound is at most head + gaps + tail.
    """
    from dags import parents_of

    parents, spans = parents_of(dag), res.spans
    node = max(spans, key=lambda k: spans[k][1])
    chain, gaps = [node], 0.0
    while parents[node]:
        parent = max(parents[node], key=lambda p: spans[p][1])
        gaps += max(0.0, spans[node][0] - spans[parent][1])
        chain.append(parent)
        node = parent
    t0 = res.extra.get("t0", spans[node][0])
    head = spans[node][0] - t0
    last_end = max(end for _, end in spans.values())
    tail = (t0 + res.makespan) - last_end
    work = sum(spans[k][1] - spans[k][0] for k in chain)
    out = {"excess": res.makespan - res.bound, "head": head, "gaps": gaps, "tail": tail,
           "chain_nodes": len(chain), "chain_work": work,
           "per_gap_ms": 1000 * gaps / max(1, len(chain) - 1)}
    last_told, run_told = res.extra.get("last_told"), res.extra.get("run_told")
    if last_told and run_told:
        # flowmagic only: the tail split at the moments its events reached subscribers.
        out["tail_parts"] = {"last node's state persisted": last_told - last_end,
                             "then the run's final status persisted": run_told - last_told,
                             "then back from arun()": (t0 + res.makespan) - run_told}
    return out


def warm_up(server, log=print) -> None:
    """Imports, first connections and first compiles happen here, not in a measured run."""
    case = Case("layered", 8, 99)
    for i in range(2):
        run_case(case, server, i, log=lambda *_: None)
    log("    warmed up (imports, first HTTP connections, first LangGraph compile)")


def summarise(rows: list[CaseResult]) -> dict:
    layered = [r for r in rows if r.case.family == "layered"]
    return {
        "worst_server_ratio": max(r.vs_server("flowmagic") for r in rows),
        "worst_server_case": max(rows, key=lambda r: r.vs_server("flowmagic")).case.name,
        "worst_bound_ratio": max(r.fm.makespan / r.fm.bound for r in rows),
        "worst_bound_case": max(rows, key=lambda r: r.fm.makespan / r.fm.bound).case.name,
        "layered_levels": mean(r.ratio("level-sync") for r in layered) if layered else None,
        "layered_langgraph": mean(r.ratio("langgraph") for r in layered) if layered else None,
        "all_same_latency": all(r.same_latency for r in rows),
        "all_done": all(res.state == "done" for r in rows for res in r.results.values()),
    }


def fault_case(n: int, faults: dict, *, seed: int, latency: tuple, max_tokens: int = 64,
               log=print) -> dict:
    """flowmagic alone on a layered DAG against a server that fails some requests."""
    import flowmagic
    import server as bench_server

    dag = family("layered", n, 0)
    task = f"Benchmark workflow layered-{n} with faults."
    with bench_server.spawn(latency=latency, seed=seed, faults=faults) as server:
        flowmagic.configure(base_url=server.base_url, model="m", self_hosted=False)
        res = asyncio.run(R.run_flowmagic(dag, task, max_tokens))
        stats = server.stats()
        requests = sum(1 for r in stats["requests"] if r["path"].endswith("/chat/completions"))
    log(f"    layered-{n} with faults {faults}: {res.state}, makespan {res.makespan:.3f} s, "
        f"bound {res.bound:.3f} s, {requests} requests for {n} nodes")
    return {"n": n, "faults": faults, "state": res.state, "makespan": res.makespan,
            "bound": res.bound, "requests": requests, "injected": stats["faults"],
            "done": res.extra["done"]}
