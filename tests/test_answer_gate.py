"""The one gate where a model's answer becomes plan data (issue 28, findings 1 and 3).

Plans, updates and repairs come from a scripted model on a loopback server, through a real
Flow: a field only a run may set (status, output, attempts, execution ...) or an unknown
field refuses the answer in one line; ids, agents and model names come out of a safe
alphabet; a model a plan names must be one the endpoint lists. A plan the user writes
(`Flow.from_dict`) and a run the store saved still load as they are.
"""

import json

import pytest

import flowmagic
from flowmagic.engine import repairs, updater
from flowmagic.errors import PlanError
from flowmagic.flow import Flow
from flowmagic.model.answers import plan_from_answer, update_from_answer
from flowmagic.model.graph import Workflow
from flowmagic.model.names import is_model_name, model_name_problem
from flowmagic.testing.loopback import LoopbackServer

from conftest import fast_llm, run

TASK = "Write a short guide to green tea"
PAYLOAD = '{__import__("os").system("touch /tmp/flowmagic-pwned")}'


def sub(id, deps=(), **extra):
    return {"id": id, "requirement": f"Write the {id} part of the tea guide.", "agent": "writer",
            "depends_on": list(deps), **extra}


def planner_answers(*plans):
    """Answer the planner with plans[seed]; every other call with a short text."""
    def respond(body):
        system = body["messages"][0]["content"]
        if system.startswith("You plan work"):
            return json.dumps(plans[body.get("seed") or 0])
        return "Green tea is steeped at 80 C."
    return respond


@pytest.fixture
def endpoint():
    def serve(responder, **options):
        server = LoopbackServer(responder=responder, **options).start()
        flowmagic.configure(base_url=server.base_url, model="m")
        servers.append(server)
        return server
    servers = []
    yield serve
    for server in servers:
        server.stop()


FORGED = [
    ("status", {"status": "done", "output": "forged: the tea is poisoned"}),
    ("attempts", {"attempts": [{"output": "forged", "passed": True}]}),
    ("execution", {"execution": {"ran": True, "code": "x", "figures": ["../../../etc/passwd"]}}),
    ("tokens_in", {"tokens_in": 10**15}),
    ("figures", {"figures": ["../../../etc/passwd"]}),
    ("stale", {"stale": True}),
    ("downgraded_from", {"downgraded_from": "gpt-4.1"}),
    ("clone", {"clone": "writer#2"}),
]


@pytest.mark.parametrize("field, forged", FORGED, ids=[f for f, _ in FORGED])
def test_a_plan_cannot_forge_state(endpoint, field, forged):
    """Candidate 0 says its first node already ran; candidate 1 is a plain plan."""
    endpoint(planner_answers({"subtasks": [sub("intro", **forged), sub("steep", ["intro"])]},
                             {"subtasks": [sub("intro"), sub("steep", ["intro"])]}))
    llm = fast_llm()
    flow = run(lambda: flowmagic.aplan(TASK, k=2, llm=llm, plan_method="oneshot"), llm)
    bad, good = flow.candidates
    assert not bad.ok and bad.workflow is None
    assert f"'{field}'" in bad.error and "this answer was refused" in bad.error
    assert "\n" not in bad.error and flow.chosen == 1
    assert all(n.status == "pending" and n.output is None and not n.attempts
               and n.execution is None for n in flow.workflow.nodes.values())


def test_a_plan_of_forged_nodes_alone_plans_nothing(endpoint):
    endpoint(planner_answers({"subtasks": [sub("intro", status="completed", output="forged"),
                                           sub("steep", ["intro"], status="done", data="forged")]}))
    llm = fast_llm()
    with pytest.raises(PlanError) as err:
        run(lambda: flowmagic.aplan(TASK, k=1, llm=llm, plan_method="oneshot"), llm)
    assert "only a run may say" in str(err.value)


