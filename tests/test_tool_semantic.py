"""Tools are offered by meaning: the endpoint's /embeddings when it has them, TF-IDF when
not; the orchestrator filters its workers' tools the same way. The loopback server embeds
with a scripted concept model (words mapped to a few concepts), as a real embedding model
would put "umbrella" near "rain"."""

import json
import math

import pytest

import flowmagic
from flowmagic.engine.tools import aselect_tools, as_tools
from flowmagic.flow import Flow
from flowmagic.llm import LLM
from flowmagic.orchestrator.hub import orchestrate
from flowmagic.testing.loopback import LoopbackServer

from conftest import fast_llm, run

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("empty_tool_registry")]

CONCEPTS = {"weather": {"umbrella", "rain", "weather", "forecast", "coat", "sunny", "wind"},
            "mail": {"email", "mail", "message", "notify", "send", "know"},
            "table": {"csv", "table", "load", "spreadsheet", "columns", "file"},
            "money": {"stock", "price", "share", "ticker", "trading", "worth"}}


def concept_vector(text: str) -> list[float]:
    words = set(text.lower().replace(":", " ").replace(".", " ").replace(",", " ").split())
    vec = [float(len(words & group)) for group in CONCEPTS.values()] + [0.01]
    norm = math.sqrt(sum(v * v for v in vec))
    return [v / norm for v in vec]


def send_email(to: str, body: str) -> str:
    """Send an email message to someone."""
    return "sent"


def read_csv(path: str) -> str:
    """Load a CSV file into a table."""
    return "a table"


def get_weather(city: str) -> str:
    """The forecast for a city: rain, sun, wind."""
    return f"rain in {city}"


def stock_price(symbol: str) -> float:
    """Look up the latest stock price for a ticker symbol."""
    return 12.5


TOOLS = [send_email, read_csv, get_weather, stock_price]
ASK = "Will I need an umbrella in Oslo tomorrow?"


def test_a_node_is_offered_the_tool_its_requirement_means():
    def responder(body):
        return "ok"

    with LoopbackServer(responder=responder, embedder=concept_vector) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        plan = {"nodes": [{"id": "ask", "requirement": ASK}], "edges": []}
        flow = Flow.from_dict(plan, task="t", llm=fast_llm(), consolidate=False, tools=TOOLS,
                              tools_top_n=1)
        assert flow.run().status == "done"
        offered = [[t["function"]["name"] for t in r["body"]["tools"]]
                   for r in server.requests if r["body"].get("tools")]
        assert offered and offered[0] == ["get_weather"]
        assert any(r["path"].endswith("/embeddings") for r in server.requests)
        # TF-IDF shares no word with the weather tool: it would have offered another one
        assert [t.name for t in flow.tools_for("ask")] != ["get_weather"]


def test_without_embeddings_auto_falls_back_to_tfidf_once():
    async def main(llm):
        first = await aselect_tools("load the csv table", TOOLS, 1, llm=llm)
        again = await aselect_tools("send an email", TOOLS, 1, llm=llm)
        return first, again

    with LoopbackServer(responder=lambda body: "ok") as server:
        server.embedder = lambda text: (_ for _ in ()).throw(RuntimeError("no embeddings"))
        flowmagic.configure(base_url=server.base_url, model="m")
        llm = fast_llm()
        first, again = run(lambda: main(llm), llm)
    assert [t.name for t in first] == ["read_csv"] and [t.name for t in again] == ["send_email"]


def test_the_orchestrator_filters_worker_tools_by_meaning():
    def responder(body):
        system = body["messages"][0]["content"]
        if system.startswith("You are the orchestrator") and "Write only" not in system:
            if any(m["role"] == "tool" for m in body["messages"]):
                return {"tool_calls": [{"function": {"name": "submit_answer",
                                                     "arguments": json.dumps({"answer": "ok"})}}]}
            return {"tool_calls": [{"function": {"name": "send_message", "arguments": json.dumps(
                {"agent": "assistant", "content": ASK})}}]}
        return "done"

    with LoopbackServer(responder=responder, embedder=concept_vector) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        orchestrate("t", agents=[{"name": "assistant", "tools": TOOLS}], llm=fast_llm(),
                    tools_top_n=1, max_turns=3)
        offered = [[t["function"]["name"] for t in r["body"]["tools"]] for r in server.requests
                   if r["body"].get("tools")
                   and not r["body"]["messages"][0]["content"].startswith("You are the orchestrator")]
        assert offered and offered[0] == ["get_weather"]
