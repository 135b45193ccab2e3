"""The one door to models, over real HTTP to a loopback server (never a patched client)."""

import asyncio
import hashlib
import json
import os
import socket
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import flowmagic
from flowmagic.llm import endpoints
from flowmagic.cli import main as cli
from flowmagic.errors import ConfigError, EndpointError
from flowmagic.llm import LLM
from flowmagic.store import Store
from flowmagic.testing.loopback import LoopbackServer

from conftest import fast_llm

SECRET = "sk-" + "test-9f3b2c1d0e8a7b6c5d4e3f2a1b0c9d8e"   # a fake key, split so scanners skip it


# -- resolution ---------------------------------------------------------------

def test_resolution_order(monkeypatch):
    endpoint, model = endpoints.resolve()
    assert endpoint.local and model == endpoints.LOCAL_MODEL

    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    endpoint, model = endpoints.resolve()
    assert endpoint.base_url == "https://api.openai.com/v1" and model == "gpt-4o-mini"
    assert endpoint.key_env == "OPENAI_API_KEY"

    monkeypatch.setenv("FLOWMAGIC_BASE_URL", "http://127.0.0.1:11434/v1")
    monkeypatch.setenv("FLOWMAGIC_MODEL", "llama3.2:1b")
    endpoint, model = endpoints.resolve()
    assert endpoint.base_url == "http://127.0.0.1:11434/v1" and model == "llama3.2:1b"

    flowmagic.configure(base_url="http://127.0.0.1:8000/v1", model="qwen")
    endpoint, model = endpoints.resolve()
    assert endpoint.base_url == "http://127.0.0.1:8000/v1" and model == "qwen"
    assert SECRET not in repr(endpoint) and SECRET not in json.dumps(endpoint.describe())


def test_named_endpoints_and_colon_models():
    flowmagic.configure(base_url="http://127.0.0.1:8000/v1", model="big")
    flowmagic.configure(name="cheap", base_url="http://127.0.0.1:9000/v1", model="small")
    assert endpoints.resolve("cheap")[0].base_url == "http://127.0.0.1:9000/v1"
    assert endpoints.resolve("cheap:tiny")[1] == "tiny"
    # Ollama model names contain ':' and are not endpoint names.
    endpoint, model = endpoints.resolve("llama3.2:1b")
    assert endpoint.base_url == "http://127.0.0.1:8000/v1" and model == "llama3.2:1b"
    assert endpoints.resolve("local")[0].local


def test_malformed_url_is_one_line(monkeypatch):
    monkeypatch.setenv("FLOWMAGIC_BASE_URL", "localhost:8080")
    with pytest.raises(ConfigError) as info:
        endpoints.resolve()
    assert "not an http(s) URL" in str(info.value) and "\n" not in str(info.value)


def test_no_embedded_model_names_both_ways_out(tmp_path):
    # A fresh process: this one may already have the embedded server running.
    script = ("import flowmagic\n"
              "try:\n    flowmagic.LLM().complete_sync('hi')\n"
              "except flowmagic.ConfigError as exc:\n    print(exc)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "FLOWMAGIC_"))}
    env.update(FLOWMAGIC_HOME=str(tmp_path), FLOWMAGIC_LOCAL_GGUF=str(tmp_path / "missing.gguf"))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=env, timeout=60)
    message = out.stdout.strip()
    assert "flowmagic[local]" in message and "OPENAI_API_KEY" in message and "\n" not in message


def test_a_server_start_begun_before_the_first_call_is_said_by_that_call(tmp_path):
    # A flow starts the embedded server while it reads its inputs (LLM.warm): a start that
    # fails there says nothing on its own, no thread traceback on stderr; the call that waits
    # for it raises its one line, and the next call tries again.
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF: a model file without its sha256")
    script = ("import flowmagic\n"
              "llm = flowmagic.LLM()\n"
              "llm.warm()\n"
              "for attempt in range(2):\n"
              "    try:\n        llm.complete_sync('hi')\n"
              "    except flowmagic.ConfigError as exc:\n        print('said:', exc)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "FLOWMAGIC_"))}
    env.update(FLOWMAGIC_HOME=str(tmp_path), FLOWMAGIC_LOCAL_GGUF=str(gguf))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=env, timeout=60)
    said = out.stdout.splitlines()
    assert len(said) == 2 and all("needs FLOWMAGIC_LOCAL_GGUF_SHA256" in s for s in said), out
    assert out.stderr == "", out.stderr


