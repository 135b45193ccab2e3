"""Tools: schemas from signatures, the filter, calls that fail or hang, the loop over real HTTP."""

import asyncio
import enum
import json
import time
from typing import Annotated, Literal, Optional

import pytest

import flowmagic
from flowmagic.errors import ConfigError
from flowmagic.flow import Flow
from flowmagic.llm import LLM
from flowmagic.testing.loopback import LoopbackServer
from flowmagic.engine.toolloop import action_schema, run_with_tools
from flowmagic.engine.tools import (as_tool, call_tool, registry, resolve_tools, schema_of, select_tools,
                             tool)

from conftest import fast_llm, ipython_shell, run

pytestmark = pytest.mark.usefixtures("empty_tool_registry")


# -- schemas -----------------------------------------------------------------------------

class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


def forecast(city: str, days: int = 3, units: Literal["c", "f"] = "c",
             tags: Optional[list[str]] = None) -> str:
    """Get the weather forecast for a city.

    Uses a made-up service.

    Args:
        city: The city name,
            for example Paris.
        days (int): How many days ahead.
        units: Celsius or Fahrenheit.
    Returns:
        A sentence.
    """
    return f"{city}: sunny for {days} days"


def scale(x: float, colour: Colour, weights: dict[str, int], flag: bool = False):
    """Scale a number.

    Parameters
    ----------
    x : float
        The number to scale.
    colour : Colour
        Which colour to paint it.

    Returns
    -------
    float
    """
    return x * 2


def untyped(a, b=2.5, *rest, **extra):
    """Add things.

    :param a: the first thing,
        continued here.
    :param float b: the second thing
    :returns: the sum
    """
    return a + b


def annotated(n: Annotated[int, "how many"], when: "str"):
    return n


SCHEMAS = [
    (forecast, "Get the weather forecast for a city.", {
        "city": {"type": "string", "description": "The city name, for example Paris."},
        "days": {"type": "integer", "description": "How many days ahead.", "default": 3},
        "units": {"enum": ["c", "f"], "description": "Celsius or Fahrenheit.", "default": "c"},
        "tags": {"type": "array", "items": {"type": "string"}, "default": None}},
     ["city"], False),
    (scale, "Scale a number.", {
        "x": {"type": "number", "description": "The number to scale."},
        "colour": {"enum": ["red", "blue"], "description": "Which colour to paint it."},
        "weights": {"type": "object", "additionalProperties": {"type": "integer"}},
        "flag": {"type": "boolean", "default": False}},
     ["x", "colour", "weights"], False),
    (untyped, "Add things.", {
        "a": {"description": "the first thing, continued here."},
        "b": {"type": "number", "description": "the second thing", "default": 2.5}},
     ["a"], True),
    (annotated, "The Python function annotated.", {
        "n": {"type": "integer", "description": "how many"}, "when": {"type": "string"}},
     ["n", "when"], False),
]


@pytest.mark.parametrize("fn, description, properties, required, open_", SCHEMAS,
                         ids=[s[0].__name__ for s in SCHEMAS])
def test_schema_from_signature_hints_and_docstring(fn, description, properties, required, open_):
    got_description, schema = schema_of(fn)
    assert got_description == description
    assert schema["properties"] == properties
    assert schema["required"] == required
    assert ("additionalProperties" not in schema) == open_
    json.dumps(schema)   # always serialisable


def test_tool_specs_are_written_byte_for_byte_as_before():
    # specs are in prompts, so in cache keys and exported replays: pydantic writes them now, in
    # the same text (key order included) that the hand-written schemas had
    assert json.dumps(as_tool(forecast).spec()) == (
        '{"type": "function", "function": {"name": "forecast", "description": "Get the weather '
        'forecast for a city.", "parameters": {"type": "object", "properties": {"city": {"type": '
        '"string", "description": "The city name, for example Paris."}, "days": {"type": "integer",'
        ' "description": "How many days ahead.", "default": 3}, "units": {"enum": ["c", "f"], '
        '"description": "Celsius or Fahrenheit.", "default": "c"}, "tags": {"type": "array", '
        '"items": {"type": "string"}, "default": null}}, "required": ["city"], '
        '"additionalProperties": false}}}')

    class Shade(enum.Enum):
        """A docstring that is not part of the spec."""
        DARK = "dark"

    def nested(shades: list[Shade], table: dict, rows: list[dict[str, float]],
               when: "datetime.date", pair: tuple[int, str] = (1, "a")):
        return None

    assert schema_of(nested)[1]["properties"] == {
        "shades": {"type": "array", "items": {"enum": ["dark"]}}, "table": {"type": "object"},
        "rows": {"type": "array", "items": {"type": "object",
                                            "additionalProperties": {"type": "number"}}},
        "when": {}, "pair": {"type": "array", "default": (1, "a")}}


