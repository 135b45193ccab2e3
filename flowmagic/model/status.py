"""Node and run states, and the node state transitions.

`Status` (a node), `RunState` (a run) and `AnswerState` (an orchestration's answer) are `StrEnum`s: each member is the plain string it
always was (its repr too), so stored rows, JSON, exported notebooks, printed dicts and
`status == "done"` read as before, and a store written before the enums loads unchanged. Every change of a node's state goes
through one function below, so what a transition clears is written once.
"""

from __future__ import annotations

import time
from enum import StrEnum
from typing import Any

__all__ = ["Status", "RunState", "AnswerState", "STATUSES", "start", "finish", "fail", "requeue", "reset",
           "mark_stale", "prune", "unprune"]


class _State(StrEnum):
    def __repr__(self) -> str:   # the plain string's: printed dicts and counts read as before
        return repr(self.value)


class Status(_State):
    """The state of a node (a subtask)."""
    PENDING = "pending"   # waits for its parents, or for a run
    READY = "ready"       # (older stores) its parents are done; the executor requeues it
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    PRUNED = "pruned"     # removed from the plan, kept for its history (unprune() undoes it)


class RunState(_State):
    """The state of a run (`Flow.status`, a batch input's `Item.state`)."""
    PLANNED = "planned"         # planned, never run
    PENDING = "pending"         # a batch input not run yet
    RUNNING = "running"
    DONE = "done"               # every node that could run is done
    STEPPED = "stepped"         # step mode: one wave ran
    PAUSED = "paused"
    STOPPED = "stopped"
    INCOMPLETE = "incomplete"   # nothing more can start and some nodes are not done
    BUDGET = "budget"           # the budget was reached
    ERROR = "error"             # the run raised
    FAILED = "failed"           # a batch input whose run raised
    SKIPPED = "skipped"         # a batch input not run: the map's budget was reached
    INTERRUPTED = "interrupted"   # loaded from the store while it said running (a dead kernel)


class AnswerState(_State):
    """How an orchestration's answer came (`Orchestration.status`)."""
    RUNNING = "running"       # no answer yet
    SUBMITTED = "submitted"   # the orchestrator submitted it
    FORCED = "forced"         # asked for once its turns or time ran out
    FALLBACK = "fallback"     # the last reply, when even that failed


STATUSES = tuple(Status)


def start(node: Any, clone: str | None = None) -> None:
    """pending -> running, now, on `clone` (an agent's second instance, None for the first)."""
    node.status, node.clone = Status.RUNNING, clone
    node.start, node.end, node.error = time.time(), None, None


def finish(node: Any, output: str | None, execution: dict | None = None) -> None:
    """running -> done with its output (no longer stale)."""
    node.status, node.output, node.error, node.stale = Status.DONE, output, None, False
    node.execution = execution


def fail(node: Any, error: str | None) -> None:
    """running -> failed, saying why; its output stays what it was."""
    node.status, node.error = Status.FAILED, error


def requeue(node: Any) -> None:
    """Back to pending as if it had never started (cancelled, interrupted, or run again on
    the user's request); its output and error stay until it runs."""
    node.status, node.start, node.end, node.clone = Status.PENDING, None, None, None


def reset(node: Any) -> None:
    """Back to pending with nothing of its last run: output, error, times, execution."""
    node.status, node.output, node.error = Status.PENDING, None, None
    node.start = node.end = None
    node.stale, node.execution = False, None


def mark_stale(node: Any) -> None:
    """Back to pending because a parent runs again (an update's rerun); flagged stale."""
    node.status, node.error, node.stale = Status.PENDING, None, True


def prune(node: Any, record: dict) -> None:
    """-> pruned, keeping `record` (its state and edges before) for unprune()."""
    node.pruned_from = {"status": node.status, **record}
    node.status = Status.PRUNED


def unprune(node: Any) -> None:
    """pruned -> the state it had (done, failed; anything else comes back pending)."""
    before = (node.pruned_from or {}).get("status", Status.PENDING)
    node.status = Status(before) if before in (Status.DONE, Status.FAILED) else Status.PENDING
    node.pruned_from = None