def test_refused_connection_is_one_line():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    flowmagic.configure(base_url=f"http://127.0.0.1:{port}/v1", model="m")
    llm = fast_llm(max_retries=2)
    with pytest.raises(EndpointError) as info:
        llm.complete_sync("hi")
    assert f"127.0.0.1:{port}" in str(info.value) and "\n" not in str(info.value)
    assert llm.store.recent_calls(1)[0]["error"]


# A user's script that ends without closing anything: asyncio.run, a loop closed by hand,
# or a plain LLM call on its own loop. Each must exit with nothing on stderr (an unclosed
# aiohttp session used to print "Unclosed client session" and "Unclosed connector").
_SCRIPT_ENDINGS = {
    "asyncio.run(flow.arun())": "print(asyncio.run(flow.arun()))",
    "a loop closed by hand": ("loop = asyncio.new_event_loop()\n"
                              "print(loop.run_until_complete(flow.arun()))\nloop.close()"),
    "a loop left open": ("loop = asyncio.new_event_loop()\n"
                         "print(loop.run_until_complete(flow.arun()))"),
    "LLM.complete in asyncio.run": (
        "async def go():\n    return (await flowmagic.get_llm().complete('hi')).text\n"
        "print(asyncio.run(go()))"),
}


@pytest.mark.parametrize("ending", list(_SCRIPT_ENDINGS))
def test_a_script_exits_without_unclosed_session_messages(ending, tmp_path):
    script = ("import asyncio, flowmagic\n"
              "from flowmagic.testing.loopback import LoopbackServer\n"
              "server = LoopbackServer().start()\n"
              "flowmagic.configure(base_url=server.base_url, model='loopback')\n"
              "flow = flowmagic.Flow.from_dict({'nodes': [{'id': 'a', 'requirement': 'say hi'},"
              " {'id': 'b', 'requirement': 'say bye', 'prev': ['a']}]}, task='t',"
              " consolidate=False)\n"
              + _SCRIPT_ENDINGS[ending] + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "FLOWMAGIC_"))}
    env.update(FLOWMAGIC_HOME=str(tmp_path), FLOWMAGIC_DISCOVER="0")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] in ("done", "Loopback reply to: hi")
    assert out.stderr == ""


# -- retries -------------------------------------------------------------------

@pytest.mark.parametrize("fault", ["429", "500", "hang", "truncated", "garbage"])
def test_each_fault_is_retried_until_success(fault):
    with LoopbackServer(latency=(0.2, 0.2), fail_first=2, fail_kind=fault,
                        hang_s=3.0) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        llm = fast_llm(timeout=1.0)
        started = time.perf_counter()
        reply = llm.complete_sync("hello there")
        elapsed = time.perf_counter() - started
        assert reply.text and not reply.cached
        rows = llm.store.recent_calls(10)
        assert len(rows) == 1, "a call that finally succeeds is logged once"
        assert 0.2 <= rows[0]["latency_s"] <= elapsed + 0.01
        assert rows[0]["response"]["attempts"] == 3
        assert len([r for r in server.requests if r["path"].endswith("/chat/completions")]) == 3


def test_gives_up_after_the_bound_with_backoff():
    with LoopbackServer(faults={"500": 1.0}) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        llm = fast_llm(max_retries=3, backoff_base=0.05, backoff_max=1.0)
        with pytest.raises(EndpointError, match="failed 4 times"):
            llm.complete_sync("hello")
        times = [r["arrived"] for r in server.requests if r["path"].endswith("/chat/completions")]
        assert len(times) == 4
        gaps = [b - a for a, b in zip(times, times[1:])]
        assert gaps[-1] > gaps[0], f"backoff should grow: {gaps}"


def test_retry_after_is_honoured():
    with LoopbackServer(fail_first=1, fail_kind="429", retry_after=0.6) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        started = time.perf_counter()
        fast_llm().complete_sync("hello")
        assert time.perf_counter() - started >= 0.6