def test_arguments_that_do_not_fit_the_signature_go_back_to_the_model_in_one_line():
    seen = []

    def book(nights: int, guests: Optional[list[str]] = None, late: bool = False) -> str:
        seen.append((nights, guests, late))
        return "booked"

    async def main():
        return await asyncio.gather(
            call_tool(as_tool(book), {"nights": "two"}),
            call_tool(as_tool(book), {"nights": 2.5}),
            call_tool(as_tool(book), {"nights": 1, "guests": "Ann"}),
            call_tool(as_tool(book), '{"nights": "3", "guests": ["Ann"], "late": "true"}'))

    words, fraction, not_list, ok = asyncio.run(main())
    assert words.error == ("bad arguments: nights: Input should be a valid integer, "
                           "unable to parse string as an integer")
    assert "nights" in fraction.error and "fractional" in fraction.error
    assert not_list.error == "bad arguments: guests: Input should be a valid list"
    assert all("\n" not in c.result for c in (words, fraction, not_list))
    assert ok.error is None and ok.result == "booked"
    assert seen == [(3, ["Ann"], True)]   # the function only ran with arguments that fit


def test_decorator_registers_and_leaves_the_function_callable():
    @flowmagic.tool
    def word_count(text: str) -> int:
        """Count the words in a text."""
        return len(text.split())

    @tool(name="shout", timeout_s=1.5)
    def loud(text: str) -> str:
        return text.upper()

    assert word_count("a b c") == 3 and loud("hi") == "HI"
    assert sorted(registry()) == ["shout", "word_count"]
    assert registry()["shout"].timeout_s == 1.5
    spec = registry()["word_count"].spec()
    assert spec["function"]["name"] == "word_count"
    assert spec["function"]["description"] == "Count the words in a text."

    @flowmagic.tool
    def word_count(text: str) -> int:  # noqa: F811 - a notebook cell run again
        """Count words, again."""
        return 0

    assert registry()["word_count"].description == "Count words, again."


def test_resolve_tools_from_the_notebook_namespace():
    ns = {"forecast": forecast, "scale": scale, "data": [1, 2]}
    assert [t.name for t in resolve_tools("forecast, scale", ns)] == ["forecast", "scale"]
    with pytest.raises(ConfigError, match="no function named 'nope' in the notebook"):
        resolve_tools("forecast,nope", ns)
    with pytest.raises(ConfigError, match="'data' is a list, not a function"):
        resolve_tools("data", ns)
    tool(untyped)
    assert [t.name for t in resolve_tools("untyped", {})] == ["untyped"]
    with pytest.raises(ConfigError, match="name"):
        as_tool(lambda x: x)


# -- the filter ---------------------------------------------------------------------------

def read_csv(path: str) -> str:
    """Load a CSV file from disk and return its rows."""


def plot_chart(column: str) -> str:
    """Draw a line chart of one column."""


def send_email(to: str, body: str) -> str:
    """Send an email message to someone."""


def stock_price(symbol: str) -> float:
    """Look up the latest stock price for a ticker symbol."""


def translate(text: str, language: str) -> str:
    """Translate text into another language."""


FILTER_CASES = [
    ("Load the sales CSV file and list its columns", 1, ["read_csv"]),
    ("What is the weather forecast for Paris this week?", 1, ["forecast"]),
    ("Email the summary to the team", 2, ["send_email"]),
    ("Translate the findings into French", 1, ["translate"]),
    ("Compare the stock price of ACME with last year", 1, ["stock_price"]),
    ("Draw a chart of the revenue column", 1, ["plot_chart"]),
]


