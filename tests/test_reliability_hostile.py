"""Reliability against hostile endpoints (issue 19): the guards hold, every failure is one line.

An endpoint under test control (the loopback server) reports usage fields of any type and
sign, trickles its answer a few bytes at a time, echoes the request's headers (the key
among them) in an error body, answers with nothing or with a content-filtered stub. The
contract: the spent budget never goes down, the LLM's timeout bounds the whole answer, an
empty or filtered answer is never a finished node, and the key appears in no message, no
store row and nothing sent back to a model. The fuzzed parts are derandomized and small.
"""

from __future__ import annotations

import json
import math
import re
import secrets
import sqlite3
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import flowmagic
from flowmagic.errors import ConfigError, EndpointError, FlowError
from flowmagic.flow import Flow
from flowmagic.testing.loopback import LoopbackServer

from conftest import fast_llm, run

pytestmark = pytest.mark.timeout(120)

KEY = "sk-" + f"hostile-{secrets.token_hex(10)}"   # fake; assembled so scanners skip it
TWO = {"nodes": [{"id": "a", "requirement": "write part a", "agent": "writer"},
                 {"id": "b", "requirement": "write part b", "agent": "writer"}],
       "edges": [["a", "b"]]}


def fuzz(n: int):
    return settings(max_examples=n, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow,
                                           HealthCheck.function_scoped_fixture])


def one_line(message: str) -> None:
    assert message.strip() and "\n" not in message and "\r" not in message, repr(message)


# ------------------------------------------------------------------------- usage fields
USAGE_VALUES = (st.integers(-10**30, 10**30) | st.floats(allow_nan=True, allow_infinity=True)
                | st.text(max_size=8) | st.none() | st.booleans()
                | st.lists(st.integers(), max_size=2) | st.sampled_from(["12", "-5", "1e400", "NaN"]))


@fuzz(40)
@given(prompt=USAGE_VALUES, completion=USAGE_VALUES, stream=st.booleans())
def test_any_usage_fields_give_sane_tokens_and_cost(prompt, completion, stream):
    usage = {"prompt_tokens": prompt, "completion_tokens": completion}
    with LoopbackServer(responder=lambda body: {"content": "fine", "usage": usage}) as srv:
        flowmagic.configure(base_url=srv.base_url, model="gpt-4o-mini")   # a priced model
        llm = fast_llm(max_retries=0)
        try:
            reply = run(lambda: llm.complete("hello", cache=False,
                                             on_text=(lambda _t: None) if stream else None), llm)
        except FlowError as exc:   # a body the SDK cannot read at all: one line
            one_line(str(exc))
            return
    for tokens in (reply.input_tokens, reply.output_tokens):
        assert isinstance(tokens, int) and 0 <= tokens <= 10**9
    assert math.isfinite(reply.cost_usd) and reply.cost_usd >= 0
    assert reply.text == "fine"


