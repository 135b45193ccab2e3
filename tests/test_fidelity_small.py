"""Tool F1 from the calls really made, and the smaller fidelity items: the paper's own dict
form, a retry after every candidate failed, clone labels by free slot, and the flag on
vacuous edge scores. Model traffic is real HTTP to loopback servers."""

import json

import pytest

import flowmagic
from flowmagic.errors import PlanError
from flowmagic.evaluate import compare
from flowmagic.flow import Flow, aplan
from flowmagic.model.graph import parse_plan
from flowmagic.llm import LLM
from flowmagic.testing.loopback import LoopbackServer

from conftest import fast_llm, run

pytestmark = pytest.mark.timeout(120)


# -- 6. tool F1 from the tool calls really made --------------------------------------------

def get_weather(city: str) -> str:
    """The weather forecast for a city: rain, sun, wind."""
    return f"rain in {city}"


def test_tool_f1_scores_the_tools_a_node_really_called():
    def responder(body):
        results = [m["content"] for m in body["messages"] if m.get("role") == "tool"]
        if body.get("tools") and not results:
            return {"tool_calls": [{"function": {"name": "get_weather",
                                                 "arguments": json.dumps({"city": "Oslo"})}}]}
        return f"answer: {results[-1] if results else 'no tool'}"

    plan = {"nodes": [{"id": "weather", "requirement": "get the weather forecast for Oslo"}],
            "edges": []}
    gold = {"nodes": [{"id": "w", "label": "get the weather forecast for Oslo",
                       "tool": "get_weather"}], "edges": []}
    with LoopbackServer(responder=responder) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        flow = Flow.from_dict(plan, task="t", llm=fast_llm(), consolidate=False,
                              tools=[get_weather])
        assert flow.run().status == "done"
    assert flow.workflow.nodes["weather"].output == "answer: rain in Oslo"
    scores = compare(flow, gold, similarity="tfidf")
    assert (scores.tool_precision, scores.tool_recall, scores.tool_f1) == (1.0, 1.0, 1.0)
    # a plan that declares its tools is scored on them too
    declared = {"nodes": [{"id": "x", "label": "get the weather forecast for Oslo",
                           "tools": ["get_weather", "send_email"]}], "edges": []}
    assert compare(declared, gold, similarity="tfidf").tool_precision == 0.5


# -- 10. the paper's dict form with "subtask requirement" -------------------------------------

def test_the_papers_dict_form_with_subtask_requirement_is_read():
    paper = {"task0": {"subtask requirement": "load the csv", "status": "pending", "data": None,
                       "num_parents_not_completed": 0, "child": ["task1"], "agent": "coder"},
             "task1": {"subtask requirement": "plot it", "status": "pending", "data": None,
                       "num_parents_not_completed": 1, "child": [], "agent": "analyst"}}
    wf = parse_plan(paper)
    assert [wf.nodes[i].requirement for i in ("task0", "task1")] == ["load the csv", "plot it"]
    assert wf.parents("task1") == ["task0"] and wf.nodes["task0"].agent == "coder"


# -- 10. "try again" after every candidate failed uses new seeds ----------------------------------

def test_a_retry_after_every_candidate_failed_asks_new_seeds():
    good = {"subtasks": [{"id": "a", "requirement": "clean the data", "dependencies": []},
                         {"id": "b", "requirement": "plot the data", "dependencies": ["a"]}]}

    def responder(body):
        return json.dumps(good) if body["seed"] >= 2 else "I cannot plan that, sorry."

    with LoopbackServer(responder=responder) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        llm = LLM(backoff_base=0.01)
        with pytest.raises(PlanError, match="try again"):
            run(lambda: aplan("plot the data", k=2, llm=llm), llm)
        first = server.calls
        llm = LLM(backoff_base=0.01)
        flow = run(lambda: aplan("plot the data", k=2, llm=llm), llm)   # "try again"
        assert server.calls > first
        assert sorted(r["body"]["seed"] for r in server.requests) == [0, 1, 2, 3]
        assert set(flow.workflow.nodes) == {"a", "b"}


# -- 10. clone labels name free slots -----------------------------------------------------------

def test_clone_labels_are_free_slots_not_running_counts():
    def latency(body):
        text = json.dumps(body["messages"])
        return 0.05 if "(first)" in text else 0.6

    plan = {"nodes": [{"id": "first", "requirement": "part (first)", "agent": "dev"},
                      {"id": "second", "requirement": "part (second)", "agent": "dev"},
                      {"id": "third", "requirement": "part (third)", "agent": "dev"}],
            "edges": []}
    with LoopbackServer(latency=latency) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        flow = Flow.from_dict(plan, task="t", llm=LLM(backoff_base=0.01), consolidate=False,
                              concurrency=2)
        events = []
        flow.subscribe(events.append)
        assert flow.run().status == "done"
    labels = {e["node"]: e.get("clone") or e.get("agent") for e in events if e["kind"] == "started"}
    # first (slot 1) and second (slot 2) start; first finishes; third takes the free slot 1
    assert labels == {"first": "dev", "second": "dev#2", "third": "dev"}


# -- 10. empty edge sets say that their edge scores are vacuous -------------------------------------

def test_two_plans_without_edges_are_flagged_vacuous():
    flat_a = {"nodes": [{"id": "x", "label": "load"}, {"id": "y", "label": "plot"}], "edges": []}
    flat_b = {"nodes": [{"id": "p", "label": "email"}, {"id": "q", "label": "translate"}], "edges": []}
    scores = compare(flat_a, flat_b, similarity="tfidf")
    assert scores.edge_f1 == 1.0 and scores.edges_vacuous
    assert scores.as_dict()["edges_vacuous"] is True
    chain = {"nodes": flat_a["nodes"], "edges": [["x", "y"]]}
    assert not compare(chain, chain, similarity="tfidf").edges_vacuous