@pytest.mark.parametrize("requirement, top_n, expected", FILTER_CASES)
def test_filter_offers_the_most_similar_tools(requirement, top_n, expected):
    tools = [read_csv, plot_chart, send_email, stock_price, translate, forecast]
    offered = [t.name for t in select_tools(requirement, tools, top_n=top_n)]
    assert len(offered) == top_n
    assert offered[: len(expected)] == expected


def test_filter_keeps_everything_when_few_and_accepts_a_backend():
    tools = [read_csv, plot_chart]
    assert [t.name for t in select_tools("anything", tools, top_n=3)] == ["read_csv", "plot_chart"]
    assert select_tools("anything", tools, top_n=0) == []
    # a custom backend: prefer the second tool whatever the text
    offered = select_tools("load csv", tools, top_n=1, similarity=lambda a, b: [[0.1, 0.9]])
    assert [t.name for t in offered] == ["plot_chart"]


# -- calling: errors and timeouts come back as results --------------------------------------

def test_exceptions_timeouts_and_bad_arguments_are_results():
    def boom(x: int) -> int:
        raise KeyError("no such row")

    def slow(seconds: float) -> str:
        time.sleep(seconds)
        return "late"

    async def aslow(seconds: float) -> str:
        await asyncio.sleep(seconds)
        return "late"

    def exits() -> None:
        raise SystemExit(3)

    async def main():
        results = await asyncio.gather(
            call_tool(as_tool(boom), {"x": 1}),
            call_tool(as_tool(slow), {"seconds": 1.5}, timeout_s=0.2),
            call_tool(as_tool(aslow), '{"seconds": 5}', timeout_s=0.2),
            call_tool(as_tool(scale), {"x": "2.5", "colour": "red", "weights": {}}),
            call_tool(as_tool(scale), {"x": 1, "colour": "green", "weights": {}}),
            call_tool(as_tool(forecast), {"town": "Paris"}),
            call_tool(as_tool(forecast), "{not json"),
            call_tool(as_tool(exits), {}))
        return results

    started = time.perf_counter()
    boom_, slow_, aslow_, ok, bad_enum, unknown, not_json, exited = asyncio.run(main())
    assert time.perf_counter() - started < 1.2   # the hung thread is not waited for
    assert boom_.error == "KeyError: 'no such row'" and "KeyError" in boom_.result
    assert slow_.error.startswith("timed out after 0.2 s; the call may still be running")
    assert "thread cannot be stopped" in slow_.error and slow_.duration_s < 1.0
    assert aslow_.error == "timed out after 0.2 s; the call may still be running"
    assert ok.error is None and ok.result == "5.0"
    assert "colour must be one of ['red', 'blue']" in bad_enum.error
    assert "bad arguments" in unknown.error and "city" in unknown.error
    assert "not JSON" in not_json.error
    assert exited.error == "SystemExit: 3"


# -- the loop over a loopback server ---------------------------------------------------------

def tool_responder(body):
    """Asks for word_count once, then answers with what the tool said."""
    results = [m["content"] for m in body["messages"] if m.get("role") == "tool"]
    if body.get("tools") and not results:
        return {"tool_calls": [{"function": {"name": "word_count",
                                             "arguments": json.dumps({"text": "one two three"})}}]}
    return f"The text has {results[-1] if results else '?'} words."


def word_count(text: str) -> int:
    """Count the words in a text."""
    return len(text.split())


def test_native_tool_loop_calls_and_answers():
    with LoopbackServer(responder=tool_responder) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        llm = fast_llm()
        seen = []
        result = run(lambda: run_with_tools(llm, [{"role": "user", "content": "count"}],
                                            [as_tool(word_count)], on_call=seen.append), llm)
        assert result.reply.text == "The text has 3 words." and result.protocol == "native"
        assert [(c.tool, c.arguments, c.result) for c in result.calls] == [
            ("word_count", {"text": "one two three"}, "3")]
        assert seen == result.calls and result.rounds == 1
        first, second = (r["body"] for r in server.requests)
        assert first["tools"][0]["function"]["name"] == "word_count"
        assert second["messages"][-2]["tool_calls"][0]["function"]["name"] == "word_count"
        assert second["messages"][-1] == {"role": "tool", "tool_call_id": "call_0", "content": "3"}
        assert result.reply.input_tokens > 0 and result.reply.output_tokens > 0


