"""The loopback server, driven over real HTTP by the openai SDK."""

import asyncio
import json
import math
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import jsonschema
import openai
import pytest
from openai import AsyncOpenAI, OpenAI

from flowmagic.errors import ConfigError
from flowmagic.testing.loopback import ENGINES, FAULT_KINDS, LoopbackServer, embed_text, schema_example
from flowmagic.testing.loopback_asyncio import UNSERVED_FAULTS

pytestmark = pytest.mark.timeout(60)
ROOT = Path(__file__).resolve().parent.parent

MESSAGES = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Summarise the data set\nand then some more"}]
ECHO = "Loopback reply to: Summarise the data set"

NESTED = {
    "type": "object",
    "required": ["title", "steps", "meta", "kind", "maybe"],
    "properties": {
        "title": {"type": "string", "minLength": 3},
        "steps": {"type": "array", "minItems": 2, "items": {"$ref": "#/$defs/Step"}},
        "meta": {"type": "object", "required": ["count", "ok"],
                 "properties": {"count": {"type": "integer", "minimum": 1}, "ok": {"type": "boolean"}}},
        "kind": {"enum": ["plan", "report"]},
        "maybe": {"anyOf": [{"type": "number", "exclusiveMinimum": 2}, {"type": "null"}]},
        "optional": {"type": "string"},
    },
    "$defs": {"Step": {"type": "object", "required": ["id", "after"],
                       "properties": {"id": {"type": "string", "pattern": "^[a-z]+$"},
                                      "after": {"type": "array", "items": {"type": "string"}}}}},
    "additionalProperties": False,
}


@pytest.fixture(autouse=True)
def no_leftover_threads():
    yield
    assert not [t.name for t in threading.enumerate() if t.name.startswith("loopback")]


@pytest.fixture(params=ENGINES)
def server(request):
    with LoopbackServer(engine=request.param) as srv:
        yield srv


def client_for(srv, **kw):
    return OpenAI(base_url=srv.base_url, api_key="sk-test", max_retries=0, **kw)


def chat(srv, messages=MESSAGES, client=None, **kw):
    if client is not None:  # building a client costs ~0.1 s, so loops reuse one
        return client.chat.completions.create(model="test-model", messages=messages, **kw)
    with client_for(srv, timeout=kw.pop("timeout", 10)) as client:
        return client.chat.completions.create(model="test-model", messages=messages, **kw)


def test_plain_completion(server):
    reply = chat(server)
    assert reply.choices[0].message.content == ECHO
    assert reply.choices[0].finish_reason == "stop"
    assert reply.model == "test-model"
    assert reply.usage.prompt_tokens > 0 and reply.usage.completion_tokens > 0
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    assert server.calls == 1 and server.requests[0]["path"] == "/v1/chat/completions"
    assert chat(server).usage == reply.usage  # deterministic token counts


def test_streaming_with_usage(server):
    plain = chat(server)
    with client_for(server) as client:
        stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True,
                                                stream_options={"include_usage": True})
        with stream:
            chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage == plain.usage
    assert server.calls == 2


def test_stream_without_usage_has_no_usage_chunk(server):
    with client_for(server) as client:
        with client.chat.completions.create(model="m", messages=MESSAGES, stream=True) as stream:
            chunks = list(stream)
    assert all(c.choices and c.usage is None for c in chunks)


def test_json_schema_rejected_like_llama_cpp():
    schema_format = {"type": "json_schema", "json_schema": {"name": "plan", "schema": NESTED}}
    with LoopbackServer(reject_json_schema=True) as srv:
        with pytest.raises(openai.InternalServerError, match="json_schema"):
            chat(srv, response_format=schema_format)
        # llama-cpp-python's accepted form: json_object with the schema beside the type
        reply = chat(srv, response_format={"type": "json_object", "schema": NESTED})
        jsonschema.validate(json.loads(reply.choices[0].message.content), NESTED)
        assert srv.calls == 1


def test_default_json_reply_valid_for_nested_schema(server):
    fmt = {"type": "json_schema", "json_schema": {"name": "plan", "schema": NESTED, "strict": True}}
    data = json.loads(chat(server, response_format=fmt).choices[0].message.content)
    jsonschema.validate(data, NESTED)
    assert len(data["steps"]) == 2 and "optional" not in data
    assert json.loads(chat(server, response_format={"type": "json_object"}).choices[0].message.content) == {}