def test_client_errors_are_not_retried():
    with LoopbackServer(faults={"401": 1.0}) as server:
        flowmagic.configure(base_url=server.base_url, model="m", api_key=SECRET)
        with pytest.raises(EndpointError, match="refused the API key"):
            fast_llm().complete_sync("hello")
        assert len(server.requests) == 1


# -- structured output -----------------------------------------------------------

SCHEMA = {"type": "object", "properties": {"verdict": {"type": "string", "enum": ["pass", "fail"]},
                                           "feedback": {"type": "string"}},
          "required": ["verdict", "feedback"]}


def test_json_schema_rejected_falls_back_and_is_remembered():
    with LoopbackServer(reject_json_schema=True) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        llm = fast_llm()
        reply = llm.complete_sync("judge this", schema=SCHEMA)
        assert reply.data["verdict"] == "pass"
        reply = llm.complete_sync("judge that", schema=SCHEMA)
        kinds = [r["body"].get("response_format", {}).get("type") for r in server.requests]
        assert kinds == ["json_schema", "json_object", "json_object"]


def test_truncated_structured_answer_is_reported():
    with LoopbackServer(faults={"length": 1.0}, responder=lambda body: '{"verdict": "pass", "feedback": "long"}') as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        with pytest.raises(flowmagic.TruncatedError):
            fast_llm().complete_sync("judge", schema=SCHEMA)


# -- cache, log, secrets -----------------------------------------------------------

