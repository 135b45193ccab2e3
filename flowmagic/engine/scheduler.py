"""Event-driven execution of a workflow: a node starts the moment its last parent is done.

Two parts, in graphlib's shape: `ready_set.ReadySet` knows which nodes can start (counts of
unfinished parents, the ready queue: plain data, no asyncio), and the `Executor` here is the
thin asyncio driver around it: it hands each ready node to the caller's work (`Flow`
supplies `NodeRunner.run`, benchmarks a no-op), one asyncio task per running node, a cap on
how many run at once, and tells the ready set when each is done. Cancellation puts
in-flight nodes back to pending, so nothing finished is ever lost.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from ..model.graph import Node, Workflow
from ..model import status as transition
from ..model.status import RunState, Status
from .ready_set import ReadySet

__all__ = ["Executor", "Outcome", "RUN_STATES"]

RUN_STATES = (RunState.DONE, RunState.STEPPED, RunState.PAUSED, RunState.STOPPED,
              RunState.INCOMPLETE, RunState.BUDGET)


@dataclass
class Outcome:
    """What one node's work produced; the executor applies it to the node."""
    ok: bool
    output: str | None = None
    error: str | None = None
    attempts: list[dict] = field(default_factory=list)
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0
    masked: bool = False
    execution: dict | None = None   # what the node's code did in the sandbox (engine/answer_code)


Work = Callable[[str], Awaitable[Outcome]]


async def _noop(node_id: str) -> Outcome:
    return Outcome(ok=True, output="")