def test_rounds_are_bounded_and_the_last_round_offers_no_tools():
    always = {"tool_calls": [{"function": {"name": "word_count", "arguments": '{"text": "a"}'}}]}
    with LoopbackServer(responder=lambda body: always if body.get("tools") else "giving up") as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        llm = fast_llm()
        result = run(lambda: run_with_tools(llm, "count", [as_tool(word_count)], max_rounds=2), llm)
        assert result.reply.text == "giving up" and len(result.calls) == 2
        bodies = [r["body"] for r in server.requests]
        assert ["tools" in b for b in bodies] == [True, True, False]
        assert "answer now" in bodies[-1]["messages"][-1]["content"]


def action_responder(body):
    """An endpoint without function calling: 500 on `tools`, JSON actions by schema."""
    if body.get("tools"):
        raise ValueError("tools are not supported")
    results = [m["content"].split("\n\nAnswer with one JSON value")[0]   # the schema note
               for m in body["messages"] if m["content"].startswith("Result of")]
    if body.get("response_format") and not results:
        return json.dumps({"action": "call", "tool": "word_count", "arguments": {"text": "x y"}})
    return json.dumps({"action": "answer", "content": f"done: {results[-1] if results else ''}"})


def test_an_endpoint_refusing_tools_gets_the_json_action_protocol_and_it_is_remembered():
    with LoopbackServer(responder=action_responder) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        llm = fast_llm()
        assert llm.tool_mode() == "native"
        result = run(lambda: run_with_tools(llm, "count", [as_tool(word_count)]), llm)
        assert result.protocol == "action" and llm.tool_mode() == "action"
        assert result.reply.text == "done: Result of word_count: 2\nCall another tool, or answer."
        assert [c.result for c in result.calls] == ["2"]
        server.reset()
        run(lambda: run_with_tools(llm, "count again", [as_tool(word_count)]), llm)
        assert not any("tools" in r["body"] for r in server.requests)
        fmt = server.requests[0]["body"]["response_format"]
        assert fmt["type"] in ("json_schema", "json_object")


def test_action_schema_allows_exactly_the_tools():
    schema = action_schema([as_tool(word_count), as_tool(forecast)])
    variants = schema["anyOf"]
    assert variants[0]["properties"]["action"] == {"const": "answer"}
    assert [v["properties"]["tool"]["const"] for v in variants[1:]] == ["word_count", "forecast"]
    assert variants[2]["properties"]["arguments"]["required"] == ["city"]


# -- a node calls a function from the notebook ---------------------------------------------------

def flow_responder(body):
    results = [m["content"] for m in body["messages"] if m.get("role") == "tool"]
    if body.get("tools") and not results:
        name = body["tools"][0]["function"]["name"]
        args = {"text": "alpha beta"} if name == "word_count" else {"path": "sales.csv"}
        return {"tool_calls": [{"function": {"name": name, "arguments": json.dumps(args)}}]}
    return f"result: {results[-1] if results else 'no tool'}"


