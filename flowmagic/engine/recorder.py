"""`Recorder`: a run's events, their batching and their persistence, behind a narrow seam.

Every state change of a run goes through `emit`: it is written to the store before anyone is
told, so the UI never shows what the store does not have. The recorder talks to the store
only through `RunLog`'s five calls (the way a checkpointer is the one seam of a graph run),
so the store can change without touching the run's loop.

Batching: the node events of one event-loop turn are written in one transaction (one commit
per turn instead of two per node), and that commit waits a few turns (`FLUSH_TURNS`), so that
the nodes started in this turn send their requests first: a chain's next call does not wait
for its parent's write. When the store fails (disk full, read-only, locked) everything stays
here for the next write, the listeners are told anyway, and during a run the run's own
`on_failure` is called (it stops starting nodes) instead of raising.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, Protocol

from ..errors import StoreError
from .run_record import RunRecord

__all__ = ["Recorder", "RunLog", "FLUSH_TURNS"]

_NODE_EVENTS = frozenset(("started", "finished", "failed", "stopped", "text", "tool",
                          "waiting"))
# Shown as they come and never stored: streamed text, and a call's place in a local
# server's queue ("waiting for the model (N ahead)"; ahead None: its request went out).
_PASSING = frozenset(("text", "waiting"))
# The turns a node started in this one takes to put its request on the wire: its first
# step (prompt, cache look-up, the HTTP client's request), and a turn more for aiohttp's
# writer task, for which this was measured (llm/http1 writes in the first step).
FLUSH_TURNS = 3


class RunLog(Protocol):
    """The store as a run is written to it (`flowmagic.store.Store` is one)."""

    def save_run(self, run_id: str, *, task: str, workflow: dict, name: str | None = None,
                 status: str = ..., candidates: Any = None, settings: Any = None,
                 result: str | None = None) -> None: ...

    def write_batch(self, run_id: str, nodes: list[dict], events: list[tuple],
                    calls: list[dict] = (),
                    logged: Callable[[list[int]], None] | None = None) -> None: ...

    def set_run_status(self, run_id: str, status: str, result: str | None = None) -> None: ...

    def add_update(self, run_id: str, data: dict) -> None: ...

    def add_tool_call(self, run_id: str | None, node_id: str | None, *, tool: str,
                      arguments: Any = None, result: str | None = None,
                      duration_s: float | None = None, error: str | None = None,
                      round: int | None = None, protocol: str | None = None) -> int: ...  # noqa: A002


def _after_turns(loop: asyncio.AbstractEventLoop, turns: int, callback: Callable[[], Any]) -> None:
    """`callback()` after `turns` turns of `loop` (1: as call_soon)."""
    if turns <= 1:
        loop.call_soon(callback)
    else:
        loop.call_soon(_after_turns, loop, turns - 1, callback)


def _name_calls(calls: list[tuple[dict, dict]], ids: list[int]) -> None:
    """Each deferred call's row id into its attempt record (the last call of an attempt,
    a continued answer's, is the one the record names)."""
    for (_, record), call_id in zip(calls, ids):
        record["call_id"] = call_id