class Executor:
    """Runs `work(node_id)` for every node once its parents are done.

    Hooks, all optional: `on_event(kind, node_id, data)` after every state change (the
    Flow persists, then notifies the UI); `can_start()` returns a reason string to stop
    starting nodes (a budget) or None; `after_node(node_id, ok, outcome)` returns True
    when an update should run before more nodes start; `update()` performs it (it may
    replace the workflow through `get_workflow`).
    """

    def __init__(self, get_workflow: Callable[[], Workflow] | Workflow, work: Work | None = None,
                 *, concurrency: int | None = 8,
                 on_event: Callable[[str, str | None, dict], None] | None = None,
                 can_start: Callable[[], str | None] | None = None,
                 after_node: Callable[[str, bool, Outcome], bool] | None = None,
                 update: Callable[[], Awaitable[Any]] | None = None,
                 concurrent_update: bool = False):
        if isinstance(get_workflow, Workflow):
            fixed = get_workflow
            get_workflow = lambda: fixed  # noqa: E731 - a fixed workflow
        self._get_workflow = get_workflow
        self.work = work or _noop
        self.concurrency = concurrency
        self._on_event = on_event
        self._can_start = can_start
        self._after_node = after_node
        self._update = update
        self._concurrent_update = concurrent_update
        self._running: dict[asyncio.Task, str] = {}
        self._nodes = ReadySet()
        self._paused = False
        self._stopping = False
        self._update_due = False
        self._update_task: asyncio.Task | None = None
        self._wake: asyncio.Event | None = None
        self._done: deque[asyncio.Task] = deque()   # finished tasks, in the order they ended
        self._restart: set[str] = set()
        self.stop_reason: str | None = None

    @property
    def workflow(self) -> Workflow:
        return self._get_workflow()

    @property
    def running(self) -> list[str]:
        return list(self._running.values())

    # -- counts -----------------------------------------------------------------
    def recount(self) -> None:
        """Derive the waiting counts and the ready queue from the graph (after any edit)."""
        self._nodes.prepare(self.workflow, self._running.values())

    def _emit(self, kind: str, node_id: str | None = None, **data: Any) -> None:
        if self._on_event is not None:
            self._on_event(kind, node_id, data)

    # -- control ----------------------------------------------------------------
    def pause(self) -> None:
        self._paused = True
        self._poke()

    def stop(self) -> None:
        self._stopping = True
        for task in list(self._running):
            task.cancel()
        if self._update_task is not None:
            self._update_task.cancel()
        self._poke()

    def restart(self, node_ids) -> list[str]:
        """Cancel these running nodes: their inputs changed while they ran (an update or a
        rerun reset an ancestor). Each goes back to pending, marked stale, and runs again
        once its parents are done; an answer that arrives anyway is discarded."""
        hit = []
        for task, node_id in list(self._running.items()):
            if node_id in node_ids:
                self._restart.add(node_id)
                task.cancel()
                hit.append(node_id)
        self._poke()
        return hit

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake.set()

    # -- the loop ---------------------------------------------------------------
    async def run(self, *, step: bool = False, only: list[str] | None = None) -> RunState:
        """Run until nothing can start; returns one of RUN_STATES."""
        self._paused = self._stopping = False
        self.stop_reason = None
        self._wake = asyncio.Event()
        self._done.clear()
        self.recount()
        if only is not None:
            self._nodes.keep_only(only)
        stepping = step or only is not None
        started = False
        try:
            while True:
                if not (stepping and started):
                    self._start_ready()
                    started = True
                if not self._running and self._update_task is None:
                    if self._update_due and not self._stopping and not self._paused:
                        await self._run_update()
                        continue
                    break
                await self._wait_any()
        except BaseException:
            # Cancelled (stop, KeyboardInterrupt) or broken: leave no node running.
            self._stopping = True
            await self._cancel_running()
            raise
        finally:
            if self._stopping:
                await self._cancel_running()
            self._wake = None
        return self._final_state(stepping)

    def _start_ready(self) -> None:
        if self._paused or self._stopping or (self._update_due and not self._concurrent_update):
            return
        wf = self.workflow
        while self._nodes.ready and (self.concurrency is None
                                     or len(self._running) < self.concurrency):
            if self._can_start is not None:
                reason = self._can_start()
                if reason:
                    self.stop_reason = reason
                    self._paused = True
                    self._emit("budget", None, message=reason)
                    return
            node_id = self._nodes.get_ready(wf)
            if node_id is None:
                return
            self._start(wf.nodes[node_id])

    def _start(self, node: Node) -> None:
        n = self._nodes.take_slot(node.id, node.agent)
        transition.start(node, clone=f"{node.agent}#{n}" if n > 1 else None)
        task = asyncio.ensure_future(self.work(node.id))
        task.add_done_callback(self._ended)
        self._running[task] = node.id
        self._emit("started", node.id, agent=node.agent, clone=node.clone)

    def _ended(self, task: asyncio.Task) -> None:
        # A done callback instead of asyncio.wait over every running task: waking up for
        # one finished node costs O(1), not O(nodes running), on a 500-wide fan-out.
        self._done.append(task)
        self._poke()

    async def _wait_any(self) -> None:
        if not self._done:
            await self._wake.wait()
        self._wake.clear()
        while self._done:
            task = self._done.popleft()
            if task is self._update_task:
                self._update_task = None
                task.result()
                self.recount()
            elif task in self._running:
                self._finish(task)

    def _finish(self, task: asyncio.Task) -> None:
        node_id = self._running.pop(task)
        wf = self.workflow
        node = wf.nodes.get(node_id)
        self._nodes.free_slot(node_id)
        if node_id in self._restart:   # its inputs changed while it ran: whatever came back is moot
            self._restart.discard(node_id)
            self._unstart(node)
            if node is not None:
                node.stale = True
            return
        if task.cancelled():
            self._unstart(node)
            return
        try:
            outcome = task.result()
        except Exception:
            self._unstart(node)   # the work itself broke: the node has not run
            raise
        if node is None or node.status != Status.RUNNING:
            return  # removed or reset by an update while it ran; its outcome is moot
        self._apply(node, outcome)
        if outcome.ok:
            self._nodes.done(wf, node_id)
        if self._after_node is not None and self._after_node(node_id, outcome.ok, outcome):
            if self._concurrent_update:
                if self._update_task is None:
                    self._update_task = asyncio.ensure_future(self._update())
                    self._update_task.add_done_callback(self._ended)
            else:
                self._update_due = True

    def _apply(self, node: Node, outcome: Outcome) -> None:
        node.end = time.time()
        node.attempts.extend(outcome.attempts)
        node.tokens_in += outcome.tokens_in
        node.tokens_out += outcome.tokens_out
        node.cost_usd += outcome.cost_usd
        if outcome.ok:
            transition.finish(node, outcome.output, outcome.execution)
            self._emit("finished", node.id, masked=outcome.masked)
        else:
            transition.fail(node, outcome.error)
            self._emit("failed", node.id, error=outcome.error)

    async def _run_update(self) -> None:
        self._update_due = False
        if self._update is not None:
            await self._update()
        self.recount()

    async def _cancel_running(self) -> None:
        tasks = list(self._running)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        wf = self.workflow
        for task in tasks:
            node_id = self._running.pop(task, None)
            node = wf.nodes.get(node_id) if node_id else None
            self._nodes.free_slot(node_id)
            self._unstart(node)
        if self._update_task is not None:
            self._update_task.cancel()
            await asyncio.gather(self._update_task, return_exceptions=True)
            self._update_task = None

    def _unstart(self, node: Node | None) -> None:
        """A cancelled node goes back to pending, as if it had never started."""
        if node is not None and node.status == Status.RUNNING:
            transition.requeue(node)
            self._emit("stopped", node.id)

    def _final_state(self, stepping: bool) -> RunState:
        if self._stopping:
            return RunState.STOPPED
        if self.stop_reason:
            return RunState.BUDGET
        if self._paused:
            return RunState.PAUSED
        statuses = [n.status for n in self.workflow.nodes.values() if n.status != Status.PRUNED]
        if all(s == Status.DONE for s in statuses):
            return RunState.DONE
        return RunState.STEPPED if stepping else RunState.INCOMPLETE
