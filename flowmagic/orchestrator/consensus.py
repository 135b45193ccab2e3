"""CORAL's last step: the orchestrator submits only an answer its agents confirm.

When the orchestrator submits, every agent that replied during the run (every agent, when
none did) is shown the task and the proposed answer and asked whether it agrees; only a
clear yes counts. An answer someone does not confirm goes back to the orchestrator with
the reasons, and it may revise and submit again; after `rounds` refusals the next
submission goes through with a note that no consensus was reached.
"""

from __future__ import annotations

from typing import Any

__all__ = ["VOTE_SCHEMA", "vote_prompt", "read_vote", "refusal"]

VOTE_SCHEMA = {"type": "object", "required": ["agree", "reason"], "properties": {
    "agree": {"type": "boolean"}, "reason": {"type": "string"}}}


def vote_prompt(task: str, answer: str) -> str:
    return (f"The orchestrator proposes this final answer to the task.\n\nThe task:\n{task}\n\n"
            f"The proposed answer:\n{answer}\n\nDo you agree that it is correct and complete, "
            "given the work you did? Answer with JSON only: "
            '{"agree": true or false, "reason": "one sentence"}.')


def read_vote(data: Any) -> tuple[bool, str]:
    """(agrees, reason): only `"agree": true` is a yes; anything unreadable is not."""
    if not isinstance(data, dict):
        return False, "no readable verdict"
    reason = data.get("reason")
    reason = " ".join(reason.split())[:300] if isinstance(reason, str) else ""
    return data.get("agree") is True, reason


def refusal(against: list[tuple[str, str]]) -> str:
    """What the orchestrator is told when its answer was not confirmed."""
    lines = "\n".join(f"[{agent}]: {reason or 'did not say yes'}" for agent, reason in against)
    return ("Not submitted: not every agent confirmed the answer.\n" + lines
            + "\nRevise the answer (send messages if you need more work) and submit again.")