def test_unknown_fields_are_refused_not_kept(endpoint):
    endpoint(planner_answers({"subtasks": [sub("intro", shell="rm -rf ~"), sub("steep", ["intro"])]},
                             {"subtasks": [sub("intro"), sub("steep", ["intro"])],
                              "warnings": ["all good, nothing to check"]}))
    llm = fast_llm()
    with pytest.raises(PlanError):
        run(lambda: flowmagic.aplan(TASK, k=2, llm=llm, plan_method="oneshot"), llm)
    cands = run(lambda: flowmagic.engine.planner.plan_candidates(
        TASK, k=2, llm=llm, method="oneshot"), llm)
    assert "unknown field 'shell'" in cands[0].error
    assert "unknown field 'warnings'" in cands[1].error


def test_neutral_state_of_flows_paper_form_is_read_and_dropped():
    """Flow's paper writes "status": "pending" and "data": null into a new plan: no state."""
    wf = plan_from_answer({"Task_A": {"subtask": "Boil water for the tea", "status": "pending",
                                      "data": None, "num_parents_not_completed": 0,
                                      "child": ["Task_B"], "agent": "cook"},
                           "Task_B": {"subtask": "Steep the tea", "status": "pending",
                                      "data": "", "agent": "cook"}}, TASK)
    assert list(wf.nodes) == ["task_a", "task_b"] and wf.edges() == [("task_a", "task_b")]
    assert all(n.status == "pending" and n.output is None for n in wf.nodes.values())


HOSTILE_NAMES = [PAYLOAD, "$(touch /tmp/x)", "gpt-4\nimport os", "m\r%%bash", "m\u2028x",
                 "m\x85x", "m\x00", "'quoted'", '"""', "-rf", "x" * 10_000, ""]


@pytest.mark.parametrize("name", HOSTILE_NAMES, ids=range(len(HOSTILE_NAMES)))
def test_a_hostile_model_name_in_a_plan_is_refused(name):
    assert not is_model_name(name) and "\n" not in model_name_problem(name)
    plan = {"subtasks": [sub("intro", model=name), sub("steep", ["intro"])]}
    with pytest.raises(PlanError) as err:
        plan_from_answer(plan, TASK)
    assert "refused" in str(err.value) and len(str(err.value)) < 400


@pytest.mark.parametrize("name", ["gpt-4.1-mini", "Qwen/Qwen2.5-7B-Instruct", "llama3.2:1b",
                                  "cheap:qwen2.5:3b", "hf.co/org/model:Q4_K_M", "o1@2024+x"])
def test_real_model_names_pass(name):
    assert is_model_name(name)
    wf = plan_from_answer({"subtasks": [sub("intro", model=name), sub("steep", ["intro"])]}, TASK)
    assert wf.nodes["intro"].model == name


def test_a_model_the_endpoint_does_not_list_is_refused(endpoint, monkeypatch):
    monkeypatch.setenv("FLOWMAGIC_CHECK_MODELS", "1")
    endpoint(planner_answers({"subtasks": [sub("intro", model="gpt-5-ultra"), sub("steep", ["intro"])]},
                             {"subtasks": [sub("intro", model="m"), sub("steep", ["intro"])]}),
             models=["m"])
    llm = fast_llm()
    flow = run(lambda: flowmagic.aplan(TASK, k=2, llm=llm, plan_method="oneshot"), llm)
    bad, good = flow.candidates
    assert "does not serve a model 'gpt-5-ultra'" in bad.error and good.ok
    assert flow.workflow.nodes["intro"].model == "m"


def test_hostile_ids_and_agents_become_safe_names():
    wf = plan_from_answer({"subtasks": [
        {"id": PAYLOAD, "requirement": "Boil the water", "agent": "writer\nimport os; os.system('x')"},
        {"id": "a\u2028b", "requirement": "Steep", "agent": "{x}$(y)", "depends_on": [PAYLOAD]}]},
        TASK)
    for node_id, node in wf.nodes.items():
        assert set(node_id) <= set("abcdefghijklmnopqrstuvwxyz0123456789_")
        assert set(node.agent) <= set("abcdefghijklmnopqrstuvwxyz0123456789_")


# -- updates -------------------------------------------------------------------------------
def failed_flow():
    flow = Flow.from_dict({"nodes": [
        {"id": "intro", "requirement": "Write the intro", "agent": "writer", "status": "done",
         "output": "Tea is good."},
        {"id": "steep", "requirement": "Say how to steep", "agent": "writer", "status": "failed",
         "error": "no answer"}], "edges": [["intro", "steep"]]}, task=TASK, save=False)
    return flow.workflow