def test_a_node_calls_a_notebook_function_and_every_call_is_stored():
    def load_table(path: str) -> str:
        """Load a CSV table from a path."""
        raise FileNotFoundError(path)

    plan = {"nodes": [{"id": "count", "requirement": "count the words of the text"},
                      {"id": "load", "requirement": "load the CSV table sales.csv"}],
            "edges": [["count", "load"]]}
    with LoopbackServer(responder=flow_responder) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        flow = Flow.from_dict(plan, task="t", llm=fast_llm(), consolidate=False, tools_top_n=1)
        flow.tools = [word_count, load_table]
        events = []
        flow.subscribe(events.append)
        assert flow.run().status == "done"
        assert flow.workflow.nodes["count"].output == "result: 2"
        # the tool raised: the model was told, the node still finished
        assert flow.workflow.nodes["load"].output.startswith("result: Error from tool load_table")
        rows = flow.tool_calls()
        assert [(r["node_id"], r["tool"], r["error"]) for r in rows] == [
            ("count", "word_count", None), ("load", "load_table", "FileNotFoundError: sales.csv")]
        assert rows[0]["arguments"] == {"text": "alpha beta"} and rows[0]["duration_s"] >= 0
        assert [e["call"]["tool"] for e in events if e["kind"] == "tool"] == ["word_count", "load_table"]
        attempt = flow.workflow.nodes["count"].attempts[-1]
        assert attempt["tool_calls"][0]["result"] == "2"
        # only the most similar tool was offered to each node (top_n=1)
        offered = [[t["function"]["name"] for t in r["body"]["tools"]]
                   for r in server.requests if r["body"].get("tools")]
        assert offered == [["word_count"]] * 2 + [["load_table"]] * 2   # call round, answer round
        # the same flow again replays from the cache: no request reaches the server
        before = server.calls
        again = Flow.from_dict(plan, task="t", llm=fast_llm(), consolidate=False, tools_top_n=1,
                               tools=[word_count, load_table])
        assert again.run().status == "done" and server.calls == before
        assert again.workflow.nodes["count"].output == "result: 2"


def test_registered_tools_apply_when_a_flow_sets_none():
    tool(word_count)
    flow = Flow.from_dict({"nodes": [{"id": "a", "requirement": "count words"}]}, task="t",
                          save=False)
    assert [t.name for t in flow.tools] == ["word_count"]
    flow.tools = []
    assert flow.tools == []


# -- the embedded model --------------------------------------------------------------------------

@pytest.mark.embedded
def test_embedded_model_runs_the_action_protocol(embedded_url):
    def add(a: int, b: int) -> int:
        """Add two whole numbers."""
        return a + b

    llm = LLM(timeout=120)
    assert llm.tool_mode("local") == "action"
    started = time.perf_counter()
    result = run(lambda: run_with_tools(
        llm, [{"role": "user", "content": "What is 2 + 3? Use the add tool."}], [as_tool(add)],
        model="local", max_rounds=1, max_tokens=40, seed=1), llm)
    elapsed = time.perf_counter() - started
    print(f"embedded tool loop: {elapsed:.1f} s, {len(result.calls)} call(s), "
          f"text={result.reply.text[:80]!r}, calls={[c.to_dict() for c in result.calls]}")
    assert result.protocol == "action" and isinstance(result.reply.text, str)
    assert len(result.calls) <= 1
    for call in result.calls:
        assert call.tool == "add"   # the grammar allows no other tool


def test_streamed_tool_calls_are_joined_and_cached():
    with LoopbackServer(responder=tool_responder) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        llm = fast_llm()
        spec = [as_tool(word_count).spec()]
        pieces = []
        first = llm.complete_sync("count", tools=spec, on_text=pieces.append)
        assert first.tool_calls == [{"id": "call_0", "type": "function", "function": {
            "name": "word_count", "arguments": '{"text": "one two three"}'}}]
        again = llm.complete_sync("count", tools=spec)
        assert again.cached and again.tool_calls == first.tool_calls and server.calls == 1
        plain = llm.complete_sync("count")   # the tools are part of the cache key
        assert not plain.cached and plain.tool_calls is None


def test_the_magic_gives_a_flow_the_named_notebook_functions(tmp_path, monkeypatch, capsys):
    plan = {"subtasks": [{"id": "count", "requirement": "count the words of the text",
                          "depends_on": []}]}

    def responder(body):
        if body.get("response_format"):
            return json.dumps(plan)
        return flow_responder(body)

    monkeypatch.chdir(tmp_path)
    with ipython_shell() as ip:
        with LoopbackServer(responder=responder) as server:
            flowmagic.configure(base_url=server.base_url, model="m")
            ip.run_cell("def word_count(text: str) -> int:\n"
                        "    '''Count the words in a text.'''\n    return len(text.split())")
            result = ip.run_cell("%%flow counting --k 1 --tools word_count --run\nCount words.")
            assert result.success, capsys.readouterr().err
            flow = ip.user_ns["counting"]
            assert [t.name for t in flow.tools] == ["word_count"]
            assert flow.workflow.nodes["count"].output == "result: 2"
            assert [r["tool"] for r in flow.tool_calls()] == ["word_count"]
