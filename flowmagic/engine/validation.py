"""Is a node's output good enough? A structured verdict, never "the reply contains OK".

Three validators:
- "none": every non-empty output passes;
- a callable `(node, output) -> bool | (bool, str) | Verdict`, sync or async, written by the
  user (raising AssertionError is a fail with its message as feedback);
- "llm": a judge call whose answer must be JSON `{"verdict": "pass"|"fail", "feedback",
  "tests"}`. When the output holds Python code, the code (then the judge's tests) runs in
  `flowmagic.engine.sandbox` (under bubblewrap unless `sandbox="none"`); a crash, a timeout
  or a failing test is a fail whatever the judge said. Where the sandbox cannot run,
  `validate` raises SandboxError with the one line saying why and what to do: the code is
  never run another way.

Empty output, or the literal "none" (what a masked node leaves behind), fails in every mode.

A judge answer that cannot be read is a *fail* with source "judge-unparsed": nobody
reviewed the output, so it is not passed off as reviewed; the feedback says the verdict
was unreadable, and the node's bounded attempts decide what happens next.
"""

from __future__ import annotations

import inspect
from dataclasses import asdict, dataclass
from typing import Any, Callable

from ..errors import ConfigError, ModelOutputError
from .._internal.text import cut as text_cut, keep_ends
from ..llm.endpoints import scrub
from .code_blocks import extract_code
from .diagnosis import CODE_FAILED
from .sandbox import arun_code

__all__ = ["Verdict", "JUDGE_SCHEMA", "validate", "retry_turns", "judge_messages"]

JUDGE_SCHEMA = {
    "type": "object",
    "properties": {"verdict": {"enum": ["pass", "fail"]}, "feedback": {"type": "string"},
                   "tests": {"type": "string"}},
    "required": ["verdict", "feedback"],
}
_OUTPUT_CHARS = 8000   # of the output shown to the judge
_FEEDBACK_CHARS = 2000


@dataclass
class Verdict:
    passed: bool
    feedback: str
    source: str   # "none", "empty", "user", "judge", "judge-unparsed", "sandbox"
    tests: str | None = None       # what the judge wrote, when it wrote tests
    sandbox: dict | None = None    # SandboxResult.to_dict() of the code run, if any

    def to_dict(self) -> dict:
        return asdict(self)


def _clip(text: str, limit: int) -> str:
    return keep_ends(text, limit, "\n[... cut ...]\n", reserve=16)


def _is_empty(output: Any) -> bool:
    return not isinstance(output, str) or output.strip().lower() in ("", "none")


def judge_messages(node: Any, output: str, task: str) -> list[dict]:
    """The judge's prompt: the task, the subtask, the output, and what to answer."""
    system = ("You are a strict reviewer in a team of agents. Judge whether an output "
              "fully and correctly does its subtask. Answer with JSON only: "
              '{"verdict": "pass" or "fail", "feedback": "what is wrong and how to fix it '
              '(or why it is fine)", "tests": "optional Python asserts or test_ functions '
              'that check the code in the output; they run after that code"}.')
    user = (f"Overall task:\n{_clip(task or '', 3000)}\n\n"
            f"Subtask {getattr(node, 'id', '?')} (agent: {getattr(node, 'agent', 'assistant')}):\n"
            f"{_clip(getattr(node, 'requirement', '') or '', 3000)}\n\n"
            f"Output to judge:\n{_clip(output, _OUTPUT_CHARS)}\n\n"
            "Does the output do the subtask? Reply with the JSON verdict.")
    return [{"role": "system", "content": system}, {"role": "user", "content": scrub(user)}]


async def _call_user(fn: Callable, node: Any, output: str) -> Verdict:
    name = getattr(fn, "__name__", type(fn).__name__)
    try:
        got = fn(node, output)
        if inspect.isawaitable(got):
            got = await got
    except AssertionError as exc:  # pytest habits: an assert in a validator is a fail
        return Verdict(False, str(exc) or f"rejected by the validator {name}", "user")
    except Exception as exc:  # the user's code is broken, not the node's output
        raise ConfigError(f"the validator {name} raised {type(exc).__name__}: {exc}; "
                          "fix it, or use validate='llm' or 'none'") from exc
    if isinstance(got, Verdict):
        return got
    if isinstance(got, bool):
        return Verdict(got, "" if got else f"rejected by the validator {name}", "user")
    if (isinstance(got, tuple) and len(got) == 2 and isinstance(got[0], bool)
            and isinstance(got[1], (str, type(None)))):
        return Verdict(got[0], got[1] or ("" if got[0] else f"rejected by the validator {name}"),
                       "user")
    raise ConfigError(f"the validator {name} returned {type(got).__name__}; return a bool, "
                      "a (bool, feedback) pair or a Verdict")


