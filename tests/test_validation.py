"""Validation verdicts over real HTTP to a loopback judge, user validators, retry prompts."""

import asyncio
import json

import pytest

import flowmagic
from flowmagic.errors import ConfigError, EndpointError
from flowmagic.model.graph import Node
from flowmagic.llm import LLM
from flowmagic.testing.loopback import LoopbackServer
from flowmagic.store import Store
from flowmagic.engine.validation import JUDGE_SCHEMA, Verdict, retry_turns, validate

pytestmark = pytest.mark.timeout(60)

NODE = Node(id="square", requirement="Write a Python function square(x) returning x * x.",
            agent="coder")
GOOD_CODE = "Here it is:\n```python\ndef square(x):\n    return x * x\n```\n"
CRASHING_CODE = "```python\ndef square(x):\n    return x * x\nsquare(None)\n```\n"
WRONG_CODE = "```python\ndef square(x):\n    return x + x\n```\n"


def judged(output, reply, *, node=NODE, **kwargs):
    """validate(mode="llm") against a loopback judge answering `reply` (dict, str or callable)."""
    seen = []

    def responder(body):
        seen.append(body)
        if callable(reply):
            return reply(body)
        return reply if isinstance(reply, str) else json.dumps(reply)

    async def main(llm):
        try:
            return await validate(node, output, task="Make a tiny maths library.", mode="llm",
                                  llm=llm, run_id="run-1", **kwargs)
        finally:
            await llm.aclose()

    with LoopbackServer(responder=responder) as server:
        flowmagic.configure(base_url=server.base_url, model="judge")
        verdict = asyncio.run(main(LLM(Store(), timeout=5.0, backoff_base=0.01, backoff_max=0.05)))
    return verdict, seen


def test_judge_says_pass():
    verdict, seen = judged("The square of 3 is 9.", {"verdict": "pass", "feedback": "Correct."},
                           max_tokens=200)
    assert verdict == Verdict(True, "Correct.", "judge")
    body = seen[0]
    assert body["max_tokens"] == 200 and body["temperature"] == 0
    assert "The square of 3 is 9." in body["messages"][-1]["content"]
    assert "square(x)" in body["messages"][-1]["content"]   # the requirement is shown
    assert body["response_format"]["json_schema"]["schema"] == JUDGE_SCHEMA


def test_judge_call_is_logged_as_validation():
    judged("The square of 3 is 9.", {"verdict": "pass", "feedback": "ok"})
    calls = Store().recent_calls(5)
    assert calls and calls[0]["purpose"] == "validate"
    assert calls[0]["node_id"] == "square" and calls[0]["run_id"] == "run-1"


def test_judge_says_fail_with_feedback():
    verdict, _ = judged("The square of 3 is 6.",
                        {"verdict": "fail", "feedback": "3 * 3 is 9, not 6."})
    assert not verdict.passed and verdict.source == "judge"
    assert verdict.feedback == "3 * 3 is 9, not 6."


@pytest.mark.parametrize("feedback", ["OK", "Looks OK to me but the number is wrong. OK?",
                                      "PASS"])
def test_ok_inside_a_fail_verdict_is_still_a_fail(feedback):
    verdict, _ = judged("The square of 3 is 6.", {"verdict": "fail", "feedback": feedback})
    assert not verdict.passed and verdict.feedback == feedback


@pytest.mark.parametrize("reply", [
    "OK",                                              # Flow would call this a pass
    "I cannot judge this, sorry.",
    json.dumps({"verdict": "OK", "feedback": "fine"}),  # not in the enum
    json.dumps({"verdict": True, "feedback": "fine"}),
    json.dumps(["pass"]),
])
def test_unreadable_judge_is_a_failure_that_says_so(reply):
    verdict, _ = judged("The square of 3 is 9.", reply)
    assert not verdict.passed and verdict.source == "judge-unparsed"
    assert verdict.feedback.startswith("the reviewer's verdict was unreadable")


def test_code_that_raises_fails_even_when_the_judge_says_pass():
    verdict, _ = judged(CRASHING_CODE, {"verdict": "pass", "feedback": "Great code."})
    assert not verdict.passed and verdict.source == "sandbox"
    assert "crashed" in verdict.feedback and "TypeError" in verdict.feedback
    assert verdict.sandbox["stage"] == "code"


def test_code_that_crashes_fails_even_when_the_judge_is_unreadable():
    verdict, _ = judged(CRASHING_CODE, "no json here")
    assert not verdict.passed and verdict.source == "sandbox"


def test_judge_tests_run_after_the_code():
    tests = "assert square(3) == 9\ndef test_negative():\n    assert square(-2) == 4\n"
    good, _ = judged(GOOD_CODE, {"verdict": "pass", "feedback": "fine", "tests": tests})
    assert good.passed and good.source == "judge" and good.tests == tests
    assert good.sandbox["ok"]
    bad, _ = judged(WRONG_CODE, {"verdict": "pass", "feedback": "fine", "tests": tests})
    assert not bad.passed and bad.source == "sandbox"
    assert "failed the tests" in bad.feedback and "AssertionError" in bad.feedback


def test_judge_tests_that_do_not_parse_are_skipped_not_held_against_the_output():
    verdict, _ = judged(GOOD_CODE, {"verdict": "pass", "feedback": "fine",
                                    "tests": "assert square(3) == = 9"})
    assert verdict.passed and "did not parse" in verdict.feedback


def test_code_that_loops_forever_fails_at_the_code_timeout():
    output = "```python\nwhile True:\n    pass\n```"
    verdict, _ = judged(output, {"verdict": "pass", "feedback": "fine"}, code_timeout=0.5)
    assert not verdict.passed and "did not finish" in verdict.feedback