@pytest.mark.parametrize("schema, expected", [
    ({"type": "string"}, "x"),
    ({"type": "integer", "minimum": 2.5}, 3),
    ({"type": "number", "maximum": -4}, -4),
    ({"type": ["null", "boolean"]}, False),
    ({"type": "array", "items": {"type": "integer"}}, []),
    ({"enum": ["a", "b"]}, "a"),
    ({"const": 7}, 7),
    ({"type": "string", "format": "date"}, "2000-01-01"),
    ({"allOf": [{"required": ["a"], "properties": {"a": {"type": "number"}}},
                {"required": ["b"], "properties": {"b": {"type": "null"}}}]}, {"a": 0, "b": None}),
    ({"$ref": "#/definitions/Node",
      "definitions": {"Node": {"type": "object", "required": ["next"],
                               "properties": {"next": {"$ref": "#/definitions/Node"}}}}},
     None),  # a recursive schema ends (at the depth bound) instead of looping
])
def test_schema_example(schema, expected):
    value = schema_example(schema)
    if expected is None:
        depth = 0
        while isinstance(value, dict):
            value, depth = value["next"], depth + 1
        assert value is None and 10 < depth < 100
    else:
        assert value == expected


def _observe(kind, **options):
    with LoopbackServer(faults={kind: 1.0}, hang_s=30, trickle_s=0.1, **options) as srv:
        started = time.monotonic()
        try:
            outcome = chat(srv, timeout=0.5)
        except (openai.APIError, ValueError) as exc:  # garbage: the SDK's json.JSONDecodeError
            outcome = exc
        return outcome, srv.stats(), started


@pytest.mark.parametrize("kind, engine", [(k, e) for e in ENGINES for k in FAULT_KINDS
                                          if not (e == "asyncio" and k in UNSERVED_FAULTS)])