def _read_judge(data: Any) -> tuple[str, str, str | None] | str:
    """(verdict, feedback, tests) from the judge's JSON, or why it is unreadable."""
    if not isinstance(data, dict):
        return f"a {type(data).__name__}, not a JSON object"
    verdict = data.get("verdict")
    if not isinstance(verdict, str) or verdict.strip().strip(".!").lower() not in ("pass", "fail"):
        return f"verdict {str(verdict)[:40]!r} is neither 'pass' nor 'fail'"
    feedback = data.get("feedback")
    feedback = feedback if isinstance(feedback, str) else ""
    tests = data.get("tests")
    tests = tests if isinstance(tests, str) and tests.strip() else None
    return verdict.strip().strip(".!").lower(), feedback, tests


async def _judge(node: Any, output: str, task: str, llm: Any, model: str | None,
                 run_id: str | None, max_tokens: int | None) -> tuple[str, str, str | None] | str:
    try:
        reply = await llm.complete(judge_messages(node, output, task), model=model,
                                   schema=JUDGE_SCHEMA, temperature=0, purpose="validate",
                                   max_tokens=max_tokens,
                                   node_id=getattr(node, "id", None), run_id=run_id)
    except ModelOutputError as exc:  # EndpointError goes up: a dead endpoint is not a verdict
        return str(exc)
    return _read_judge(reply.data)


def _tests_parse(tests: str | None) -> bool:
    import ast
    try:
        ast.parse(tests or "")
        return True
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False


async def _run_output_code(blocks: list[str], tests: str | None, timeout: float, sandbox: str):
    """(failure feedback or None, result dict, note) for the output's code blocks."""
    usable_tests = tests if _tests_parse(tests) else None
    note = "" if usable_tests == tests else " (the judge's tests did not parse and were skipped)"
    result = await arun_code("\n\n".join(blocks), tests=usable_tests, timeout=timeout,
                             site_packages=True, sandbox=sandbox)
    if result.ok:
        return None, result.to_dict(), note
    error = result.error()
    if result.stage == "code" and "ModuleNotFoundError" in error.splitlines()[-1]:
        # A package this machine lacks says nothing about the code; do not fail on it.
        return None, result.to_dict(), f" (code not run to the end: {error.splitlines()[-1]})"
    where = {"tests": "failed the tests", "timeout": "did not finish"}.get(result.stage, "crashed")
    if result.stage == "timeout":
        return error.capitalize(), result.to_dict(), note   # "The code did not finish within ..."
    # The first line names the cause (the exception, the failed tests): a node's one-line
    # error is cut from it, and the whole traceback follows for the retry.
    cause = error.strip().splitlines()[-1][:300]
    return f"The code {where}: {cause}\n{_clip(error, _FEEDBACK_CHARS)}", result.to_dict(), note


async def _validate_llm(node: Any, output: str, task: str, llm: Any, model: str | None,
                        run_id: str | None, code_timeout: float, max_tokens: int | None,
                        run_output_code: bool = True, sandbox: str = "bwrap") -> Verdict:
    if llm is None:
        from ..llm.client import get_llm
        llm = get_llm()
    judged = await _judge(node, output, task, llm, model, run_id, max_tokens)
    unreadable = isinstance(judged, str)
    verdict, feedback, tests = ("pass", "", None) if unreadable else judged
    if unreadable:
        verdict = "fail"
        feedback = (f"the reviewer's verdict was unreadable ({_clip(judged, 300)}); "
                    "the output was not accepted without a review")
    blocks = extract_code(output) if run_output_code else []
    if blocks:
        failure, result, note = await _run_output_code(blocks, tests, code_timeout, sandbox)
        if failure is not None:
            judge_said = f"\nThe reviewer said: {_clip(feedback, 600)}" if feedback and not unreadable else ""
            return Verdict(False, failure + judge_said, "sandbox", tests, result)
        feedback += note
        return Verdict(verdict == "pass", feedback.strip(),
                       "judge-unparsed" if unreadable else "judge", tests, result)
    return Verdict(verdict == "pass", feedback.strip(),
                   "judge-unparsed" if unreadable else "judge", tests)


