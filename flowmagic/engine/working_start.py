"""The working start in a node's result: flowmagic's own first look at a table input (run in
the sandbox before the model's code, for the embedded model), whether a node already ran it,
its printout not repeated by the model's, and the node's result when the model's answers
were unusable on every attempt."""

from __future__ import annotations

from .answer_code import WORKING_START, Execution, report
from .diagnosis import CODE_FAILED
from .scheduler import Outcome
from ..model.status import Status

__all__ = ["said_once", "ran_start", "start_run", "earlier_start", "shared_report", "shown_above",
           "SHOWN_ABOVE", "fall_back_on_start"]

# In a result that a working start led, where the prompt already shows that run above.
SHOWN_ABOVE = "[flowmagic's working start ran first here: its code and output are shown above]"


def said_once(said: str, ex: Execution, start: Execution | None) -> str:
    """The report of the model's code run, without a printout the working start's (shown
    above it in the node's result) already holds whole: small models print the start's
    shape and describe() again, and every child's prompt and the summary's read it twice."""
    printed = (ex.stdout or "").rstrip()
    if (start is None or not start.ran or not ex.ran or not printed.strip()
            or printed not in (start.stdout or "")):
        return said
    return said.replace(f"Printed output:\n{printed}",
                        "Printed output: only lines the working start printed (above)", 1)


def ran_start(execution: dict | None) -> bool:
    """The node's record holds the working start: as its result (or claimed by it), or run
    before the model's own code, which then became the result."""
    return bool(execution) and bool(execution.get("starter") or execution.get(WORKING_START))


def _own_run(execution: dict | None) -> dict | None:
    """The working start's own run in a node's execution record (not the files, renames and
    notes of the answer it became the result of), when it ran without error."""
    if not isinstance(execution, dict) or not ran_start(execution):
        return None
    run = execution.get(WORKING_START)
    run = run if isinstance(run, dict) else execution
    if run.get("starter") and run.get("ran") and run.get("ok"):
        return {**run, "saved": [], "renamed": {}, "notes": []}
    return None


def start_run(workflow) -> dict | None:
    """The working start's run that a done node of the flow holds, when it ran without error
    (what the prompts of the flow's later calls show: `instructions(ran=report(...))`)."""
    for node in workflow.nodes.values():
        run = _own_run(node.execution) if node.status == Status.DONE else None
        if run is not None:
            return run
    return None


def earlier_start(node) -> dict | None:
    """The working start's run that an earlier attempt of `node` holds, when it ran without
    error: a node that led the working start and runs again (`flow.rerun`, `flow.edit`)
    takes that run as it ran (its cell is in the session's order already) instead of none,
    so that its result, its record and the export keep it, and later prompts still show it."""
    for attempt in reversed(node.attempts or []):
        run = _own_run(attempt.get("execution") if isinstance(attempt, dict) else None)
        if run is not None:
            return run
    return None


def shared_report(ex: Execution) -> str:
    """The report of a working start's run that the start every later call shares shows
    ("" when it did not run without error: then only its node is told, as before)."""
    return report(ex) if ex.ran and ex.ok else ""


def shown_above(text: str, shown: str) -> str:
    """`text` (a node's result) without the working start's report `shown` that leads it,
    when the prompt it goes into shows that report above already."""
    if shown and text.startswith(shown):
        return SHOWN_ABOVE + text[len(shown):]
    return text


def _model_side(attempt: dict) -> str:
    """What the model's answer of a failed attempt did wrong, when that is all that went
    wrong: "code" (its code failed), "cut" (it reached the token limit unfinished), "empty";
    else "" (an injected failure, a validator's verdict, the workspace, the endpoint)."""
    if attempt.get("error"):
        return ""
    if attempt.get("cut"):
        return "cut"
    feedback = str(attempt.get("feedback", ""))
    if feedback.startswith(CODE_FAILED):
        return "code"
    return "empty" if feedback.startswith("empty answer") else ""


def fall_back_on_start(outcome: Outcome, attempts: list[dict], start: Execution,
                        started: str) -> None:
    """When the model's answer was unusable on every attempt (its code failed, it was cut at
    the token limit, it was empty; nothing else went wrong), a working start that ran is the
    node's result, and the result says so. Nothing of those answers becomes the result."""
    kinds = [_model_side(a) for a in attempts]
    if not (start.ok and attempts and all(kinds)):
        return
    n = len(attempts)
    failed = [a for a, k in zip(attempts, kinds) if k == "code"]
    last = " ".join(str((failed[-1].get("execution") or {}).get("error") or "").split()
                    if failed else [])
    if kinds.count("code") == n:
        why = f"The model's own code failed on all {n} attempt(s) (last: {last[:200]})"
    else:
        said = {"code": f"its code failed (last: {last[:200]})",
                "cut": "its answer reached the token limit unfinished",
                "empty": "its answer was empty"}
        why = (f"The model gave no usable answer on any of its {n} attempt(s): "
               + "; ".join(f"{kinds.count(k)}x {said[k]}" for k in ("cut", "code", "empty")
                           if k in kinds))
    attempts[-1]["fallback"] = "starter"
    outcome.ok, outcome.execution = True, start.to_dict()
    outcome.output = f"{started}\n\n{why}; this result is the working start's real output above."