def test_each_fault_kind(kind, engine):
    outcome, stats, started = _observe(kind, retry_after=0.25, engine=engine)
    assert stats["faults"][kind] == 1 and stats["requests"][0]["fault"] == kind
    if kind == "429":
        assert isinstance(outcome, openai.RateLimitError)
        assert outcome.response.headers["retry-after"] == "0.25"
    elif kind == "500":
        assert isinstance(outcome, openai.InternalServerError)
    elif kind in ("hang", "stall"):   # a stall is a hang for a plain answer
        assert isinstance(outcome, openai.APITimeoutError)
        assert time.monotonic() - started < 5  # stop() woke the hanging handler
    elif kind == "truncated":
        assert isinstance(outcome, openai.APIConnectionError)
    elif kind == "garbage":
        assert isinstance(outcome, json.JSONDecodeError)
    elif kind == "401":
        assert isinstance(outcome, openai.AuthenticationError)
    elif kind == "echo":   # the key is in the message: flowmagic must scrub it
        assert isinstance(outcome, openai.BadRequestError) and "sk-test" in str(outcome)
    elif kind == "trickle":   # a whole answer, slower than the 0.5 s timeout of any one read
        assert outcome.choices[0].message.content.startswith(ECHO)
        assert time.monotonic() - started > 1.0
    else:
        assert outcome.choices[0].finish_reason == "length"
        assert outcome.choices[0].message.content == ECHO[: len(ECHO) // 2]
    assert stats["calls"] == (1 if kind in ("length", "trickle") else 0)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("kind", ["truncated", "garbage", "length"])
def test_fault_kinds_in_streams(kind, engine):
    with LoopbackServer(faults={kind: 1.0}, engine=engine) as srv, client_for(srv) as client:
        def text():
            with client.chat.completions.create(model="m", messages=MESSAGES, stream=True) as stream:
                return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        if kind == "length":
            assert text() == ECHO[: len(ECHO) // 2]
        else:
            with pytest.raises((openai.APIError, ValueError)):
                text()


def test_slots_serve_one_at_a_time_and_are_reported_like_llama_cpp():
    with LoopbackServer(slots=1, latency=0.2) as srv:
        props = json.loads(subprocess.run(   # GET /props, as a client learns the slots
            [sys.executable, "-c", "import sys, urllib.request; print(urllib.request.urlopen("
             f"'{srv.base_url[:-3]}/props').read().decode())"],
            capture_output=True, text=True, check=True).stdout)
        assert props["total_slots"] == 1
        started = time.monotonic()
        threads = [threading.Thread(target=chat, args=(srv,)) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # held at once: all three; served at once: one, so their latencies add up
        assert srv.max_in_flight == 3 and srv.calls == 3
        assert time.monotonic() - started >= 0.6
    with LoopbackServer() as srv:   # no slots: no /props, as a server without them
        with pytest.raises(Exception):
            subprocess.run([sys.executable, "-c", "import urllib.request; urllib.request.urlopen("
                            f"'{srv.base_url[:-3]}/props')"], check=True, capture_output=True)


def test_a_paced_stream_is_steady_and_a_stalled_one_stops():
    with LoopbackServer(stream_s=0.05) as srv, client_for(srv) as client:
        times = []
        with client.chat.completions.create(model="m", messages=MESSAGES, stream=True) as stream:
            for _ in stream:
                times.append(time.monotonic())
        gaps = [b - a for a, b in zip(times, times[1:])]
        assert len(gaps) > 4 and min(gaps) > 0.03
    with LoopbackServer(faults={"stall": 1.0}, hang_s=30) as srv, client_for(srv, timeout=0.5) as client:
        got = []
        with pytest.raises(openai.APITimeoutError):
            with client.chat.completions.create(model="m", messages=MESSAGES, stream=True) as stream:
                for chunk in stream:
                    got.append(chunk)
        assert len(got) == 3   # its first events came, then nothing


def _outcomes(seed, attempts=6, **options):
    with LoopbackServer(seed=seed, **options) as srv, client_for(srv) as client:
        results = []
        for _ in range(attempts):
            try:
                chat(srv, client=client)
                results.append("ok")
            except openai.InternalServerError:
                results.append("500")
        return results, [r["attempt"] for r in srv.requests]


def test_faults_are_deterministic_and_retries_can_succeed():
    first, attempts = _outcomes(3, faults={"500": 0.5})
    assert first == _outcomes(3, faults={"500": 0.5})[0]
    assert attempts == list(range(6))
    assert "ok" in first and "500" in first  # same body, different attempt, different fate
    assert _outcomes(3, attempts=4, fail_first=2)[0] == ["500", "500", "ok", "ok"]


def test_fail_first_with_another_kind():
    with LoopbackServer(fail_first=1, fail_kind="429") as srv:
        with pytest.raises(openai.RateLimitError):
            chat(srv)
        assert chat(srv).choices[0].message.content == ECHO
    with pytest.raises(ConfigError, match="fail_kind"):
        LoopbackServer(fail_kind="503")


def test_fault_rates_are_validated():
    with pytest.raises(ConfigError, match="unknown fault"):
        LoopbackServer(faults={"503": 0.1})
    with pytest.raises(ConfigError, match="sum to at most 1"):
        LoopbackServer(faults={"429": 0.6, "500": 0.6})
    with pytest.raises(ConfigError, match="lo <= hi"):
        LoopbackServer(latency=(0.5, 0.1))


def _latencies(bodies, order, engine="threads"):
    with LoopbackServer(latency=(0.02, 0.12), seed=5, engine=engine) as srv, client_for(srv) as client:
        for i in order:
            chat(srv, messages=bodies[i], client=client)
        return {json.dumps(r["body"]["messages"]): (r["latency_s"], r["finished"] - r["arrived"])
                for r in srv.requests}


def test_latency_is_deterministic_and_spread_within_range():
    bodies = [[{"role": "user", "content": f"task {i}"}] for i in range(12)]
    forward = _latencies(bodies, range(12))
    backward = _latencies(bodies, reversed(range(12)))
    assert {k: v[0] for k, v in forward.items()} == {k: v[0] for k, v in backward.items()}
    values = [v[0] for v in forward.values()]
    assert all(0.02 <= v <= 0.12 for v in values)
    assert max(values) - min(values) > 0.04  # spread, not a constant
    assert all(elapsed >= latency for latency, elapsed in forward.values())
    on_a_loop = _latencies(bodies, range(12), engine="asyncio")
    assert {k: v[0] for k, v in on_a_loop.items()} == {k: v[0] for k, v in forward.items()}
    assert all(elapsed >= latency for latency, elapsed in on_a_loop.values())


@pytest.mark.parametrize("engine", ENGINES)
def test_latency_runs_from_arrival_so_the_servers_own_work_is_inside_it(engine):
    # A benchmark's bound is the sum of the latencies: a server that took its own time on top
    # (reading the body, building the reply) would put that time on every client's account.
    def slow_responder(body):
        time.sleep(0.25)
        return "built slowly"

    with LoopbackServer(latency=0.5, responder=slow_responder, engine=engine) as srv, \
            client_for(srv) as client:
        chat(srv, client=client)  # the connection is open: the next request measures the server alone
        started = time.monotonic()
        assert chat(srv, client=client).choices[0].message.content == "built slowly"
        elapsed = time.monotonic() - started
    assert 0.5 <= elapsed < 0.7, elapsed  # 0.75 s when the latency came after the reply's building
    last = srv.requests[-1]
    assert last["finished"] - last["arrived"] >= 0.5


def test_the_asyncio_engine_refuses_the_faults_that_hold_a_connection():
    for options in ({"faults": {"hang": 0.1}}, {"faults": {"trickle": 1.0}},
                    {"fail_first": 1, "fail_kind": "hang"}):
        with pytest.raises(ConfigError, match=r"asyncio engine does not serve.*engine='threads'"):
            LoopbackServer(engine="asyncio", **options)
    with pytest.raises(ConfigError, match="engine 'fibers' is not one of"):
        LoopbackServer(engine="fibers")
    LoopbackServer(engine="asyncio", faults={"hang": 0.0, "429": 0.5})  # a zero rate is no fault


def test_the_asyncio_engine_answers_hundreds_of_connections_at_once():
    n = 300

    async def one(port: int, i: int) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": f"job {i}"}]}).encode()
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        head = await reader.readuntil(b"\r\n\r\n")
        size = int(re.search(rb"Content-Length: (\d+)", head).group(1))
        reply = await reader.readexactly(size)
        writer.close()
        return head.split(b"\r\n", 1)[0] + b" " + reply

    async def run(port: int) -> list[bytes]:
        return await asyncio.gather(*(one(port, i) for i in range(n)))

    with LoopbackServer(latency=(0.3, 0.4), engine="asyncio") as srv:
        port = int(srv.base_url.rsplit(":", 1)[1].split("/")[0])
        replies = asyncio.run(run(port))
        assert all(r.startswith(b"HTTP/1.1 200 OK ") for r in replies)
        texts = [json.loads(r.split(b" ", 3)[3])["choices"][0]["message"]["content"] for r in replies]
        assert texts == [f"Loopback reply to: job {i}" for i in range(n)]
        assert srv.calls == n and srv.max_in_flight == n and srv.in_flight == 0
        # every reply waited its whole latency after its request arrived, never less
        assert all(r["finished"] - r["arrived"] >= r["latency_s"] for r in srv.requests)


def test_latency_callable_and_zero():
    with LoopbackServer(latency=lambda body: 0.05 * len(body["messages"])) as srv:
        chat(srv)
        assert srv.requests[0]["latency_s"] == pytest.approx(0.1)
    with LoopbackServer(latency=0) as srv:
        chat(srv)
        assert srv.requests[0]["latency_s"] == 0


@pytest.mark.parametrize("engine", ENGINES)
def test_max_in_flight_with_concurrent_async_requests(engine):
    async def run(srv):
        async with AsyncOpenAI(base_url=srv.base_url, api_key="sk-test", max_retries=0) as client:
            return await asyncio.gather(*(
                client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"job {i}"}])
                for i in range(8)))

    with LoopbackServer(latency=0.4, engine=engine) as srv:
        started = time.monotonic()
        replies = asyncio.run(run(srv))
        elapsed = time.monotonic() - started
        texts = [r.choices[0].message.content for r in replies]
        assert texts == [f"Loopback reply to: job {i}" for i in range(8)]
        assert srv.max_in_flight == 8 and srv.in_flight == 0 and srv.calls == 8
        assert elapsed < 8 * 0.4 / 2  # they overlapped
        srv.reset()
        assert (srv.calls, srv.max_in_flight, srv.requests) == (0, 0, [])


