"""Cheap repairs: refine the instruction or substitute the agent, then merge like any update."""

import json

import pytest

import flowmagic
from flowmagic.engine import updater
from flowmagic.errors import NodeError
from flowmagic.model.graph import Workflow
from flowmagic.testing.loopback import LoopbackServer
from flowmagic.engine.repairs import (next_kind, plan_repair, refine_instruction, repair,
                               substitute_agent)

from conftest import fast_llm, run

PLAN = {"task": "Report on sales.csv",
        "nodes": [{"id": "load", "requirement": "load sales.csv", "status": "done", "output": "rows"},
                  {"id": "parse", "requirement": "parse the dates", "agent": "writer",
                   "status": "failed", "error": "failed 3 attempt(s)",
                   "attempts": [{"output": "dates are dates", "feedback": "no code was given"}]},
                  {"id": "report", "requirement": "write the report", "status": "pending"}],
        "edges": [["load", "parse"], ["parse", "report"]]}


def workflow():
    return Workflow.from_dict(PLAN)


def served(responder):
    server = LoopbackServer(responder=responder)
    server.start()
    flowmagic.configure(base_url=server.base_url, model="m")
    return server


def test_refine_instruction_rewrites_and_merges_as_a_rerun():
    new = "Write Python code that parses the date column of sales.csv with pandas.to_datetime."
    server = served(lambda body: json.dumps({"requirement": new}))
    try:
        llm = fast_llm()
        wf = workflow()
        kind, update = run(lambda: refine_instruction(wf, "parse", None, llm, run_id="r1"), llm)
        assert kind == "refine_instruction"
        assert update == {"action": "update", "subtasks": [
            {"id": "parse", "requirement": new, "agent": "writer", "rerun": True}]}
        prompt = server.requests[0]["body"]["messages"][-1]["content"]
        assert "no code was given" in prompt and "dates are dates" in prompt
        merged, diff = updater.merge(wf, update)
        assert merged.nodes["parse"].status == "pending" and merged.nodes["parse"].requirement == new
        assert diff["edited"] == ["parse"] and diff["rerun"] == ["parse"]
        assert merged.nodes["load"].output == "rows"   # nothing else re-runs
    finally:
        server.stop()


@pytest.mark.parametrize("answer", ['{"requirement": "parse the  DATES"}', "not json at all"])
def test_an_unusable_rewrite_falls_back_to_appending_the_feedback(answer):
    server = served(lambda body: answer)
    try:
        llm = fast_llm()
        fixed = run(lambda: refine_instruction(workflow(), "parse", "give code", llm), llm)
        req = fixed.update["subtasks"][0]["requirement"]
        assert req.startswith("parse the dates") and req.endswith("make sure to fix this: give code")
        assert not fixed.model_used
    finally:
        server.stop()


def test_substitute_agent_takes_the_models_choice_among_the_others():
    server = served(lambda body: json.dumps({"agent": "coder", "why": "it needs code"}))
    try:
        llm = fast_llm()
        fixed = run(lambda: substitute_agent(workflow(), "parse", None, llm), llm)
        assert fixed.kind == "substitute_agent" and fixed.model_used
        assert fixed.update["subtasks"] == [{"id": "parse", "requirement": "parse the dates",
                                             "agent": "coder", "rerun": True}]
        offered = server.requests[0]["body"]["response_format"]
        schema = offered.get("schema") or offered["json_schema"]["schema"]
        assert "writer" not in schema["properties"]["agent"]["enum"]
        merged, diff = updater.merge(workflow(), fixed.update)
        assert merged.nodes["parse"].agent == "coder" and diff["reassigned"] == ["parse"]
    finally:
        server.stop()


def test_an_unusable_choice_falls_back_to_the_most_similar_role():
    server = served(lambda body: '{"agent": "nobody"}')
    try:
        llm = fast_llm(max_retries=0)
        fixed = run(lambda: substitute_agent(workflow(), "parse", "write python code to parse", llm), llm)
        assert fixed.update["subtasks"][0]["agent"] == "coder" and not fixed.model_used
    finally:
        server.stop()


def test_the_order_of_repairs_then_replanning():
    log = []
    assert next_kind(log, "parse") == "refine_instruction"
    log.append({"kind": "refine_instruction", "trigger": ["parse"]})
    assert next_kind(log, "parse") == "substitute_agent"
    assert next_kind(log, "other") == "refine_instruction"
    log.append({"kind": "substitute_agent", "trigger": ["parse"]})
    assert next_kind(log, "parse") is None

    server = served(lambda body: json.dumps({"agent": "coder", "requirement": "better text"}))
    try:
        llm = fast_llm()
        assert run(lambda: plan_repair(workflow(), log, llm), llm) is None
        first = run(lambda: plan_repair(workflow(), log[:1], llm, agents=["coder", "analyst"]), llm)
        assert (first.kind, first.node_id) == ("substitute_agent", "parse")
        assert first.to_dict()["tokens_out"] > 0
    finally:
        server.stop()


def test_running_pruned_and_unknown_nodes_are_refused():
    wf = workflow()
    wf.nodes["report"].status = "running"
    llm = fast_llm()
    with pytest.raises(NodeError, match="running"):
        run(lambda: refine_instruction(wf, "report", "x", llm), llm)
    with pytest.raises(NodeError, match="unknown repair"):
        run(lambda: repair("replan", wf, "parse", "x", llm), llm)
    with pytest.raises(NodeError):
        run(lambda: substitute_agent(wf, "nope", "x", llm), llm)