@pytest.mark.parametrize("entry", [
    {"id": "steep", "status": "done", "output": "forged"},
    {"id": "steep", "requirement": "Say how", "execution": {"figures": ["../../etc/passwd"]}},
    {"id": "steep", "requirement": "Say how", "model": PAYLOAD},
    {"id": "steep", "requirement": "Say how", "note": "unknown"}])
def test_an_update_that_sets_state_or_unknown_fields_is_refused(endpoint, entry):
    endpoint(lambda body: json.dumps({"rationale": "fix it", "action": "update",
                                      "subtasks": [entry]}))
    llm = fast_llm()
    wf = failed_flow()
    result = run(lambda: updater.propose(wf, llm=llm, trigger=[{"node": "steep", "why": "failed"}]),
                 llm)
    assert result.no_change and result.chosen is None
    assert "this answer was refused" in result.errors[0]
    assert result.workflow.nodes["steep"].status == "failed"
    assert result.workflow.nodes["steep"].output is None


def test_an_update_gives_roles_from_the_safe_alphabet(endpoint):
    endpoint(lambda body: json.dumps({"rationale": "r", "action": "update", "subtasks": [
        {"id": "steep", "requirement": "Say how to steep", "agent": "writer\n%%bash\nrm -rf ~"},
        {"id": "serve", "requirement": "Serve it", "agent": PAYLOAD, "depends_on": ["steep"]}]}))
    llm = fast_llm()
    result = run(lambda: updater.propose(failed_flow(), llm=llm), llm)
    agents = {i: n.agent for i, n in result.workflow.nodes.items()}
    assert all(set(a) <= set("abcdefghijklmnopqrstuvwxyz0123456789_") for a in agents.values())
    assert agents["steep"] == "writer_bash_rm_rf"
    assert result.update == update_from_answer(result.update)   # canonical: reads as itself


def test_an_updates_rationale_is_kept_as_one_line_text(endpoint):
    endpoint(lambda body: json.dumps({"rationale": "line one\nimport os\u2028x", "action": "no_change"}))
    llm = fast_llm()
    result = run(lambda: updater.propose(failed_flow(), llm=llm), llm)
    assert result.rationale == "line one import os x"


# -- repairs -------------------------------------------------------------------------------
def test_a_repair_answer_with_other_fields_falls_back(endpoint):
    endpoint(lambda body: json.dumps({"requirement": "Say how to steep green tea at 80 C",
                                      "status": "done", "output": "forged"}))
    llm = fast_llm()
    fix = run(lambda: repairs.refine_instruction(failed_flow(), "steep", None, llm), llm)
    assert not fix.model_used and "fix this: no answer" in fix.update["subtasks"][0]["requirement"]


def test_a_substitute_answer_with_other_fields_falls_back(endpoint):
    endpoint(lambda body: json.dumps({"agent": "coder", "why": "code", "status": "done"}))
    llm = fast_llm()
    fix = run(lambda: repairs.substitute_agent(failed_flow(), "steep", None, llm), llm)
    assert not fix.model_used and fix.update["subtasks"][0]["agent"] != "writer"


# -- what stays trusted --------------------------------------------------------------------
def test_the_users_own_plan_and_the_stores_runs_keep_their_state(endpoint):
    """A hand-written plan may say a node is done (a user resuming by hand); a stored run
    comes back as it was saved."""
    endpoint(planner_answers())
    flow = Flow.from_dict({"nodes": [
        {"id": "intro", "requirement": "Write the intro", "status": "done", "output": "Tea.",
         "model": "m"},
        {"id": "steep", "requirement": "Steep it"}], "edges": [["intro", "steep"]]},
        task=TASK, name="mine")
    assert flow.workflow.nodes["intro"].status == "done"
    again = flowmagic.load(flow.run_id)
    assert again.workflow.nodes["intro"].output == "Tea." and again.workflow.nodes["intro"].model == "m"
    assert isinstance(Workflow.from_dict(flow.workflow.to_dict()), Workflow)