@pytest.mark.parametrize("engine", ENGINES)
def test_spawn_runs_in_another_process_and_stops(engine):
    handle = LoopbackServer.spawn(latency=(0.01, 0.02), seed=1, faults={"500": 0.0}, model="spawned",
                                  engine=engine)
    try:
        with OpenAI(base_url=handle.base_url, api_key="sk-test", max_retries=0) as client:
            assert client.models.list().data[0].id == "spawned"
            reply = client.chat.completions.create(model="m", messages=MESSAGES)
        assert reply.choices[0].message.content == ECHO
        stats = handle.stats()
        assert stats["calls"] == 1
        assert [r["path"] for r in stats["requests"]] == ["/v1/models", "/v1/chat/completions"]
        assert handle.stats(bodies=True)["requests"][1]["body"]["messages"] == MESSAGES
        handle.reset()
        assert handle.stats()["requests"] == []
    finally:
        handle.stop()
    assert handle._proc.returncode is not None
    with pytest.raises(ConfigError, match="callable"):
        LoopbackServer.spawn(responder=lambda body: "x")


def test_spawn_failure_reports_the_child_stderr(server):
    taken = int(server.base_url.rsplit(":", 1)[1].split("/")[0])
    with pytest.raises(RuntimeError, match="did not start(.|\n)*Address already in use"):
        LoopbackServer.spawn(port=taken)


