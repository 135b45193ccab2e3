"""The start every model call of a flow on inputs shares, byte for byte.

A server that keeps earlier prompts' states (llama.cpp, Ollama) evaluates only what follows the
longest start a new prompt shares with one of them, and OpenAI's prompt cache bills a shared
start of 1,024 tokens or more at the cached rate. So every node's prompt of a flow with input
files opens alike: the house rules as the system message, then how code runs and what the
inputs hold (with the working start's run once it ran in the flow's session: its code and what
it printed), then the task (without the words about its answer's form: the summary writes that
form), then the working start's code when it did not run; each call's own part comes after.
What comes before the task depends on the inputs alone, so the next flow a kernel runs on the
same inputs (another question about the same table) finds it evaluated too. The plan request
opens the same way up to the working start, the closing summary too (told that what it writes
is not run; with the working start's run when one ran), and the update request with all of it.
On the bench model (one thread, ~40 prompt tokens a second) the start is 700-1,300 tokens:
20-30 s of evaluation a call that does not share it.
"""

from __future__ import annotations

from .._internal.text import cut as text_cut
from .answer_code import instruction_parts
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
    of its code once it ran (then always: every call after it shares it), before the task."""
    example = workspace.example() if working_start and not ran else ""
    data, start = instruction_parts(workspace.describe(), example, ran)
    return "\n\n".join(filter(None, (data, task_part(task, budget), start)))