class Recorder:
    """Writes one run (`record`: its plan, states, events) to `log`, then tells each of
    `listeners` (the flow's list: a listener added later is told too).
    `streaming`: a node's text is announced piece by piece ("text" events)."""

    def __init__(self, log: RunLog, record: RunRecord, listeners: list[Callable[[dict], None]]):
        self.log = log
        self.record = record
        self.run_id = record.run_id
        self.streaming = False
        self.listeners = listeners
        self._partial: dict[str, str] = {}   # node id -> text streamed so far while it runs
        self._pending: list[tuple] = []   # events not yet written (see emit)
        self._calls: list[tuple[dict, dict]] = []   # node calls' log rows not yet written
        self._flush_in: int | None = None   # turns to the scheduled write of node events
        # what a failed write left (events, call rows): written first by the next one
        self._held: tuple[list, list] = ([], [])
        self.error: StoreError | None = None   # the store failed during this run
        # during a run a store failure calls this (the run stops starting nodes) instead
        # of raising; None: no run
        self._on_failure: Callable[[StoreError], None] | None = None

    # -- the run's span ---------------------------------------------------------------
    def begin(self, on_failure: Callable[[StoreError], None]) -> None:
        """A run starts: a store failure from now on calls `on_failure` instead of raising."""
        self.error, self._on_failure = None, on_failure

    def end(self) -> None:
        self._on_failure = None

    @property
    def in_run(self) -> bool:
        return self._on_failure is not None

    # -- events -------------------------------------------------------------------------
    def emit(self, kind: str, node_id: str | None = None, data: dict | None = None) -> None:
        """Persist a state change, then tell the listeners: a node event with the other node
        events of its turn, `FLUSH_TURNS` turns later (streamed text the next turn); every
        other event at once."""
        event = {"kind": kind, "node": node_id, "time": time.time(), **(data or {})}
        self._pending.append((kind, node_id, data or None, event))
        if kind in _NODE_EVENTS and self._flush_later(1 if kind in _PASSING else FLUSH_TURNS):
            return
        self.flush()

    def log_later(self, row: dict, record: dict) -> None:
        """A node call's log row (from the LLM door, `defer_log`), written by the next
        `flush` in the commit of the node's state, before it: the node's attempt `record`
        gets the row's id there. The result is shown final only after that commit, so the
        rule holds that a call's log row is durable before its result is shown; a node's
        answer and its log row are one commit instead of two."""
        self._calls.append((row, record))
        if not self._flush_later(FLUSH_TURNS):
            self.flush()

    def text_sink(self, node_id: str):
        """Where a node's streamed text goes (None when `streaming` is off)."""
        self._partial[node_id] = ""
        if not self.streaming:
            return None
        return lambda piece: self.emit("text", node_id, {"text": piece})

    def wait_sink(self, node_id: str):
        """Where a node hears its call's place in a local server's queue."""
        return lambda ahead: self.emit("waiting", node_id, {"ahead": ahead})

    def partial_output(self, node_id: str) -> str:
        """The text a running node has streamed so far ("" when none has arrived or
        `streaming` was off when it started)."""
        self.record.workflow.node(node_id)   # an unknown node: its NodeError
        return self._partial.get(node_id, "")

    # -- the run's own rows ------------------------------------------------------------------
    def save_run(self) -> None:
        """The run's row: task, plan, candidates, settings (after a change of plan)."""
        self.log.save_run(self.run_id, **self.record.row())

    def set_status(self, status: str, result: str | None = None) -> None:
        self.log.set_run_status(self.run_id, status, result)

    def add_update(self, entry: dict) -> None:
        self.log.add_update(self.run_id, entry)

    def tool_call(self, node_id: str, call: Any) -> None:
        """A node's tool call (engine.toolloop's record of it): stored, then told."""
        self.log.add_tool_call(self.run_id, node_id, tool=call.tool, arguments=call.arguments,
                               result=call.summary(), duration_s=call.duration_s,
                               error=call.error, round=call.round, protocol=call.protocol)
        self.emit("tool", node_id, {"call": call.to_dict()})

    # -- writing --------------------------------------------------------------------------
    def _flush_later(self, turns: int) -> bool:
        """Schedule `flush` in `turns` turns of the running loop (or sooner, as scheduled
        already); False when no loop runs."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return False
        if self._flush_in is None or turns < self._flush_in:
            self._flush_in = turns
            _after_turns(loop, turns, self._flush_scheduled)
        return True

    def _flush_scheduled(self) -> None:
        """`flush` as a loop callback: it has no caller to raise to."""
        try:
            self.flush()
        except StoreError as exc:
            self._failed(exc)

    def flush(self) -> None:
        """Write the pending node states, events and call rows in one commit (after what
        an earlier failed write left), then tell the listeners. When the store fails
        everything stays here for the next write and the listeners are told anyway: during
        a run the run is stopped (`on_failure`) and nothing more is tried until the next
        run, otherwise the StoreError is raised."""
        self._flush_in = None
        pending, self._pending = self._pending, []
        calls, self._calls = self._calls, []
        held_events, held_calls = self._held
        if not (pending or calls or held_events or held_calls):
            return
        try:
            if self.in_run and self.error is not None:
                # (a locked store would stall the loop 5 s a try; a full disk stays full)
                raise self.error
            self._write(held_events + pending, held_calls + calls)
            self._held = ([], [])
        except StoreError as exc:
            self._held = (held_events + pending, held_calls + calls)
            self._announce(pending)
            if not self.in_run:
                raise
            self._failed(exc)
            return
        self._announce(pending)

    def _write(self, pending: list[tuple], calls: list[tuple[dict, dict]]) -> None:
        nodes = self.record.workflow.nodes
        # A node that starts for the first time keeps its stored state (pending, as planned)
        # until it ends: its "started" event says it began, and load() turns a running node
        # back into a pending one anyway. A node that ran before is written at its start,
        # so a kill cannot leave its old result looking current.
        changed = dict.fromkeys(n for kind, n, _, _ in pending if n is not None and n in nodes
                                and (kind != "started" or nodes[n].attempts))
        self.log.write_batch(
            # A shallow view: it is serialised right away, so no deep copy is needed.
            self.run_id, [vars(nodes[n]) for n in changed],
            [(kind, n, data) for kind, n, data, _ in pending if kind not in _PASSING],
            calls=[row for row, _ in calls], logged=lambda ids: _name_calls(calls, ids))

    def _announce(self, pending: list[tuple]) -> None:
        for kind, node_id, data, event in pending:
            if kind == "text":   # what partial_output() says is what listeners were told
                self._partial[node_id] = self._partial.get(node_id, "") + data["text"]
            for listener in list(self.listeners):   # (one that unsubscribes is still told)
                listener(event)

    def _failed(self, exc: StoreError) -> None:
        self.error = exc
        if self._on_failure is not None:
            self._on_failure(exc)

    def unstored(self) -> str:
        """What the run's end says about a store that failed: what is held, and what to do."""
        held = list(dict.fromkeys(n for kind, n, _, _ in self._held[0]
                                  if kind in ("finished", "failed") and n))
        if not held:
            return f"{self.error}; the run stopped, with every finished node stored"
        names = ", ".join(held[:5]) + (f" and {len(held) - 5} more" if len(held) > 5 else "")
        return (f"{self.error}; the run stopped with {len(held)} finished node"
                f"{'s' if len(held) != 1 else ''} ({names}) held in this session only, not in "
                "the store: run() again saves them first (flow.to_notebook(path) has them now)")
