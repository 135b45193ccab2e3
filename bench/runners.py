"""Five ways to run one DAG of model calls against the same loopback server.

- flowmagic: `Flow.from_dict(...).arun()` (event-driven executor, SQLite store, LLM door);
- level-synchronous: run a longest-path level, wait for all of it, then the next;
- LangGraph: one StateGraph node per DAG node, `add_edge([parents...], child)`;
- bare SDK loop: a greedy loop (a node's request goes out the moment its last parent's
  reply is in) over `AsyncOpenAI.chat.completions.create`, nothing else: what a user
  would write by hand with the openai SDK;
- floor: the same greedy loop over raw asyncio sockets (HTTP/1.1 by hand, kept-alive
  connections in a list): no SDK, no HTTP library, so what is left is this machine.

All of them send the same request body for a node: the messages come from
`flowmagic.engine.node_runner.node_messages` on a Flow of the same DAG whose parents hold the
replies, with the same model, seed and max_tokens. The server's latency is a hash of
the body, so a node waits the same time under every runner; `latencies()` reads back
what the server applied so the harness can check that.
"""

from __future__ import annotations

import asyncio
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from dags import levels_of, parents_of

from flowmagic.model import status as transition
from flowmagic.model.status import Status

__all__ = ["RunResult", "run_flowmagic", "run_levels", "run_langgraph", "run_sdk_loop",
           "run_floor", "latencies", "arrivals",
           "critical_path", "build_langgraph", "langgraph_config", "node_of", "MODEL", "SEED"]

MODEL = "m"
SEED = 0
_NODE_RE = re.compile(r"Your subtask \((\w+)\)")


@dataclass
class RunResult:
    runner: str
    makespan: float                       # wall seconds around the run call
    spans: dict[str, tuple[float, float]]  # node -> (start, end), epoch seconds
    bound: float = 0.0                    # critical path over the recorded durations
    state: str = "done"
    extra: dict[str, Any] = field(default_factory=dict)


def critical_path(dag: dict, weights: dict[str, float]) -> float:
    """Longest path through the DAG with each node weighted by `weights`."""
    parents = parents_of(dag)
    best: dict[str, float] = {}
    for x in dag["nodes"]:  # plan order is topological for every family
        nid = x["id"]
        best[nid] = weights.get(nid, 0.0) + max((best[p] for p in parents[nid]), default=0.0)
    return max(best.values(), default=0.0)


def _durations(spans: dict[str, tuple[float, float]]) -> dict[str, float]:
    return {k: end - start for k, (start, end) in spans.items()}


def node_of(body: dict) -> str | None:
    for message in body.get("messages") or []:
        found = _NODE_RE.search(str(message.get("content")))
        if found:
            return found.group(1)
    return None


def latencies(server) -> dict[str, float]:
    """Node -> the latency the server applied to its (last) chat request since the reset."""
    out = {}
    for rec in server.stats(bodies=True)["requests"]:
        if rec.get("path", "").endswith("/chat/completions") and isinstance(rec.get("body"), dict):
            nid = node_of(rec["body"])
            if nid is not None and rec.get("latency_s") is not None:
                out[nid] = rec["latency_s"]
    return out


def arrivals(server) -> list[float]:
    """Epoch seconds at which the server received each chat request since the reset."""
    return sorted(rec["arrived"] for rec in server.stats()["requests"]
                  if rec.get("path", "").endswith("/chat/completions") and rec.get("arrived"))


def _flow(dag: dict, task: str, home: Path, max_tokens: int, *, save: bool, llm=None):
    """A Flow of the DAG with its own store in `home` (so no run sees another's cache)."""
    from flowmagic.flow import Flow
    from flowmagic.llm import LLM
    from flowmagic.store import Store

    store = Store(home / "flowmagic.db")
    # The LLM door's default cap (8 calls at once) would make every runner but ours
    # wait; the benchmark compares schedulers, so nobody is capped.
    llm = llm or LLM(store, concurrency=1_000_000)
    return Flow.from_dict(dag, task=task, llm=llm, store=store, save=save,
                          concurrency=1_000_000, consolidate=False, max_tokens=max_tokens)