def test_missing_package_is_not_a_fail():
    output = "```python\nimport surely_not_installed_pkg\n```"
    verdict, _ = judged(output, {"verdict": "pass", "feedback": "fine"})
    assert verdict.passed and "surely_not_installed_pkg" in verdict.feedback


def test_judge_fail_stands_when_the_code_runs():
    verdict, _ = judged(GOOD_CODE, {"verdict": "fail", "feedback": "Add a docstring."})
    assert not verdict.passed and verdict.source == "judge"
    assert verdict.feedback == "Add a docstring." and verdict.sandbox["ok"]


@pytest.mark.parametrize("output", ["", "   ", "none", "None", " NONE\n", None])
def test_empty_output_fails_without_a_judge_call(output):
    verdict, seen = judged(output, {"verdict": "pass", "feedback": "fine"})
    assert verdict == Verdict(False, "empty output", "empty") and seen == []
    assert not asyncio.run(validate(NODE, output, mode="none")).passed


def test_mode_none_passes():
    assert asyncio.run(validate(NODE, "anything", mode="none")) == Verdict(True, "", "none")


def test_dead_judge_endpoint_is_an_endpoint_error():
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    flowmagic.configure(base_url=f"http://127.0.0.1:{port}/v1", model="judge")

    async def main():
        llm = LLM(Store(), timeout=1.0, max_retries=1, backoff_base=0.01, backoff_max=0.02)
        try:
            return await validate(NODE, "text", mode="llm", llm=llm)
        finally:
            await llm.aclose()

    with pytest.raises(EndpointError):
        asyncio.run(main())


# -- user validators ---------------------------------------------------------------------

def _bool(node, output):
    return "9" in output


def _pair(node, output):
    return ("9" in output, "the answer must mention 9")


async def _async_pair(node, output):
    await asyncio.sleep(0)
    return "9" in output, "async says no"


def _verdict(node, output):
    return Verdict("9" in output, "custom", "mine")


def _asserting(node, output):
    assert "9" in output, f"{node.id}: expected a 9"
    return True


@pytest.mark.parametrize("fn, feedback", [
    (_bool, "rejected by the validator _bool"),
    (_pair, "the answer must mention 9"),
    (_async_pair, "async says no"),
    (_verdict, "custom"),
    (_asserting, "square: expected a 9"),
])
def test_callable_validators_of_each_shape(fn, feedback):
    good = asyncio.run(validate(NODE, "it is 9", mode=fn))
    bad = asyncio.run(validate(NODE, "it is 6", mode=fn))
    assert good.passed and not bad.passed
    assert bad.feedback.startswith(feedback)  # pytest rewrites asserts: it may add detail
    assert bad.source == ("mine" if fn is _verdict else "user")


def test_rejecting_lambda_is_named_in_the_feedback():
    verdict = asyncio.run(validate(NODE, "text", mode=lambda node, output: False))
    assert verdict == Verdict(False, "rejected by the validator <lambda>", "user")


@pytest.mark.parametrize("fn, message", [
    (lambda node, output: "yes", "returned str"),
    (lambda node, output: 1 / 0, "raised ZeroDivisionError"),
])
def test_broken_user_validators_are_config_errors(fn, message):
    with pytest.raises(ConfigError, match=message):
        asyncio.run(validate(NODE, "text", mode=fn))


def test_unknown_mode_is_a_config_error():
    with pytest.raises(ConfigError, match="validate must be"):
        asyncio.run(validate(NODE, "text", mode="strict"))


# -- retry prompts -------------------------------------------------------------------------

def test_retry_turns_give_each_rejected_answer_as_its_turn_then_what_was_wrong():
    attempts = [{"output": "first try", "feedback": "too short", "passed": False},
                {"output": "second try", "feedback": "wrong number", "passed": False}]
    turns = retry_turns(attempts, "sq", "Write the result of your subtask now.")
    assert [t["role"] for t in turns] == ["assistant", "user", "assistant", "user"]
    assert [turns[0]["content"], turns[2]["content"]] == ["first try", "second try"]
    assert turns[1]["content"] == ("Your subtask (sq) is not done yet: attempt 1 was rejected.\n"
                                   "too short\n\nWrite the result of your subtask now.")
    assert "wrong number" in turns[3]["content"] and "too short" not in turns[3]["content"]


def test_retry_turns_skip_passed_attempts_and_merge_an_attempt_without_an_answer():
    assert retry_turns([], "a") == [] and retry_turns(None, "a") == []
    assert retry_turns([{"output": "x", "feedback": "", "passed": True}], "a") == []
    turns = retry_turns([{"output": None, "error": "injected failure", "passed": False},
                         {"output": None, "error": "injected failure", "passed": False}], "a")
    assert [t["role"] for t in turns] == ["user"]
    assert turns[0]["content"].count("injected failure") == 2


def test_retry_turns_show_what_code_that_ran_printed_and_cut_a_long_answer():
    ran = {"ran": True, "ok": True, "stdout": "mean 7.5\n"}
    turns = retry_turns([{"output": "x" * 50_000, "feedback": "the numbers 9.1 trace nowhere",
                          "execution": ran, "passed": False}], "a", answer_chars=1000)
    assert turns[0]["content"].startswith("x" * 1000) and len(turns[0]["content"]) < 1100
    assert "Your code printed:\nmean 7.5" in turns[1]["content"]


def test_retry_turns_keep_a_long_feedback_to_its_head():
    turns = retry_turns([{"output": "a", "feedback": "FIX THIS " + "z" * 20_000,
                          "passed": False}], "a", "End.")
    assert "FIX THIS" in turns[1]["content"] and len(turns[1]["content"]) < 4_300
    assert turns[1]["content"].endswith("End.")
