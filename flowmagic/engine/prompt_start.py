"""The start every model call of a flow on inputs shares, byte for byte.

A server that keeps the last prompt's state (llama.cpp, Ollama) evaluates only what follows the
longest start a new prompt shares with it, and OpenAI's prompt cache bills a shared start of
1,024 tokens or more at the cached rate. So every node's prompt of a flow with input files opens
alike: the house rules as the system message, then the task (without the words about its
answer's form: the summary writes that form), how code runs and what the inputs hold, the working
start (its code; once it ran in the flow's session, its code and what it printed); each call's
own part comes after. The plan request opens the same way up to the working start, the closing
summary too (told that what it writes is not run; with the working start's run when one ran),
and the update request with all of it. On the bench model (one thread, ~40 prompt tokens a
second) the start is 700-1,300 tokens: 20-30 s of evaluation a call that does not share it.
"""

from __future__ import annotations

from .._internal.text import cut as text_cut
from .answer_code import instructions
from .answerform import without_pairs

__all__ = ["HOUSE_RULES", "task_part", "flow_start"]

HOUSE_RULES = ("You are one agent in a team of agents working on one task. Do only your own "
               "subtask, using the results you are given. Give the result itself (text, code "
               "or data), complete and concrete, not a description of it.")


def task_part(task: str, budget: int) -> str:
    """The task as every call of the flow is given it."""
    task = without_pairs(task or "")
    if len(task) > budget // 2:
        task = text_cut(task, budget // 2, "\n[cut here: {n} more characters not shown]")
    return f"Overall task:\n{task}"


def flow_start(task: str, workspace, budget: int, *, working_start: bool = True,
               ran: str = "") -> str:
    """The user message's start of every call of a flow whose workspace holds inputs (the
    node's prompt before its role: `node_runner.node_messages` builds the same text).
    `working_start=False` stops before the working start: shown it, the bench model planned
    its example plot as a subtask of a question that asked for one number. `ran`: the report
    of the working start's run in the flow's session, which the nodes' prompts hold instead
    of its code once it ran (then always: every call after it shares it)."""
    example = workspace.example() if working_start and not ran else ""
    return (f"{task_part(task, budget)}\n\n"
            f"{instructions(workspace.describe(), [], example, ran)}")