async def run_flowmagic(dag: dict, task: str, max_tokens: int, profiler=None) -> RunResult:
    from flowmagic.model import metrics

    with tempfile.TemporaryDirectory(prefix="fm-bench-") as tmp:
        flow = _flow(dag, task, Path(tmp), max_tokens, save=True)
        # When each event reached subscribers, i.e. after Flow.emit had persisted it.
        told: dict = {}
        flow.subscribe(lambda e: told.__setitem__((e["kind"], e["node"]), e["time"]))
        w0, t0 = time.time(), time.perf_counter()
        if profiler is not None:   # bench/clientprofile.py: the run call alone
            profiler.enable()
        state = await flow.arun()
        makespan = time.perf_counter() - t0
        if profiler is not None:
            profiler.disable()
        await flow.llm.aclose()
        spans = {n.id: (n.start, n.end) for n in flow.workflow.nodes.values() if n.start and n.end}
        _, bound = metrics.critical_path(flow.workflow, weight="duration")
        calls = flow.store.count_calls(cached=False)
        done = sum(1 for n in flow.workflow.nodes.values() if n.status == Status.DONE)
        flow.store.close()
    last = max(spans, key=lambda k: spans[k][1]) if spans else None
    return RunResult("flowmagic", makespan, spans, bound, state,
                     {"calls": calls, "done": done, "t0": w0,
                      "last_told": told.get(("finished", last)), "run_told": told.get(("run", None))})


class _Shadow:
    """Builds each node's messages exactly as flowmagic would, from the replies so far."""

    def __init__(self, dag: dict, task: str, max_tokens: int, home: Path):
        from flowmagic.engine.node_runner import node_messages

        self._messages = node_messages
        self.flow = _flow(dag, task, home, max_tokens, save=False)
        self.max_tokens = max_tokens

    def body(self, node_id: str) -> dict:
        return {"model": MODEL, "messages": self._messages(self.flow.context(), node_id), "seed": SEED,
                "max_tokens": self.max_tokens}

    def done(self, node_id: str, text: str) -> None:
        transition.finish(self.flow.workflow.nodes[node_id], text)


def _client(base_url: str):
    from openai import AsyncOpenAI
    # The SDK's own retries (its default, 2), as a LangGraph user would have them; our LLM
    # door retries too. The harness counts the requests, so a retry shows in the results.
    return AsyncOpenAI(base_url=base_url, api_key="not-needed", max_retries=2, timeout=120)


async def _call(client, shadow: _Shadow, node_id: str, spans: dict) -> str:
    start = time.time()
    reply = await client.chat.completions.create(**shadow.body(node_id))
    text = reply.choices[0].message.content or ""
    shadow.done(node_id, text)
    spans[node_id] = (start, time.time())
    return text


async def run_levels(dag: dict, task: str, max_tokens: int, base_url: str) -> RunResult:
    with tempfile.TemporaryDirectory(prefix="fm-bench-") as tmp:
        shadow = _Shadow(dag, task, max_tokens, Path(tmp))
        client, spans = _client(base_url), {}
        w0, t0 = time.time(), time.perf_counter()
        for level in levels_of(dag):
            await asyncio.gather(*(_call(client, shadow, n, spans) for n in level))
        makespan = time.perf_counter() - t0
        await client.close()
        shadow.flow.store.close()
    return RunResult("level-sync", makespan, spans, critical_path(dag, _durations(spans)),
                     extra={"t0": w0})


def _merge(a: dict, b: dict) -> dict:
    return {**a, **b}


def build_langgraph(dag: dict, node_fn):
    """A compiled StateGraph: one node per DAG node; a join waits for all its parents."""
    from typing_extensions import TypedDict
    from langgraph.graph import START, StateGraph

    class State(TypedDict):
        out: Annotated[dict, _merge]

    builder = StateGraph(State)
    parents = parents_of(dag)
    for x in dag["nodes"]:
        builder.add_node(x["id"], node_fn(x["id"]))
    for nid, ps in parents.items():
        # The list form is LangGraph's "wait for ALL of these"; one parent is a plain edge.
        builder.add_edge(START if not ps else ps[0] if len(ps) == 1 else list(ps), nid)
    return builder.compile()


def langgraph_config(dag: dict) -> dict:
    # One superstep per level at least; the default limit (25) stops deep chains.
    return {"recursion_limit": len(dag["nodes"]) + 10}