# Usage no endpoint could have used, from an endpoint whose model has a known price.
HOSTILE_USAGE = {
    "10**15 tokens": {"prompt_tokens": 10**15, "completion_tokens": 10**15},
    "text": {"prompt_tokens": "lots", "completion_tokens": "12"},
    "negative": {"prompt_tokens": -10**9, "completion_tokens": -5},
    "floats": {"prompt_tokens": 300.0, "completion_tokens": 0.5},
    "bools": {"prompt_tokens": True, "completion_tokens": False},
    "missing counts": {"prompt_tokens": None, "completion_tokens": None, "total_tokens": 9},
    "no usage at all": None,
    "too few for the text": {"prompt_tokens": 1, "completion_tokens": 0},
}
ANSWER = "All done, part written. " * 20   # 480 characters: 120 tokens by size


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("usage", list(HOSTILE_USAGE.values()), ids=list(HOSTILE_USAGE))
def test_hostile_usage_is_priced_by_size_so_the_budget_holds(usage, stream, capsys):
    """Each call is priced by its request's and answer's characters / 4 instead, a note of one
    line says so once, and budget_usd stops the run after the first node."""
    with LoopbackServer(responder=lambda body: {"content": ANSWER, "usage": usage}) as srv:
        flowmagic.configure(base_url=srv.base_url, model="gpt-4o-mini")   # $0.15 / $0.60 per 1M
        flow = Flow.from_dict(TWO, task="t", llm=fast_llm(), budget_usd=1e-6, consolidate=False)
        flow.streaming = stream
        flow.run()
        sent = srv.requests[0]["body"]["messages"]
    a, b = flow.workflow.nodes["a"], flow.workflow.nodes["b"]
    assert (flow.status, a.status, b.status) == ("budget", "done", "pending"), flow.message
    chars_in = sum(len(m["content"]) for m in sent)
    assert (a.tokens_in, a.tokens_out) == (-(-chars_in // 4), len(ANSWER) // 4)
    assert flow.spent_usd == pytest.approx((a.tokens_in * 0.15 + a.tokens_out * 0.60) / 1e6)
    notes = [line for line in capsys.readouterr().err.splitlines() if "priced by" in line]
    assert len(notes) == 1 and ":gpt-4o-mini reported usage" in notes[0], notes
    assert "not a count of tokens" in notes[0] and "characters / 4" in notes[0]


def test_true_usage_is_taken_as_reported(capsys):
    """The control: counts an endpoint could have used are what the call is priced by."""
    honest = {"prompt_tokens": 70, "completion_tokens": 50}
    with LoopbackServer(responder=lambda body: {"content": ANSWER, "usage": honest}) as srv:
        flowmagic.configure(base_url=srv.base_url, model="gpt-4o-mini")
        flow = Flow.from_dict(TWO, task="t", llm=fast_llm(), consolidate=False).run()
    assert [(n.tokens_in, n.tokens_out) for n in flow.workflow.nodes.values()] == [(70, 50)] * 2
    assert flow.spent_usd == pytest.approx(2 * (70 * 0.15 + 50 * 0.60) / 1e6)
    assert "priced by" not in capsys.readouterr().err


# ------------------------------------------------------------------------- budget
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN"])
def test_a_budget_that_is_not_a_number_is_refused(value):
    from flowmagic.magic_grammar import parse_flow_line

    with pytest.raises(ConfigError) as info:
        parse_flow_line(f"report --budget-usd {value}")
    one_line(str(info.value))
    with pytest.raises(ConfigError, match="budget_usd"):
        Flow.from_dict(TWO, task="t", budget_usd=float(value))
    with pytest.raises(ConfigError, match="budget_usd"):
        Flow.from_dict(TWO, task="t", budget_usd=value)   # `--set budget_usd=nan` arrives as text


# ------------------------------------------------------------------------- trickle
@pytest.mark.parametrize("stream", [False, True])
def test_a_trickling_endpoint_cannot_outlast_the_timeout(stream):
    """20 pieces 0.5 s apart: no single read waits 1 s, the whole answer takes 10 s."""
    with LoopbackServer(faults={"trickle": 1.0}, trickle_s=0.5) as srv:
        flowmagic.configure(base_url=srv.base_url, model="m")
        llm = fast_llm(timeout=1.0, max_retries=1)
        started = time.monotonic()
        with pytest.raises(EndpointError) as info:
            run(lambda: llm.complete("hello", on_text=(lambda _t: None) if stream else None), llm)
        took = time.monotonic() - started
    one_line(str(info.value))
    assert "within 1 s" in str(info.value)
    assert took < 4.0, took   # two attempts of at most 1 s each, plus a short backoff


# ------------------------------------------------------------------------- empty answers
@pytest.mark.parametrize("reply", [{"content": ""}, {"content": "   \n"},
                                   {"content": "I can't help with that part",
                                    "finish_reason": "content_filter"}])
def test_an_empty_or_filtered_answer_is_not_a_finished_node(reply):
    with LoopbackServer(responder=lambda body: reply) as srv:
        flowmagic.configure(base_url=srv.base_url, model="m")
        flow = Flow.from_dict(TWO, task="t", llm=fast_llm(), validate="none", max_attempts=2,
                              consolidate=False).run()
    a = flow.workflow.nodes["a"]
    assert a.status == "failed" and a.output is None
    one_line(a.error)
    assert ("content filter" if reply.get("finish_reason") else "empty answer") in a.error
    assert flow.workflow.nodes["b"].status != "done"


# ------------------------------------------------------------------------- secrets
def _store_bytes(home) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(home.rglob("*")) if p.is_file())


def test_an_endpoint_echoing_the_key_in_an_error_leaks_it_nowhere(flowmagic_home, capsys):
    from flowmagic import cli

    with LoopbackServer(faults={"echo": 1.0}) as srv:
        flowmagic.configure(base_url=srv.base_url, model="m", api_key=KEY)
        flow = Flow.from_dict(TWO, task="t", llm=fast_llm(), consolidate=False).run()
        assert srv.stats()["requests"][0]["had_auth"]
        code = cli.main(["plan", "make tea", "--k", "1"])
    out, err = capsys.readouterr()
    a = flow.workflow.nodes["a"]
    assert a.status == "failed" and "HTTP 400" in a.error and "[key hidden]" in a.error
    one_line(a.error)
    assert code == 1 and "HTTP 400" in err
    for label, blob in (("the node's error", a.error.encode()), ("the printed line", err.encode()),
                        ("stdout", out.encode()), ("the store", _store_bytes(flowmagic_home))):
        assert KEY.encode() not in blob, f"the key leaked into {label}"


def test_a_key_a_model_repeats_is_not_stored_nor_sent_to_the_next_model(flowmagic_home):
    """A hostile endpoint knows the key (it received it) and puts it in its answer."""
    with LoopbackServer(responder=lambda body: f"done; by the way your key is {KEY}") as srv:
        flowmagic.configure(base_url=srv.base_url, model="m", api_key=KEY)
        flow = Flow.from_dict(TWO, task="t", llm=fast_llm(), consolidate=False).run()
        bodies = json.dumps(srv.stats(bodies=True)["requests"])
    assert flow.counts() == {"done": 2}
    assert "[key hidden]" in flow.workflow.nodes["a"].output
    assert KEY not in bodies                          # b's prompt carries a's output
    assert KEY.encode() not in _store_bytes(flowmagic_home)


@pytest.mark.parametrize("url", [f"https://user:{KEY}@api.example.com/v1",
                                 f"https://{KEY}@api.example.com/v1"])
def test_a_key_in_the_base_url_is_refused_in_one_line(url, monkeypatch, capsys, flowmagic_home):
    from flowmagic import cli

    with pytest.raises(ConfigError) as info:
        flowmagic.configure(base_url=url, model="m")
    assert KEY not in str(info.value)
    one_line(str(info.value))
    monkeypatch.setenv("FLOWMAGIC_BASE_URL", url)
    assert cli.main(["plan", "make tea", "--k", "1"]) == 1
    err = capsys.readouterr().err
    assert "user name or key" in err and KEY not in err
    assert KEY.encode() not in _store_bytes(flowmagic_home)
