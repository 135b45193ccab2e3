"""The one-call baseline: one answer with one script, run, its traceback sent back, 3 tries.

What a user could write in ten lines, on the same endpoint and with the same request
parameters flowmagic sends (seed 0, the server's own temperature): the question, its
constraints and format, the CSV's path and first lines; the model answers with one Python
script, which runs in flowmagic's sandbox (`run_code`, the CSV as a read-only input, the
limits a flow's node code gets). When it fails, or runs but prints no `@name[value]` line,
the error goes back in the same conversation, at most 3 attempts in all. The answer is
what the script printed.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from flowmagic.engine.code_blocks import extract_code
from flowmagic.engine.sandbox import run_code

from dabench import Question, pairs, prompt

__all__ = ["ATTEMPTS", "first_message", "solve"]

ATTEMPTS = 3
CODE_TIMEOUT = 60.0     # a flow node's code_timeout default
MEMORY_MB = 2048        # what flowmagic's node code gets
SYSTEM = "You are an expert data analyst who answers with Python code."


def _head(path: Path, lines: int = 3, limit: int = 1500) -> str:
    with open(path, encoding="utf-8", errors="replace") as fh:
        text = "".join(fh.readline() for _ in range(lines))
    return text[:limit]


def first_message(q: Question) -> str:
    return (f"{prompt(q)}\n\nThe data is the CSV file {q.table}. Its first lines:\n"
            f"{_head(q.table)}\n"
            "Write one complete Python script that reads this file, computes the answer and "
            "prints every value of the answer format on its own line as @name[value]. "
            "Answer with the script in one ```python block.")


def _feedback(code: list[str], run) -> str | None:
    """What goes back to the model, or None when the attempt gave an answer."""
    if not code:
        return "Your answer held no ```python block. Answer with the whole script in one."
    if not run.ok:
        return (f"The script failed:\n{run.error()}\n\nFix it and answer with the whole "
                "corrected script in one ```python block.")
    if not pairs(run.stdout):
        return ("The script ran but printed no @name[value] line. Print every value of the "
                "answer format as @name[value] and answer with the whole script.")
    return None


def _short(code: list[str], run) -> str:
    """The failure in one line, for the results file."""
    if not code:
        return "no python block"
    if not run.ok:
        lines = run.error().strip().splitlines()
        return lines[-1] if lines else "the script failed"
    return "printed no @name[value] line"


def solve(q: Question, client, model: str, calls_log: Path, sandbox: str = "bwrap") -> dict:
    """Run the baseline on one question: {"answer", "attempts", "error", "outputs"}."""
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": first_message(q)}]
    outputs, error = [], None
    for attempt in range(1, ATTEMPTS + 1):
        started = time.monotonic()
        reply = client.chat.completions.create(model=model, messages=messages, seed=0)
        text = reply.choices[0].message.content or ""
        usage = reply.usage
        with open(calls_log, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"prompt_tokens": getattr(usage, "prompt_tokens", 0) or 0,
                                 "completion_tokens": getattr(usage, "completion_tokens", 0) or 0,
                                 "latency_s": round(time.monotonic() - started, 3)}) + "\n")
        code = extract_code(text)
        run = None
        if code:
            run = run_code("\n\n".join(code), inputs=[q.table], timeout=CODE_TIMEOUT,
                           memory_mb=MEMORY_MB, site_packages=True, sandbox=sandbox)
            outputs.append(run.stdout)
        feedback = _feedback(code, run)
        if feedback is None:
            return {"answer": run.stdout, "attempts": attempt, "error": None, "outputs": outputs}
        error = _short(code, run)
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": feedback}]
    return {"answer": outputs[-1] if outputs else None, "attempts": ATTEMPTS, "error": error,
            "outputs": outputs}
