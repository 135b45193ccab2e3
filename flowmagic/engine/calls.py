"""Every model call made for a node, and why it was made.

A node that spent ten calls in eighteen minutes must say where they went: each attempt
(the first, a retry after which error, a rerun), each continuation of an answer cut at the
token limit, each validation by the judge, each repair and each update the node triggered.
The rows are built from what the run already records (the node's attempts, the update log),
in time order; the panel's node info and `flow.timeline()` show them.
"""

from __future__ import annotations

from typing import Any, Iterable

__all__ = ["node_calls", "calls_text", "attempt_why"]

_REASON_CHARS = 90


def _first_line(text: Any) -> str:
    line = " ".join(str(text or "").strip().split("\n", 1)[0].split())
    return line if len(line) <= _REASON_CHARS else line[:_REASON_CHARS - 1] + "…"


def attempt_why(earlier: list[dict], history: int) -> str:
    """Why an attempt's call is made: 'attempt' (a node's first), 'rerun' (the first of a
    later run of it) or 'retry after: <what was wrong with the one before>'."""
    if not earlier:
        return "rerun" if history else "attempt"
    last = earlier[-1]
    return f"retry after: {_first_line(last.get('feedback') or last.get('error') or 'a rejection')}"


def _made_a_call(attempt: dict) -> bool:
    # an injected failure (fail_rate) or a sandbox that cannot run was no model call
    return bool(attempt.get("call_id") or attempt.get("output") is not None
                or attempt.get("cache_key"))


def node_calls(node, update_log: Iterable[dict] = ()) -> list[dict]:
    """[{"time", "purpose", "why", "cached"}] for each model call made for `node`, in order."""
    rows = []
    for attempt in node.attempts or []:
        if not _made_a_call(attempt):
            continue
        n, at = attempt.get("attempt", "?"), attempt.get("start") or 0.0
        why = attempt.get("why") or ("attempt" if n == 1 else "attempt (reason not recorded)")
        cached = bool(attempt.get("cached"))
        rows.append({"time": at, "purpose": "node", "why": f"{why} (#{n})", "cached": cached})
        for c in range(int(attempt.get("continuations") or 0)):
            rows.append({"time": at, "purpose": "node", "cached": cached,
                         "why": f"continuation {c + 1} of #{n} (cut at the token limit)"})
        if attempt.get("judged"):
            rows.append({"time": attempt.get("end") or at, "purpose": "validate", "cached": False,
                         "why": f"validation of #{n} by the judge"})
    for entry in update_log or []:
        if node.id not in (entry.get("trigger") or []):
            continue
        kind = entry.get("kind") or "update"
        purpose, why = (("update", "update: re-plan after this node") if kind == "replan"
                        else ("repair", f"repair: {kind.replace('_', ' ')}"))
        for _ in range(int(entry.get("calls", 1))):
            rows.append({"time": entry.get("time") or 0.0, "purpose": purpose, "why": why,
                         "cached": False})
    rows.sort(key=lambda r: r["time"])
    return rows


def calls_text(rows: list[dict]) -> str:
    """'5 model calls: attempt (#1) · retry after: The code failed: NameError … (#2) · …'"""
    if not rows:
        return "no model call yet"
    counted = f"{len(rows)} model call{'s' if len(rows) != 1 else ''}"
    cached = sum(r["cached"] for r in rows)
    if cached:
        counted += f" ({cached} from the cache)"
    return f"{counted}: " + " · ".join(r["why"] for r in rows)