def test_command_line_prints_one_url_line_and_exits():
    argv = [sys.executable, "-m", "flowmagic.testing.loopback", "--latency", "0.1:0.8", "--seed", "1",
            "--port", "0", "--lifetime", "0.5"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/v1\n", done.stdout)


def test_headers_recorded_without_the_key(server):
    chat(server)
    record = server.requests[0]
    assert record["had_auth"] is True
    assert record["headers"]["authorization"] == "REDACTED"
    assert "sk-test" not in json.dumps(server.requests)


def test_responder_dicts_tool_calls_and_usage():
    def responder(body):
        if body.get("tools"):
            call = {"function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}
            return {"message": {"role": "assistant", "content": None, "tool_calls": [call]}}
        return {"content": "fixed", "usage": {"prompt_tokens": 11, "completion_tokens": 3}}

    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    with LoopbackServer(responder=responder) as srv:
        reply = chat(srv, tools=tools)
        call = reply.choices[0].message.tool_calls[0]
        assert (call.function.name, reply.choices[0].finish_reason) == ("add", "tool_calls")
        assert json.loads(call.function.arguments) == {"a": 1, "b": 2}
        plain = chat(srv)
        assert plain.choices[0].message.content == "fixed"
        assert (plain.usage.prompt_tokens, plain.usage.total_tokens) == (11, 14)
        with client_for(srv) as client:
            stream = client.chat.completions.create(model="m", messages=MESSAGES, tools=tools, stream=True)
            with stream:
                deltas = [c.choices[0].delta for c in stream if c.choices]
        streamed = [tc for d in deltas for tc in d.tool_calls or []]   # the arguments in pieces
        assert streamed[0].function.name == "add" and len(streamed) > 1
        assert "".join(tc.function.arguments or "" for tc in streamed) == '{"a": 1, "b": 2}'


def test_responder_error_is_a_500():
    with LoopbackServer(responder=lambda body: 1 / 0) as srv:
        with pytest.raises(openai.InternalServerError, match="ZeroDivisionError"):
            chat(srv)


def test_embeddings_are_unit_vectors_and_similar_texts_are_close(server):
    texts = ["load the csv file and plot columns", "load the csv file and plot rows",
             "quantum chromodynamics"]
    with client_for(server) as client:
        got = client.embeddings.create(model="e", input=texts).data  # the SDK asks for base64
        floats = client.embeddings.create(model="e", input=texts[0], encoding_format="float").data[0]
    vecs = [d.embedding for d in got]
    assert all(len(v) == 64 and math.isclose(sum(x * x for x in v), 1, rel_tol=1e-5) for v in vecs)
    assert floats.embedding == pytest.approx(vecs[0], abs=1e-6)
    assert embed_text(texts[0]) == pytest.approx(vecs[0], abs=1e-6)

    def cos(a, b):
        return sum(x * y for x, y in zip(a, b))
    assert cos(vecs[0], vecs[1]) > 0.7 > cos(vecs[0], vecs[2])


@pytest.mark.parametrize("engine", ENGINES)
def test_stop_closes_idle_keep_alive_connections_and_joins_threads(engine):
    srv = LoopbackServer(engine=engine).start()
    client = client_for(srv)
    try:
        client.chat.completions.create(model="m", messages=MESSAGES)  # leaves a keep-alive connection open
        assert any(t.name == ("loopback-conn" if engine == "threads" else "loopback-asyncio")
                   for t in threading.enumerate())
        srv.stop()
        assert not any(t.name.startswith("loopback") for t in threading.enumerate())
        srv.stop()  # idempotent
        with pytest.raises(RuntimeError, match="not running"):
            srv.base_url
    finally:
        client.close()


def test_unknown_route_is_a_404(server):
    with client_for(server) as client, pytest.raises(openai.NotFoundError):
        client.completions.create(model="m", prompt="hi")


def test_latency_given_as_one_number_in_text():
    # the command line's default is "0"; "0.2" means 0.2 s for every request
    assert LoopbackServer(latency="0.2").latency == (0.2, 0.2)
    assert LoopbackServer(latency="0.1:0.3").latency == (0.1, 0.3)