async def run_langgraph(dag: dict, task: str, max_tokens: int, base_url: str) -> RunResult:
    with tempfile.TemporaryDirectory(prefix="fm-bench-") as tmp:
        shadow = _Shadow(dag, task, max_tokens, Path(tmp))
        client, spans = _client(base_url), {}

        def node_fn(nid: str):
            async def node(state: dict) -> dict:
                return {"out": {nid: await _call(client, shadow, nid, spans)}}
            return node

        t_build = time.perf_counter()
        app = build_langgraph(dag, node_fn)
        w0, t0 = time.time(), time.perf_counter()
        final = await app.ainvoke({"out": {}}, langgraph_config(dag))
        makespan = time.perf_counter() - t0
        await client.close()
        shadow.flow.store.close()
    missing = len(dag["nodes"]) - len(final["out"])
    return RunResult("langgraph", makespan, spans, critical_path(dag, _durations(spans)),
                     "done" if not missing else f"{missing} missing",
                     {"compile_s": t0 - t_build, "t0": w0})



async def _greedy(dag: dict, call) -> None:
    """Start `call(node)` for every node the moment its last parent's call has returned."""
    parents = parents_of(dag)
    children: dict[str, list[str]] = {n: [] for n in parents}
    for nid, ps in parents.items():
        for p in ps:
            children[p].append(nid)
    waiting = {nid: len(ps) for nid, ps in parents.items()}
    async with asyncio.TaskGroup() as tg:
        async def run(nid: str) -> None:
            await call(nid)
            for child in children[nid]:
                waiting[child] -= 1
                if waiting[child] == 0:
                    tg.create_task(run(child))

        for nid, left in waiting.items():
            if left == 0:
                tg.create_task(run(nid))


async def run_sdk_loop(dag: dict, task: str, max_tokens: int, base_url: str) -> RunResult:
    with tempfile.TemporaryDirectory(prefix="fm-bench-") as tmp:
        shadow = _Shadow(dag, task, max_tokens, Path(tmp))
        spans: dict = {}
        w0, t0 = time.time(), time.perf_counter()
        client = _client(base_url)   # inside the clock, as flowmagic's door builds its own
        await _greedy(dag, lambda nid: _call(client, shadow, nid, spans))
        makespan = time.perf_counter() - t0
        await client.close()
        shadow.flow.store.close()
    return RunResult("sdk-loop", makespan, spans, critical_path(dag, _durations(spans)),
                     extra={"t0": w0})


class _RawHTTP:
    """POST JSON over kept-alive HTTP/1.1 connections, by hand: the least a client can do."""

    def __init__(self, base_url: str):
        from urllib.parse import urlsplit

        url = urlsplit(base_url)
        self.host, self.port, self.prefix = url.hostname, url.port or 80, url.path.rstrip("/")
        self.idle: list = []

    async def post(self, path: str, body: dict) -> dict:
        import json

        reader, writer = self.idle.pop() if self.idle else await asyncio.open_connection(
            self.host, self.port)   # asyncio sets TCP_NODELAY on TCP sockets
        data = json.dumps(body).encode()
        writer.write(b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % ((self.prefix + path).encode(),
                                                      self.host.encode(), len(data), data))
        status = await reader.readline()
        length, keep = 0, True
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
            elif name.strip().lower() == b"connection" and b"close" in value.lower():
                keep = False
        payload = await reader.readexactly(length)
        if keep:
            self.idle.append((reader, writer))
        else:
            writer.close()
        if b" 200 " not in status:
            raise RuntimeError(f"HTTP {status!r}: {payload[:200]!r}")
        return json.loads(payload)

    async def close(self) -> None:
        for _, writer in self.idle:
            writer.close()
        self.idle = []


async def run_floor(dag: dict, task: str, max_tokens: int, base_url: str) -> RunResult:
    with tempfile.TemporaryDirectory(prefix="fm-bench-") as tmp:
        shadow = _Shadow(dag, task, max_tokens, Path(tmp))
        http, spans = _RawHTTP(base_url), {}

        async def call(nid: str) -> None:
            start = time.time()
            reply = await http.post("/chat/completions", shadow.body(nid))
            shadow.done(nid, reply["choices"][0]["message"]["content"] or "")
            spans[nid] = (start, time.time())

        w0, t0 = time.time(), time.perf_counter()
        await _greedy(dag, call)
        makespan = time.perf_counter() - t0
        await http.close()
        shadow.flow.store.close()
    return RunResult("floor", makespan, spans, critical_path(dag, _durations(spans)),
                     extra={"t0": w0})