def test_same_call_twice_is_a_cache_hit(loopback, capsys):
    flowmagic.configure(base_url=loopback.base_url, model="m")
    llm = fast_llm()
    first = llm.complete_sync("summarise the data", seed=1, temperature=0)
    second = llm.complete_sync("summarise the data", seed=1, temperature=0)
    assert loopback.calls == 1
    assert second.cached and not first.cached
    assert (second.text, second.data, second.input_tokens) == (first.text, first.data, first.input_tokens)
    third = llm.complete_sync("summarise the data", seed=2, temperature=0)
    assert loopback.calls == 2 and not third.cached

    assert cli(["log", "-n", "1", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)[0]
    assert row["model"] == "default:m" and row["output_tokens"] > 0 and row["latency_s"] > 0


# Keys made by the code before one JSON dump per call served the key and the log row
# (commit 6483acc): stores written then must still hit their cache.
_KEY_MESSAGES = [{"role": "system", "content": "You are the writer."},
                 {"role": "user", "content": 'R\u00e9sum\u00e9 of \u6570\u636e \u2014 "quoted"\n\tline'}]
_KEY_PARAMS = {"temperature": 0.2, "seed": 7, "max_tokens": 64, "schema": {
    "type": "object", "properties": {"b": {"type": "string"}, "a": {"type": "number"}}}}


def _key_as_stored(identity, model, messages, params):
    blob = json.dumps([identity, model, messages, params], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()


def test_cache_keys_are_byte_identical_to_stored_ones(loopback, flowmagic_home):
    from flowmagic.llm.cache_keys import cache_key, dump_messages as _messages_json
    stored = "7c45d4cd14afe93e16959c508710ee8828fcd64d136244924faf0517a33d7e6e"
    _, dumped = _messages_json(_KEY_MESSAGES)
    assert cache_key("http://127.0.0.1:8080/v1", "loopback", _KEY_MESSAGES, _KEY_PARAMS,
                     messages_json=dumped) == stored
    assert cache_key("http://127.0.0.1:8080/v1", "loopback", _KEY_MESSAGES, _KEY_PARAMS) == stored
    assert cache_key("id", "m", ["only text"], {"embed": True}) == (
        "a30328d48e97ebf2a2becc57d8861bb58dbb81fb5b1064b4313cf1a6eb4f2fec")

    # Through the door: an answer cached under the old key is found, with no call.
    flowmagic.configure(base_url=loopback.base_url, model="m")
    llm = fast_llm()
    params = {"temperature": 0.2, "seed": 7, "max_tokens": 64}
    old_key = _key_as_stored(loopback.base_url, "m", _KEY_MESSAGES, params)
    llm.store.cache_put(old_key, {"text": "from an old store", "data": None,
                                  "finish_reason": "stop", "input_tokens": 3, "output_tokens": 4})
    reply = llm.complete_sync(_KEY_MESSAGES, temperature=0.2, seed=7, max_tokens=64)
    assert (reply.cached, reply.text, reply.cache_key) == (True, "from an old store", old_key)
    assert loopback.calls == 0
    logged = llm.store.recent_calls(1)[0]
    assert logged["messages"] == _KEY_MESSAGES and logged["cache_key"] == old_key


def test_api_key_never_reaches_the_store(loopback, flowmagic_home):
    flowmagic.configure(base_url=loopback.base_url, model="m", api_key=SECRET)
    llm = fast_llm()
    llm.complete_sync("hello", schema=SCHEMA)
    llm.complete_sync("hello", schema=SCHEMA)
    assert loopback.requests[0]["had_auth"]
    for path in flowmagic_home.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path


def test_concurrency_limit_holds():
    with LoopbackServer(latency=(0.2, 0.2)) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        llm = fast_llm(concurrency=3)

        async def many():
            try:
                return await asyncio.gather(*(llm.complete(f"q{i}") for i in range(9)))
            finally:
                await llm.aclose()

        replies = asyncio.run(many())
        assert len(replies) == 9 and server.max_in_flight == 3


def test_calls_ending_together_each_get_their_own_committed_log_row(loopback, flowmagic_home):
    """The door writes the call log rows of one loop turn in one commit: each reply must
    still point at its own row, already readable from another connection."""
    from flowmagic.store import Store

    flowmagic.configure(base_url=loopback.base_url, model="m")
    llm = fast_llm(concurrency=50)
    seen = {}

    async def one(i):
        reply = await llm.complete(f"question {i}", node_id=f"n{i}")
        # Committed before the reply came back: a second connection sees the row.
        reader = Store(flowmagic_home / "flowmagic.db")
        try:
            rows = [r for r in reader.recent_calls(100) if r["id"] == reply.call_id]
        finally:
            reader.close()
        seen[i] = (reply, rows)

    async def many():
        try:
            await asyncio.gather(*(one(i) for i in range(30)))
        finally:
            await llm.aclose()

    asyncio.run(many())
    assert len({reply.call_id for reply, _ in seen.values()}) == 30
    for i, (reply, rows) in seen.items():
        assert len(rows) == 1 and rows[0]["node_id"] == f"n{i}"
        assert rows[0]["messages"][0]["content"] == f"question {i}"
        assert rows[0]["response"]["text"] == reply.text


def test_cache_lookups_made_together_each_find_their_own_answer(loopback):
    """The door looks up the calls of one loop turn in one SELECT: each call must still get
    the answer cached for its own messages, a miss among hits must reach the server, and
    a duplicate must get its own copy of the answer."""
    flowmagic.configure(base_url=loopback.base_url, model="m")
    llm = fast_llm(concurrency=50)

    async def ask(prompts):
        try:
            return await asyncio.gather(*(llm.complete(p, max_tokens=16) for p in prompts))
        finally:
            await llm.aclose()

    first = asyncio.run(ask([f"question {i}" for i in range(0, 20, 2)]))
    before = loopback.calls
    prompts = [f"question {i}" for i in range(20)] + ["question 4"]
    replies = asyncio.run(ask(prompts))
    assert loopback.calls - before == 10   # only the odd ones were new
    cached = {f"question {i}": r.text for i, r in zip(range(0, 20, 2), first)}
    for prompt, reply in zip(prompts, replies):
        assert reply.cached == (prompt in cached)
        if prompt in cached:
            assert reply.text == cached[prompt]
    assert len({r.call_id for r in replies}) == len(prompts)


def test_streaming_delivers_text_and_usage(loopback):
    flowmagic.configure(base_url=loopback.base_url, model="m")
    pieces = []
    reply = fast_llm().complete_sync("stream me", on_text=pieces.append)
    assert "".join(pieces) == reply.text and len(pieces) > 1
    assert reply.output_tokens > 0


def test_prices_per_model():
    from flowmagic.llm.usage import call_cost as _cost
    endpoint = endpoints.Endpoint("default", "https://api.openai.com/v1", "gpt-4o-mini")
    assert _cost(endpoint, "gpt-4o-mini-2024-07-18", 1_000_000, 1_000_000) == pytest.approx(0.75)
    flowmagic.configure(prices={"my-model": (1.0, 2.0)})
    assert _cost(endpoint, "my-model", 500_000, 0) == pytest.approx(0.5)
    local, _ = endpoints.resolve("local")
    assert _cost(local, "anything", 10**6, 10**6) == 0


# -- the real embedded model ---------------------------------------------------------

@pytest.mark.embedded
def test_embedded_schema_call_and_concurrency(embedded_url):
    llm = LLM(timeout=120)
    schema = {"type": "object", "properties": {"colour": {"type": "string"},
                                               "count": {"type": "integer"}},
              "required": ["colour", "count"]}
    reply = llm.complete_sync("Name a colour and a number as JSON.", schema=schema,
                              max_tokens=60, seed=1)
    assert isinstance(reply.data, dict)
    assert isinstance(reply.data["colour"], str) and isinstance(reply.data["count"], int)
    assert reply.model == "local:smollm2-135m-instruct" and reply.output_tokens > 0

    async def four():
        try:
            return await asyncio.gather(*(llm.complete(f"Say a word about {t}.", max_tokens=16)
                                          for t in ("tea", "rain", "maps", "owls")))
        finally:
            await llm.aclose()

    replies = asyncio.run(four())
    assert len(replies) == 4 and all(r.text.strip() for r in replies)
    again = llm.complete_sync("Name a colour and a number as JSON.", schema=schema,
                              max_tokens=60, seed=1)
    assert again.cached and again.data == reply.data


@pytest.mark.embedded
def test_embedded_server_dies_with_the_process_that_started_it(tmp_path):
    # A killed kernel must not leave a server holding a port and a core. Its notice is
    # information, said once per process (a kernel) even if the server starts again, and
    # never on stderr, which a notebook paints red.
    script = ("import os; from flowmagic.llm import local; local.ensure_server(); "
              "local.stop_server(); local.ensure_server(); "
              "print('pid', local._proc.pid, flush=True); os._exit(0)")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env={**os.environ, "FLOWMAGIC_HOME": str(tmp_path)}, timeout=120)
    notice = "flowmagic: using the embedded SmolLM2-135M model"
    assert out.stdout.count(notice) == 1 and notice not in out.stderr, out
    pid = int(out.stdout.split("pid ")[1].split()[0])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    os.kill(pid, 9)
    pytest.fail("the embedded server outlived its parent")


@pytest.mark.embedded
def test_the_embedded_server_starts_before_the_first_call_when_warmed(tmp_path):
    # aplan warms its LLM before it reads the inputs and starts the sandbox: the embedded
    # server (about 1.3 s to start) is up without any call, the first call uses that server
    # rather than starting another, and the notice is said once, on stdout.
    script = ("import time; from flowmagic.llm import LLM, local\n"
              "llm = LLM(timeout=90)\n"
              "llm.warm()\n"
              "deadline = time.monotonic() + 60\n"
              "while local.server_url() is None and time.monotonic() < deadline:\n"
              "    time.sleep(0.05)\n"
              "print('up before any call', local.server_url() is not None, flush=True)\n"
              "pid = local._proc.pid\n"
              "print('answered', bool(llm.complete_sync('Say a word about tea.', max_tokens=4)"
              ".text))\n"
              "print('the same server', local._proc.pid == pid)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env={**os.environ, "FLOWMAGIC_HOME": str(tmp_path)}, timeout=180)
    for line in ("up before any call True", "answered True", "the same server True"):
        assert line in out.stdout, out
    notice = "flowmagic: using the embedded SmolLM2-135M model"
    assert out.stdout.count(notice) == 1 and notice not in out.stderr, out


@pytest.mark.embedded
def test_the_embedded_server_loads_a_checked_q8_0_copy_of_the_shipped_weights(tmp_path):
    # llama.cpp has no fast CPU kernel for the shipped Q4_1 file: the server makes a Q8_0 copy
    # of its weights once in the user's cache folder (the home's where that is not writable),
    # writes its sha256 beside it and checks it before each load. A copy changed on disk is
    # made again, never loaded; where no copy can be made the shipped file is served, and the
    # model answers all along.
    script = ("import sys; from flowmagic.llm import LLM; "
              "print('answered', bool(LLM(timeout=90).complete_sync("
              "'Say a word about ' + sys.argv[1], max_tokens=4).text))")
    topics = iter(["tea", "rain", "maps", "owls", "bees"])   # none answered from the store's cache

    def start(home, cache):
        log = home / "local-server.log"
        before = log.stat().st_size if log.exists() else 0
        out = subprocess.run([sys.executable, "-c", script, next(topics)],
                             capture_output=True, text=True, timeout=180,
                             env={**os.environ, "FLOWMAGIC_HOME": str(home),
                                  "XDG_CACHE_HOME": str(cache)})
        assert "answered True" in out.stdout, out
        with open(log, "rb") as fh:
            fh.seek(before)
            return fh.read().decode(errors="replace")

    def loaded(log):   # the files llama.cpp opened to serve, after any copy was made
        return [line.rsplit(" from ", 1)[1].split(" (")[0] for line in log.splitlines()
                if "llama_model_loader: loaded meta data" in line][-1:]

    home, cache = tmp_path / "home", tmp_path / "cache"
    log = start(home, cache)
    [copy] = (cache / "flowmagic" / "models").glob("*.Q8_0.gguf")
    digest = Path(f"{copy}.sha256")
    assert digest.read_text().strip() == hashlib.sha256(copy.read_bytes()).hexdigest()
    assert f"made {copy}" in log and loaded(log) == [str(copy)], log[-2000:]

    log = start(tmp_path / "another home", cache)   # the next server reuses it
    assert "made " not in log and loaded(log) == [str(copy)]

    with open(copy, "r+b") as fh:   # a weight changed on disk
        fh.seek(copy.stat().st_size // 2)
        byte = fh.read(1)
        fh.seek(-1, 1)
        fh.write(bytes([byte[0] ^ 0xFF]))
    log = start(home, cache)
    assert f"made {copy}" in log and loaded(log) == [str(copy)]
    assert digest.read_text().strip() == hashlib.sha256(copy.read_bytes()).hexdigest()

    unwritable = tmp_path / "unwritable"
    unwritable.write_text("a file where the cache folder would be")
    log = start(home, unwritable)   # the home's models/ instead
    [second] = (home / "models").glob("*.Q8_0.gguf")
    assert f"made {second}" in log and loaded(log) == [str(second)]

    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / "models").write_text("a file where the home's copies would go")
    log = start(blocked, unwritable)
    assert "as shipped" in log and loaded(log)[0].endswith("SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.mark.embedded
def test_a_notebook_folder_with_a_module_named_like_the_servers_does_not_break_it(tmp_path):
    # The server process imports uvicorn, fastapi, llama_cpp...: started from the kernel's
    # working folder, a notebook's own uvicorn.py there was imported in their place.
    (tmp_path / "uvicorn.py").write_text("raise SystemExit('the notebook folder\'s uvicorn.py')")
    script = ("from flowmagic.llm import LLM; print('answered', "
              "bool(LLM(timeout=90).complete_sync('Say a word about tea.', max_tokens=4).text))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         cwd=tmp_path, env={**os.environ, "FLOWMAGIC_HOME": str(tmp_path / "h")},
                         timeout=180)
    assert "answered True" in out.stdout, out


def test_an_unusable_structured_answer_is_cached_too():
    # Replaying a notebook must meet the same bad answer, not call the model again.
    with LoopbackServer(responder=lambda body: "I cannot answer in JSON, sorry.") as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        llm = fast_llm()
        for _ in range(2):
            with pytest.raises(flowmagic.ModelOutputError) as info:
                llm.complete_sync("judge", schema=SCHEMA)
        assert server.calls == 1 and info.value.call_id
        rows = llm.store.recent_calls(2)
        assert [r["cached"] for r in rows] == [True, False] and all(r["error"] for r in rows)


def test_a_local_model_file_is_loaded_only_with_its_sha256(tmp_path, monkeypatch):
    from flowmagic.llm import local

    gguf = tmp_path / "bigger.gguf"
    gguf.write_bytes(b"GGUF: stands in for a bigger model file")
    good = hashlib.sha256(gguf.read_bytes()).hexdigest()
    monkeypatch.setenv("FLOWMAGIC_LOCAL_GGUF", str(gguf))
    monkeypatch.delenv("FLOWMAGIC_LOCAL_GGUF_SHA256", raising=False)
    with pytest.raises(ConfigError) as info:
        local.model_path()
    assert "needs FLOWMAGIC_LOCAL_GGUF_SHA256" in str(info.value) and "\n" not in str(info.value)
    monkeypatch.setenv("FLOWMAGIC_LOCAL_GGUF_SHA256", "0" * 64)
    with pytest.raises(ConfigError) as info:
        local.model_path()
    assert "not the file that was pinned" in str(info.value) and good[:16] in str(info.value)
    monkeypatch.setenv("FLOWMAGIC_LOCAL_GGUF_SHA256", good.upper())
    assert local.model_path() == gguf


def test_the_q8_0_copy_is_kept_only_in_a_folder_that_is_the_users_own(tmp_path, monkeypatch,
                                                                        flowmagic_home):
    # The copy is checked against the sha256 beside it: in a folder anyone can write to, anyone
    # could put a model and its sha256 there, so such a folder is not used.
    from flowmagic.llm import local

    cache = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    gguf = local.model_path()
    assert Path(local._copy_path(gguf)).parent == cache / "flowmagic" / "models"
    (cache / "flowmagic" / "models").chmod(0o777)
    assert Path(local._copy_path(gguf)).parent == flowmagic_home / "models"
    (flowmagic_home / "models").chmod(0o757)
    assert local._copy_path(gguf) == ""
    monkeypatch.setenv("FLOWMAGIC_LOCAL_GGUF", str(gguf))   # a file of the user's own: as it is
    (flowmagic_home / "models").chmod(0o700)
    assert local._copy_path(gguf) == ""


def test_the_shipped_model_file_matches_its_pinned_sha256(monkeypatch):
    from flowmagic.llm import local

    monkeypatch.delenv("FLOWMAGIC_LOCAL_GGUF", raising=False)
    assert local.model_path().name == "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_an_answer_cached_by_another_connection_is_a_hit(loopback, tmp_path):
    """The door skips the look-up of a call the cache certainly does not hold, from the keys
    it knows; an entry another connection (another kernel, a worker) wrote after they were
    read must still be found, and so must one written again after the cache was emptied."""
    flowmagic.configure(base_url=loopback.base_url, model="m")
    path = tmp_path / "shared.db"
    mine, theirs = fast_llm(Store(path)), fast_llm(Store(path))
    assert not mine.complete_sync("first question", seed=1).cached   # mine knows the keys now
    answer = theirs.complete_sync("second question", seed=1)
    assert loopback.calls == 2 and not answer.cached
    again = mine.complete_sync("second question", seed=1)
    assert again.cached and again.text == answer.text and loopback.calls == 2

    with sqlite3.connect(path) as db:   # emptied elsewhere: row ids start again from 1
        db.execute("DELETE FROM cache")
    assert not theirs.complete_sync("third question", seed=1).cached
    assert mine.complete_sync("third question", seed=1).cached and loopback.calls == 3


@pytest.mark.embedded
def test_an_embedded_server_built_for_another_cpu_is_one_line_that_says_rebuild(tmp_path):
    # pip reuses a llama-cpp-python wheel it built before, whatever CMAKE_ARGS say now: on
    # CI a wheel built with AMX died of SIGILL on the first prompt, was started again four
    # times and died each time, and the user read "failed 5 times (cannot connect)". SIGILL
    # is the build, not a fault a restart cures: the next call says so and what to do, and
    # once rebuilt (here: the build was fine all along) the next call starts a server again.
    script = textwrap.dedent("""
        import os, signal, time
        from flowmagic.errors import EndpointError
        from flowmagic.llm import LLM, local
        llm = LLM(timeout=60)
        print("first", bool(llm.complete_sync("Say a word about tea.", max_tokens=4).text))
        os.kill(local._proc.pid, signal.SIGILL)
        local._proc.wait()
        try:
            llm.complete_sync("Say a word about rain.", max_tokens=4)
        except EndpointError as exc:
            print("error", str(exc))
        print("again", bool(llm.complete_sync("Say a word about owls.", max_tokens=4).text))
        os._exit(0)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env={**os.environ, "FLOWMAGIC_HOME": str(tmp_path)}, timeout=240)
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines()
                 if line.split(" ", 1)[0] in ("first", "error", "again"))
    assert lines.get("first") == "True", out
    error = lines.get("error", "")
    assert "died of SIGILL" in error and "make setup" in error and "\n" not in error, out
    assert "failed" not in error, error
    assert lines.get("again") == "True", out