async def validate(node: Any, output: Any, *, task: str = "", mode: Any = "llm", llm: Any = None,
                   model: str | None = None, run_id: str | None = None,
                   code_timeout: float = 10.0, max_tokens: int | None = None,
                   run_output_code: bool = True, sandbox: str = "bwrap") -> Verdict:
    """The verdict on `output` for `node` (see the module docstring for the modes).

    `run_output_code=False` when the output's code already ran in the run's workspace
    (engine/answer_code): its report is part of the output the judge reads.

    Raises ConfigError for an unknown mode or a broken user validator, SandboxError when
    code must run and the sandbox cannot, and lets EndpointError through when the judge's
    endpoint is down (the caller decides).
    """
    if _is_empty(output):
        return Verdict(False, "empty output", "empty")
    if callable(mode):
        return await _call_user(mode, node, output)
    if mode == "none" or mode is None:
        return Verdict(True, "", "none")
    if mode == "llm":
        return await _validate_llm(node, output, task, llm, model, run_id, code_timeout,
                                   max_tokens, run_output_code, sandbox)
    raise ConfigError(f"validate must be 'llm', 'none' or a function (node, output) -> bool, "
                      f"not {mode!r}")


def retry_turns(attempts: list[dict], node_id: str, end: str = "", *,
                answer_chars: int = 4000, printed_chars: int = 1500) -> list[dict]:
    """The conversation after a node's prompt once attempts were rejected: each rejected
    answer as the model's own turn, then what was wrong with it as the user's ([] when none
    was rejected).

    Earlier turns are sent again exactly as they were, so a server that keeps its last
    prompt's state evaluates only the newest feedback; nothing is restated (the answer is
    in its turn, the feedback says only what is wrong and what the fix needs). An answer
    longer than `answer_chars` keeps its head (its start is what a server has cached). A
    turn that did not get its code's output shown otherwise gets what the code printed,
    and each feedback ends with `end` (what to answer) unless it says so itself."""
    rejected = [a for a in attempts or [] if isinstance(a, dict) and not a.get("passed")]
    turns: list[dict] = []
    for n, attempt in enumerate(rejected, 1):
        answer = attempt.get("output")
        if isinstance(answer, str) and answer.strip():
            turns.append({"role": "assistant", "content": text_cut(answer, answer_chars, _CUT)})
        said = _feedback_turn(attempt, n, node_id, end, printed_chars)
        if turns and turns[-1]["role"] == "user":   # an attempt that got no answer
            turns[-1]["content"] += "\n\n" + said
        else:
            turns.append({"role": "user", "content": said})
    return [{**t, "content": scrub(t["content"])} for t in turns]


_CUT = "\n[cut here: {n} more characters not shown]"
_FEEDBACK_TURN_CHARS = 4000   # of one attempt's feedback (a judge's may run long)


def _feedback_turn(attempt: dict, n: int, node_id: str, end: str, printed_chars: int) -> str:
    """What was wrong with one rejected attempt, as the user's turn after it."""
    why = str(attempt.get("feedback") or attempt.get("error") or "no reason given").strip()
    why = text_cut(why, _FEEDBACK_TURN_CHARS, _CUT)   # its head says what to fix
    parts = [f"Your subtask ({node_id}) is not done yet: attempt {n} was rejected.\n{why}"]
    ran = attempt.get("execution") or {}
    printed = str(ran.get("stdout") or "").rstrip()
    if ran.get("ran") and ran.get("ok") and printed and not why.startswith(CODE_FAILED):
        parts.append(f"Your code printed:\n{_clip(printed, printed_chars)}")
    if end and "```python block" not in why:
        parts.append(end)
    return "\n\n".join(parts)
