"""Planning: prompts, K concurrent candidates over real HTTP, caps, scores and selection."""

import asyncio
import json
import time

import networkx as nx
import pytest

import flowmagic
from flowmagic.model import metrics
from flowmagic.errors import ConfigError, PlanError
from flowmagic.model.graph import parse_plan
from flowmagic.llm import LLM
from flowmagic.testing.loopback import LoopbackServer
from flowmagic.model.plan_checks import check_plan
from flowmagic.engine.planner import (EXAMPLE_TEXTS, STRATEGIES, Candidate, plan,
                                      plan_candidates, candidate_line, plan_schema,
                                      planning_messages, score, select)

from conftest import fast_llm, run

TASK = "Write a short report on tea"


def sub(id, deps=(), agent="writer", **extra):
    return {"id": id, "requirement": f"Do {id}.", "agent": agent, "depends_on": list(deps), **extra}


CHAIN = {"subtasks": [sub("a"), sub("b", ["a"]), sub("c", ["b"])]}                 # P 1/3
FAN_IN = {"subtasks": [sub("a"), sub("b"), sub("c", ["a", "b"])]}                   # P 1/2, C 0.47
PAIRS = {"subtasks": [sub("a"), sub("b", ["a"]), sub("c"), sub("d", ["c"])]}        # P 1/2, C 0
PAIR = {"subtasks": [sub("a"), sub("b", ["a"])]}                                    # P 1/2, C 0
# A plan only the repair can read: other key names, index references, a wrapper.
MESSY = {"steps": [{"name": "Gather sources", "description": "Find three sources on tea.",
                    "role": "researcher"},
                   {"name": "Draft", "description": "Draft the report.", "role": "writer",
                    "Depends On": "step 1"}]}


def by_seed(replies):
    """A loopback responder answering with replies[seed] (a dict is sent as JSON text)."""
    def respond(body):
        reply = replies[body.get("seed")]
        if isinstance(reply, Exception):
            raise reply
        return reply if isinstance(reply, str) else json.dumps(reply)
    return respond


def candidate(index, plan_obj=None, error=None, **scores):
    wf = parse_plan(plan_obj, task=TASK) if plan_obj is not None else None
    base = score(wf) if wf is not None else {}
    return Candidate(index=index, seed=index, workflow=wf, scores={**base, **scores}, error=error)


# -- selection ------------------------------------------------------------------------------

@pytest.mark.parametrize("plans, expected", [
    ([CHAIN, FAN_IN, PAIRS], 1),   # FAN_IN: connected, one sink, speed-up 1.5 > CHAIN's 1
    ([PAIRS, PAIR], 1),            # PAIRS is two unconnected pieces: the connected PAIR wins
    ([PAIR, PAIR, PAIR], 0),       # ties on everything: lower index wins
    ([CHAIN, PAIR], 0),            # speed-up 2/2 = 1.0 = 3/3; PAIR is CHAIN without its last step
    ([PAIR, FAN_IN], 1),
    ([FAN_IN, CHAIN], 0),
])
def test_selection_rule(plans, expected):
    cands = [candidate(i, p) for i, p in enumerate(plans)]
    assert select(cands, TASK_STEPS) == expected


TASK_STEPS = "Build a gobang game: write the board logic, the AI player and the UI, then test it"


def edges_plan(edges: str, isolated: str = "") -> dict:
    """A plan from "a>c b>c" (and isolated node names)."""
    deps: dict[str, list] = {}
    for pair in edges.split():
        a, b = pair.split(">")
        deps.setdefault(a, [])
        deps.setdefault(b, []).append(a)
    for name in isolated.split():
        deps.setdefault(name, [])
    return {"subtasks": [sub(n, d) for n, d in deps.items()]}


W1 = edges_plan("a>c b>c a>d b>d c>d")    # Flow's Workflow 1
W2 = edges_plan("a>c b>c c>d")            # Flow's Workflow 2: same levels, fewer edges


def test_flow_paper_workflow_2_beats_workflow_1_by_theorem_1():
    for order in ([W1, W2], [W2, W1]):
        cands = [candidate(i, p) for i, p in enumerate(order)]
        chosen = select(cands, TASK_STEPS)
        assert order[chosen] is W2
        # The paper's own numbers are reported unchanged: P_avg ties, C_dependency favours W1.
        w1, w2 = (c.scores for c in (cands if order[0] is W1 else cands[::-1]))
        assert w1["parallelism"] == pytest.approx(w2["parallelism"]) == pytest.approx(1 / 3)
        assert w1["dependency_complexity"] < w2["dependency_complexity"]
        assert w2["expected_successes"] == pytest.approx(3.185, abs=1e-3)
        assert w1["expected_successes"] == pytest.approx(3.060, abs=1e-3)
        note = cands[chosen].note
        assert note.startswith("chosen:") and "expected successes" in note and "3.185" in note
        assert "C_dependency" in note and "\n" not in note


GOBANG = {"subtasks": [sub("rules", agent="coder"), sub("board", agent="coder"),
                       sub("ai", ["rules", "board"], agent="coder"),
                       sub("ui", ["board"], agent="designer"),
                       sub("test", ["ai", "ui"], agent="tester")]}
GOBANG_NO_TEST = {"subtasks": GOBANG["subtasks"][:4]}


@pytest.mark.parametrize("loser, why", [
    ({"subtasks": [sub("game", agent="coder")]}, "one subtask for a multi-step task"),
    (edges_plan("", "board ai ui"), "no dependencies (flat)"),
    (edges_plan("a>b", "c"), "unconnected pieces"),
    (GOBANG_NO_TEST, "2 final subtasks"),
])
def test_one_node_flat_and_loose_plans_lose_to_a_connected_plan(loser, why):
    # Under P_avg (1/depth) every one of these beats the 3-level gobang plan.
    for order in ([loser, GOBANG], [GOBANG, loser]):
        cands = [candidate(i, p) for i, p in enumerate(order)]
        assert cands[order.index(loser)].scores["parallelism"] > \
            cands[order.index(GOBANG)].scores["parallelism"]
        chosen = select(cands, TASK_STEPS)
        assert order[chosen] is GOBANG
        lost = cands[order.index(loser)].note
        assert lost.startswith(f"lost to candidate {chosen}") and why in lost


@pytest.mark.parametrize("task", [TASK_STEPS, "How to Spray Stucco"])
def test_dropping_the_last_step_of_a_chain_does_not_win(task):
    # Theorem 1 per subtask alone prefers the shorter chain (0.855 > 0.813 at p=0.1); SmolLM2
    # gave a two-step plan for "How to Spray Stucco" and it beat two three-step ones.
    for order in ([PAIR, CHAIN], [CHAIN, PAIR]):
        cands = [candidate(i, p) for i, p in enumerate(order)]
        assert cands[order.index(PAIR)].scores["success_share"] > \
            cands[order.index(CHAIN)].scores["success_share"]
        chosen = select(cands, task)
        assert order[chosen] is CHAIN
        assert "3 subtasks against 2: fewer than 3 cover less" in cands[chosen].note


def test_speedup_rewards_width_not_only_shallowness():
    # A 4-node chain against 8 nodes running 4 at once under one integrating step.
    wide = edges_plan("a>e b>e c>e d>e e>f f>g g>h")
    chain = edges_plan("a>b b>c c>d")
    cands = [candidate(0, chain), candidate(1, wide)]
    assert cands[0].scores["parallelism"] > cands[1].scores["parallelism"]
    assert select(cands, TASK_STEPS) == 1
    assert "speed-up |V|/T 1.60 > 1.00" in cands[1].note


def test_a_one_step_task_may_have_a_one_node_plan():
    one = {"subtasks": [sub("haiku")]}
    cands = [candidate(0, one), candidate(1, PAIR)]
    assert select(cands, "Write a haiku") == 0
    assert select(cands, TASK_STEPS) == 1


def test_selection_ties_are_within_1e9():
    a = candidate(0, PAIRS, speedup=2.0 + 4e-10, success_share=0.9)
    b = candidate(1, PAIRS, speedup=2.0, success_share=0.9 - 4e-10, nodes=3)
    assert select([a, b]) == 1          # both ties hold, so fewer nodes decides
    c = candidate(2, PAIRS, speedup=2.0 + 1e-6)
    assert select([a, b, c]) == 2       # a real difference in speed-up is not a tie


def test_failed_candidate_with_better_scores_is_never_chosen():
    failed = candidate(0, PAIRS, error="ModelOutputError: no JSON", parallelism=1.0,
                       dependency_complexity=0.0, nodes=1, speedup=9.0, coverage=2)
    no_workflow = Candidate(index=1, seed=1, scores={"parallelism": 1.0,
                                                     "dependency_complexity": 0.0, "nodes": 1})
    chosen = candidate(2, CHAIN)
    assert select([failed, no_workflow, chosen]) == 2


def test_all_failed_is_one_plan_error_line():
    cands = [Candidate(0, 0, error="ModelOutputError: the model's answer has no JSON value"),
             Candidate(1, 1, error="ModelOutputError: the model's answer has no JSON value"),
             Candidate(2, 2, error="TruncatedError: the model's JSON answer was cut off")]
    with pytest.raises(PlanError) as info:
        select(cands)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("all 3 candidate plans failed: 2 x the model did not answer with JSON")
    assert "cut off" in message and message.endswith("or use a stronger model")
    with pytest.raises(PlanError):
        select([])


def test_candidate_round_trips_through_json():
    cand = candidate(1, {"subtasks": [sub("a", estimate_s=5), sub("b", ["a"], estimate_s=7.5)]})
    cand.warnings, cand.tokens_in, cand.cost_usd, cand.call_id = ["w"], 12, 0.25, 7
    back = Candidate.from_dict(json.loads(json.dumps(cand.to_dict())))
    assert back.to_dict() == cand.to_dict()
    assert back.workflow.nodes["b"].estimate_s == 7.5 and back.workflow.edges() == [("a", "b")]
    failed = Candidate(2, 2, error="PlanError: empty")
    assert Candidate.from_dict(failed.to_dict()).to_dict() == failed.to_dict()


# -- prompts ----------------------------------------------------------------------------------

def test_strategies_change_the_prompt():
    systems = {s: planning_messages(TASK, strategy=s)[0]["content"] for s in STRATEGIES}
    assert len(set(systems.values())) == len(STRATEGIES)
    assert "few, large subtasks (2 to 4)" in systems["coarse"]
    assert "many small subtasks (6 to 12)" in systems["fine"]
    assert "longest chain" in systems["critical-path"] and "estimate_s" in systems["critical-path"]
    assert "estimate_s" not in systems["balanced"]
    for text in systems.values():
        assert "id" in text and "depends_on" in text and "agent" in text and "parallel" in text
    assert plan_schema("critical-path")["properties"]["subtasks"]["items"]["required"][-1] == "estimate_s"
    assert "estimate_s" not in plan_schema()["properties"]["subtasks"]["items"]["required"]


def test_prompt_example_is_valid_and_short():
    for strategy in STRATEGIES:
        system, user = planning_messages(TASK, strategy=strategy, max_subtasks=5, max_agents=2)
        example = system["content"][system["content"].index('{"subtasks"'):]
        wf = parse_plan(example)
        assert list(wf.nodes) == ["first_id", "second_id", "last_id"]
        assert wf.edges() == [("first_id", "last_id"), ("second_id", "last_id")]
        # Nothing in it can pass for a plan: copied as is, it is a failed candidate.
        assert all(n.requirement.startswith("<") for n in wf.nodes.values())
        assert "copy the prompt's example" in check_plan(
            [n.requirement for n in wf.nodes.values()], TASK, EXAMPLE_TEXTS)
        schema_note = json.dumps(plan_schema(strategy, 5), separators=(",", ":"))
        # SmolLM2 has 8k tokens of context; the whole request stays far below (~4 chars a token).
        assert len(system["content"]) + len(user["content"]) + len(schema_note) < 3200
        assert user["content"] == f"Task: {TASK}"


def test_caps_and_context_reach_the_prompt():
    system, user = planning_messages(TASK, strategy="fine", max_subtasks=4, max_agents=2,
                                     context={"csv_path": "tea.csv"})
    assert "many small subtasks (4)" in system["content"]  # the usual range yields to the cap
    assert "at most 4 subtasks" in system["content"] and "at most 2 different agent roles" in system["content"]
    assert '"csv_path": "tea.csv"' in user["content"]
    assert plan_schema("fine", 4)["properties"]["subtasks"]["maxItems"] == 4
    assert plan_schema("fine", 1)["properties"]["subtasks"]["minItems"] == 1


@pytest.mark.parametrize("kwargs, word", [
    ({"strategy": "greedy"}, "balanced, coarse, fine, critical-path"),
    ({"k": 0}, "k is the number"),
    ({"max_subtasks": 0}, "max_subtasks"),
    ({"max_agents": "2"}, "max_agents"),
])
def test_bad_settings_are_one_line_config_errors(kwargs, word):
    with pytest.raises(ConfigError) as info:
        asyncio.run(plan_candidates(TASK, llm=fast_llm(), **kwargs))
    assert word in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(ConfigError):
        asyncio.run(plan_candidates("  ", llm=fast_llm()))


# -- K candidates over HTTP ---------------------------------------------------------------------

def test_k_candidates_are_concurrent_with_distinct_seeds():
    replies = {10: CHAIN, 11: MESSY, 12: PAIRS, 13: "Sorry, I cannot plan that."}
    llm = fast_llm()
    with LoopbackServer(responder=by_seed(replies), latency=0.4) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        cands = run(lambda: plan_candidates(TASK, k=4, seed=10, llm=llm, run_id="r1"), llm)
        stats = server.stats(bodies=True)
    bodies = [r["body"] for r in stats["requests"] if r["path"].endswith("/chat/completions")]
    assert sorted(b["seed"] for b in bodies) == [10, 11, 12, 13]
    assert {b["temperature"] for b in bodies} == {0.7}
    assert all(b["response_format"]["type"] == "json_schema" for b in bodies)
    assert stats["max_in_flight"] == 4   # all four were waiting out their 0.4 s together
    assert [c.index for c in cands] == [0, 1, 2, 3] and [c.seed for c in cands] == [10, 11, 12, 13]

    chain, messy, pairs, garbage = cands
    assert chain.ok and {k: chain.scores[k] for k in ("parallelism", "dependency_complexity",
                                                       "nodes", "edges", "depth", "width",
                                                       "speedup", "sinks", "connected")} \
        == pytest.approx({"parallelism": 1 / 3, "nodes": 3, "edges": 2, "depth": 3, "width": 1,
                          "dependency_complexity": metrics.dependency_complexity(chain.workflow),
                          "speedup": 1.0, "sinks": 1, "connected": True})
    assert messy.ok and messy.workflow.edges() == [("gather_sources", "draft")]
    assert messy.workflow.nodes["draft"].agent == "writer" and messy.warnings
    assert messy.warnings == messy.workflow.warnings
    assert pairs.scores["parallelism"] == 0.5 and pairs.scores["width"] == 2
    assert garbage.workflow is None and garbage.error.startswith("ModelOutputError: ")
    assert "\n" not in garbage.error
    for c in (chain, messy, pairs):
        assert c.tokens_in > 0 and c.tokens_out > 0 and c.call_id and c.model == "default:m"
        assert c.workflow.task == TASK
    # CHAIN and MESSY are connected with one sink and speed-up 1; MESSY's 2 nodes expect more
    # successes per subtask. PAIRS (two pieces) would have won under P_avg.
    assert select(cands) == 1
    calls = llm.store.recent_calls(10, run_id="r1")
    assert len(calls) == 4 and {c["purpose"] for c in calls} == {"plan"}
    assert {c.call_id for c in cands if c.ok} <= {c["id"] for c in calls}
    assert [c["error"] is not None for c in calls].count(True) == 1   # the garbage reply


def test_repeat_is_served_from_the_cache():
    llm = fast_llm()
    with LoopbackServer(responder=by_seed({0: CHAIN, 1: PAIRS})) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        first = run(lambda: plan_candidates(TASK, k=2, llm=llm), llm)
        again = run(lambda: plan_candidates(TASK, k=2, llm=llm), llm)
        assert server.stats()["calls"] == 2
    assert all(c.cached for c in again) and not any(c.cached for c in first)
    assert [c.workflow.to_dict() for c in again] == [c.workflow.to_dict() for c in first]


def test_failures_are_recorded_per_candidate_and_summarised_when_all_fail():
    replies = {0: {"subtasks": []}, 1: "no plan here", 2: RuntimeError("boom"), 3: PAIR}
    llm = fast_llm(max_retries=1)
    with LoopbackServer(responder=by_seed(replies)) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        cands, chosen = run(lambda: plan(TASK, k=4, llm=llm), llm)
    kinds = [c.error.partition(":")[0] if c.error else None for c in cands]
    assert kinds == ["PlanError", "ModelOutputError", "EndpointError", None]
    assert chosen == 3 and cands[0].tokens_out > 0   # the unusable plan still cost tokens
    with pytest.raises(PlanError) as info:
        select(cands[:3])
    message = str(info.value)
    assert message.startswith("all 3 candidate plans failed: the plan had no usable subtasks")
    assert "the model did not answer with JSON" in message and "the endpoint failed" in message
    assert "\n" not in message


def test_critical_path_strategy_carries_estimates():
    timed = {"subtasks": [sub("a", estimate_s=30), sub("b", estimate_s=5), sub("c", ["a", "b"], estimate_s=10)]}
    llm = fast_llm()
    with LoopbackServer(responder=by_seed({0: timed})) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        (cand,) = run(lambda: plan_candidates(TASK, k=1, strategy="critical-path", llm=llm), llm)
        body = server.stats(bodies=True)["requests"][-1]["body"]
    schema = body["response_format"]["json_schema"]["schema"]
    assert "estimate_s" in schema["properties"]["subtasks"]["items"]["required"]
    assert "longest chain" in body["messages"][0]["content"]
    assert cand.workflow.nodes["a"].estimate_s == 30 and cand.scores["critical_path_s"] == 40


def test_caps_cut_subtasks_and_map_agent_roles_with_warnings():
    # f is dropped by the cap, but b depended on it and f on a: b must still come after a.
    big = {"subtasks": [sub("a", agent="coder"), sub("b", ["f"], agent="coder"),
                        sub("c", agent="writer,"), sub("d", ["c"], agent="Data Analyst"),
                        sub("e", agent="designer"), sub("f", ["a"], agent="tester")]}
    llm = fast_llm()
    with LoopbackServer(responder=by_seed({0: big})) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        (cand,) = run(lambda: plan_candidates(TASK, k=1, max_subtasks=4, max_agents=2,
                                              llm=llm), llm)
        body = server.stats(bodies=True)["requests"][-1]["body"]
    assert "at most 4 subtasks" in body["messages"][0]["content"]
    wf = cand.workflow
    assert list(wf.nodes) == ["a", "b", "c", "d"]
    assert wf.edges() == [("a", "b"), ("c", "d")]
    assert [wf.nodes[i].agent for i in wf.nodes] == ["coder", "coder", "writer", "coder"]
    cap_warnings = [w for w in cand.warnings if "max_" in w]
    assert len(cap_warnings) == 2
    assert "kept the first 4 of 6 subtasks (max_subtasks=4); dropped e, f" in cap_warnings[0]
    assert "data_analyst -> coder" in cap_warnings[1] and "max_agents=2" in cap_warnings[1]
    assert cand.scores["nodes"] == 4 and cand.warnings == wf.warnings


# -- the real embedded model -------------------------------------------------------------------

@pytest.mark.embedded
@pytest.mark.timeout(900)
def test_embedded_model_plans_a_connected_on_topic_data_science_plan(embedded_url):
    # One candidate, two or three short capped calls: ~10-20 s at load 1; the bounds are wide
    # so that a machine shared by many (120 s at load 12 here) still finishes. Seeded, so the
    # same answer every run.
    task = ("Analyse customers.csv with pandas: load it, summarise each column, plot the "
            "churn rate by region, and write three findings")
    llm = LLM(timeout=600)
    started = time.perf_counter()
    cands = run(lambda: plan_candidates(task, k=1, llm=llm, model="local", time_limit_s=800), llm)
    elapsed = time.perf_counter() - started
    print(f"\nembedded planning (stepwise), k=1: {elapsed:.1f} s")
    chosen = select(cands, task)
    for c in cands:
        print(" ", candidate_line(c, chosen))
        if c.ok:
            for node_id, node in c.workflow.nodes.items():
                print(f"    {node_id} [{node.agent}] {node.requirement[:70]!r} <- "
                      f"{c.workflow.parents(node_id)}")
    best = cands[chosen]
    wf = best.workflow
    assert best.model == "local:smollm2-135m-instruct" and best.tokens_out > 0
    assert 3 <= len(wf.nodes) <= 8 and nx.is_directed_acyclic_graph(wf.graph)
    assert metrics.is_connected(wf) and len(metrics.sinks(wf)) == 1 and wf.edges()
    assert best.scores["topic_share"] >= 0.5, best.scores
    assert not any(c.error and c.error.startswith("OffTopicError") for c in cands)
    calls = llm.store.recent_calls(10)
    assert calls and all(0 < c["params"]["max_tokens"] <= 512 for c in calls)


# -- prompts that cannot be copied, stepwise planning, bounds -------------------------------

DS_TASK = "Analyse sales.csv: load it, summarise each column, plot two relationships, write findings"


def test_a_copied_example_is_a_failed_candidate():
    # What SmolLM2 did with the old prompt (its worked tea example, for a sales analysis), and
    # the new prompt's placeholders copied as they are: both fail; the real plan is chosen.
    old_copy = {"subtasks": [sub("facts", agent="researcher") | {"requirement": "List five facts about tea."},
                             sub("photo") | {"requirement": "Describe a photo of a teacup."}]}
    system = planning_messages(DS_TASK)[0]["content"]
    placeholders = json.loads(system[system.index('{"subtasks"'):])
    real = {"subtasks": [sub("load") | {"requirement": "Load sales.csv with pandas."},
                         sub("plot", ["load"]) | {"requirement": "Plot two relationships."}]}
    llm = fast_llm()
    with LoopbackServer(responder=by_seed({0: placeholders, 1: real})) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        cands = run(lambda: plan_candidates(DS_TASK, k=2, llm=llm), llm)
    assert cands[0].error.startswith("OffTopicError: 3 of 3 subtasks copy the prompt's example")
    assert cands[0].workflow is None and cands[1].ok
    assert select(cands, DS_TASK) == 1
    assert check_plan(["List five facts about tea.", "Describe a photo of a teacup."], DS_TASK,
                      ["List five facts about tea.", "Describe a photo of a teacup."])
    # The same words are no copy when they are the task's own.
    assert check_plan(["List five facts about tea."], "List five facts about tea",
                      ["List five facts about tea."]) is None


def stepwise_responder(steps_by_seed, needs):
    """Answers the steps question (plain text) with steps_by_seed[seed] as numbered lines,
    the dependency question (under a JSON schema) with needs."""
    def respond(body):
        if "response_format" not in body:
            return "\n".join(f"{i}. {s}" for i, s in enumerate(steps_by_seed[body["seed"]], 1))
        return json.dumps(needs)
    return respond


def test_stepwise_plans_steps_then_dependencies_and_ends_in_one_deliverable():
    steps = ["Load sales.csv with pandas and list its columns",
             "Summarise each column of sales.csv", "Plot two relationships in sales.csv",
             "Write three findings about sales"]
    # The model links 2 and 3 to 1 but leaves 2 unused: the last step takes it in.
    needs = {"2": ["1"], "3": ["1"], "4": ["3"]}
    llm = fast_llm()
    with LoopbackServer(responder=stepwise_responder({0: steps}, needs)) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        (cand,) = run(lambda: plan_candidates(DS_TASK, k=1, llm=llm, method="stepwise"), llm)
        bodies = [r["body"] for r in server.stats(bodies=True)["requests"]
                  if r["path"].endswith("/chat/completions")]
    # The steps come as numbered lines with no grammar (one applied to every token made
    # generation ~3x slower); the dependencies under a schema.
    assert "response_format" not in bodies[0] and 0 < bodies[0]["max_tokens"] <= 400
    assert bodies[0]["messages"][-1]["content"].endswith(
        "Every step is about sales.csv: name it in each step.")
    # The dependency question continues the steps conversation (a server that keeps the
    # prompts it evaluated evaluates the question alone): the steps prompt, the model's own
    # answer to it, then the question, with the first worked example's answer as its form.
    asked, n = bodies[1]["messages"], len(bodies[0]["messages"])
    assert asked[:n] == bodies[0]["messages"]
    assert asked[n] == {"role": "assistant",
                        "content": "\n".join(f"{i}. {s}" for i, s in enumerate(steps, 1))}
    assert asked[n + 1]["content"].startswith("For each step you listed, give the numbers")
    assert ('same time, so list only what a step really uses. For the first task above, the '
            'answer is {"2": [], "3": ["1", "2"]}.') in asked[n + 1]["content"]
    second = bodies[1]["response_format"]["json_schema"]["schema"]
    # Ids can only name earlier steps: the grammar has no way to write a cycle or a new id.
    assert second["properties"]["4"]["items"]["enum"] == ["1", "2", "3"]
    assert "2" not in second["properties"]["2"]["items"]["enum"]
    # Two retrieved worked examples; the data-analysis template is the closest to this task.
    shots = [m["content"] for m in bodies[0]["messages"] if m["role"] == "user"]
    assert len(shots) == 3 and "exploratory data analysis" in shots[0]
    assert all(b["max_tokens"] for b in bodies)   # every call is capped
    wf = cand.workflow
    assert cand.ok and len(wf.nodes) == 4 and nx.is_weakly_connected(wf.graph)
    last = list(wf.nodes)[-1]
    assert wf.nodes[list(wf.nodes)[0]].requirement == steps[0]
    assert metrics.sinks(wf) == [last] and len(wf.parents(last)) == 2
    assert any("now also uses" in w for w in cand.warnings)
    assert cand.tokens_out > 0 and cand.scores["topic_share"] == 1.0
    assert wf.nodes[last].agent == "writer"


def test_stepwise_plans_one_subtask_when_capped_at_one_with_one_call():
    """max_subtasks=1 (make demo): a model that lists the one step asked for gets a plan of
    it (it was refused as "a plan needs at least two"), and no question is asked about what
    the one step needs from earlier ones."""
    llm = fast_llm()
    steps = ["Print the mean of x and y per dataset of anscombe.csv"]
    with LoopbackServer(responder=stepwise_responder({0: steps, 7919: steps}, {})) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        (cand,) = run(lambda: plan_candidates(DS_TASK, k=1, llm=llm, method="stepwise",
                                              max_subtasks=1), llm)
        asked = [r for r in server.stats(bodies=True)["requests"]
                 if r["path"].endswith("/chat/completions")]
    assert cand.ok, cand.error
    assert [n.requirement for n in cand.workflow.nodes.values()] == steps
    assert len(asked) == 1 and "response_format" not in asked[0]["body"]


def test_stepwise_asks_no_dependencies_for_steps_that_copy_a_worked_example():
    """Steps that copy a worked example of the prompt fail the candidate whatever their
    dependencies are: the dependency question is not asked for them (a model call less), and
    the candidate fails as before, with its calls' tokens counted."""
    from flowmagic.engine.stepwise import retrieve

    copied = retrieve(DS_TASK, 2)[0].steps
    llm = fast_llm()
    with LoopbackServer(responder=stepwise_responder({0: copied, 7919: copied}, {})) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        (cand,) = run(lambda: plan_candidates(DS_TASK, k=1, llm=llm, method="stepwise"), llm)
        asked = [r["body"] for r in server.stats(bodies=True)["requests"]
                 if r["path"].endswith("/chat/completions")]
    assert cand.error.startswith("OffTopicError:") and "copy the prompt's example" in cand.error
    assert asked and not any("response_format" in b for b in asked)
    assert cand.tokens_out > 0


def test_stepwise_retrieves_the_users_own_finished_runs_first():
    from flowmagic.engine.stepwise import retrieve
    from flowmagic.store import Store

    store = Store(":memory:")
    plan_ = parse_plan({"subtasks": [sub("fetch") | {"requirement": "Fetch the ledger of invoices"},
                                     sub("sum", ["fetch"]) | {"requirement": "Sum the invoices"},
                                     sub("mail", ["sum"]) | {"requirement": "Mail the invoice totals"}]},
                       task="Total the invoices of the ledger and mail them")
    for n in plan_.nodes.values():
        n.status = "done"
    store.save_run("r1", task=plan_.task, workflow=plan_.to_dict(), status="done")
    got = retrieve("Total last month's invoices from the ledger", 2, store)
    assert got[0].source == "run r1" and got[0].needs == {"2": ["1"], "3": ["2"]}
    assert got[1].source.startswith(("template", "shipped"))


def test_planning_stops_at_its_time_limit():
    llm = fast_llm()
    with LoopbackServer(latency=3.0) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        started = time.perf_counter()
        cands = run(lambda: plan_candidates(DS_TASK, k=2, llm=llm, time_limit_s=0.5), llm)
        elapsed = time.perf_counter() - started
    assert elapsed < 2.5
    assert all(c.error.startswith("TimeoutError: no plan within 0.5 s") for c in cands)
    with pytest.raises(PlanError, match="no plan came within the time limit"):
        select(cands)


def test_stepwise_keeps_the_steps_when_the_dependency_answer_is_unreadable():
    steps = ["Count the rows of sales.csv", "Summarise sales.csv", "Write the sales findings"]
    llm = fast_llm()
    with LoopbackServer(responder=stepwise_responder({0: steps}, None)) as server:
        server.responder = lambda body: ("1. " + "\n2. ".join(steps)
                                         if "response_format" not in body
                                         else '{"2": ["1"], "3": [')   # cut off
        flowmagic.configure(base_url=server.base_url, model="m")
        (cand,) = run(lambda: plan_candidates(DS_TASK, k=1, llm=llm, method="stepwise"), llm)
    assert cand.ok and len(cand.workflow.nodes) == 3
    assert metrics.sinks(cand.workflow) == [list(cand.workflow.nodes)[-1]]
    assert "could not be read" in cand.warnings[0]


def plan_asked_twice(task, first, second, **options):
    """One stepwise candidate whose first steps answer is `first` and whose second (the ask
    again, seed REASK_SEED) is `second`; (candidate, the chat request bodies in order)."""
    from flowmagic.engine.stepwise import REASK_SEED

    llm = fast_llm()
    with LoopbackServer(responder=stepwise_responder({0: first, REASK_SEED: second},
                                                     {"2": ["1"], "3": ["2"]})) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        (cand,) = run(lambda: plan_candidates(task, k=1, llm=llm, method="stepwise", **options),
                      llm)
        bodies = [r["body"] for r in server.stats(bodies=True)["requests"]
                  if r["path"].endswith("/chat/completions")]
    return cand, bodies


def test_stepwise_names_the_subject_and_asks_again_when_a_step_drifts():
    from flowmagic.engine.stepwise import REASK_SEED

    task = "How to Prepare Saffron"
    drift = ["Prepare the saffron threads", "Cook the pasta with garlic", "Serve hot ginger beer"]
    kept = ["Crush the saffron threads", "Soak the saffron in warm water",
            "Stir the saffron water into the rice"]
    cand, bodies = plan_asked_twice(task, drift, kept)
    assert len(bodies) == 3   # steps, steps again, dependencies
    assert bodies[0]["messages"][-1]["content"] == (
        "Task: How to Prepare Saffron\nEvery step is about saffron: name it in each step.")
    assert bodies[1]["messages"] == bodies[0]["messages"]
    assert (bodies[0]["seed"], bodies[1]["seed"]) == (0, REASK_SEED)
    assert [n.requirement for n in cand.workflow.nodes.values()] == kept
    assert cand.scores["topic_share"] == 1.0
    assert any("3 steps, 33% about the task; asked again and kept the second (3 steps, 100%)"
               in w for w in cand.warnings)


def test_stepwise_reads_steps_numbered_twice_or_written_on_one_line():
    from flowmagic.engine.stepwise import clean_steps

    # Both as SmolLM2 wrote them for "How to Prepare Saffron".
    assert clean_steps("1. 1. Take a pan with a little saffron\n2. 2. Add the saffron butter",
                       8) == ["Take a pan with a little saffron", "Add the saffron butter"]
    assert clean_steps("1. Soak the saffron in water. 2. Crush the saffron threads. 3. Add "
                       "2 cups of rice", 8) == ["Soak the saffron in water.",
                                                "Crush the saffron threads.", "Add 2 cups of rice"]


def test_stepwise_drops_a_line_that_says_the_prompt_back():
    from flowmagic.engine.stepwise import clean_steps

    # SmolLM2 listed the prompt's own instruction (with the task's words in it) as a step.
    answer = ("1. Task: How to Relieve Urinary Tract Infections in Cats\n"
              "2. Pattern: urinary, tract, infections, cats: name it in each step.\n"
              "3. Take the cat with the urinary tract infection to a vet\n"
              "4. Every step is about cats\n"
              "5. Give the cat the medicine the vet prescribed for the infection")
    assert clean_steps(answer, 8) == ["Take the cat with the urinary tract infection to a vet",
                                      "Give the cat the medicine the vet prescribed for the "
                                      "infection"]


def test_stepwise_asks_again_when_only_one_step_is_left_beside_a_prompt_echo():
    # Tutorial 03's slides plan (two subtasks at most), as recorded before: SmolLM2 listed one
    # step and the prompt's own instruction, which became a node "every_step_is_about".
    from flowmagic.engine.stepwise import REASK_SEED

    task = "Write LaTeX Beamer slides on reinforcement learning for teaching"
    echo = ["Share the slides on reinforcement learning",
            "Every step is about teaching, research: name it in each step."]
    kept = ["Write the slides on each reinforcement learning algorithm",
            "Compile the reinforcement learning slides"]
    cand, bodies = plan_asked_twice(task, echo, kept, max_subtasks=2)
    assert [b["seed"] for b in bodies] == [0, REASK_SEED, 0]
    assert [n.requirement for n in cand.workflow.nodes.values()] == kept


def test_stepwise_asks_again_when_the_answer_has_too_few_steps():
    # No grammar counts the lines any more: SmolLM2 wrote two steps for "How to Prepare
    # Saffron" where at least three were asked for.
    from flowmagic.engine.stepwise import REASK_SEED

    task = "How to Prepare Saffron"
    short = ["Cut the saffron sprigs", "Wash the saffron with hot water"]
    kept = ["Crush the saffron threads", "Soak the saffron in warm water",
            "Stir the saffron water into the rice"]
    cand, bodies = plan_asked_twice(task, short, kept)
    assert [b["seed"] for b in bodies] == [0, REASK_SEED, 0]
    assert [n.requirement for n in cand.workflow.nodes.values()] == kept


def test_a_plan_on_topic_beats_a_wider_plan_that_drifts():
    task = "Analyse sales.csv: load it, plot it and write findings"
    on = {"subtasks": [sub("load") | {"requirement": "Load sales.csv"},
                       sub("plot", ["load"]) | {"requirement": "Plot the sales by month"},
                       sub("findings", ["plot"]) | {"requirement": "Write findings on sales"}]}
    drift = {"subtasks": [sub("load") | {"requirement": "Load sales.csv"},
                          sub("fence") | {"requirement": "Paint the garden fence"},
                          sub("findings", ["load", "fence"]) |
                          {"requirement": "Write findings on sales"}]}
    cands = [Candidate(i, i, workflow=parse_plan(p, task=task),
                       scores=score(parse_plan(p, task=task), task))
             for i, p in enumerate([drift, on])]
    assert cands[0].scores["speedup"] > cands[1].scores["speedup"]
    assert select(cands, task) == 1
    assert "100% of subtasks on topic > 67%" in cands[1].note


def test_following_the_users_own_plan_for_the_same_task_is_no_copy():
    # `make demo` twice: the first run's plan is retrieved as a worked example for the second
    # and SmolLM2 follows it. That is the user's own plan for this task, not a copied example.
    task = ("Write a short guide to brewing green tea: pick the leaves, heat the water, "
            "steep, and serve")
    steps = ["Pick the green tea leaves", "Place them in boiling water and let it steep for 10 "
             "minutes", "Serve hot ginger beer with a side of steamed asparagus"]
    past = parse_plan({"subtasks": [sub("pick") | {"requirement": steps[0]},
                                    sub("steep", ["pick"]) | {"requirement": steps[1]},
                                    sub("serve", ["steep"]) | {"requirement": steps[2]}]},
                      task=task)
    for node in past.nodes.values():
        node.status = "done"
    llm = fast_llm()
    llm.store.save_run("r0", task=task, workflow=past.to_dict(), status="done")
    respond = stepwise_responder({0: steps}, {"2": ["1"], "3": ["2"]})
    with LoopbackServer(responder=respond) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        (cand,) = run(lambda: plan_candidates(task, k=1, llm=llm, method="stepwise"), llm)
        shown = server.stats(bodies=True)["requests"][0]["body"]["messages"][2]["content"]
    assert "Place them in boiling water" in shown   # the past run was the first example
    assert cand.ok, cand.error
    # A shipped example's steps for another task are still a copy.
    assert check_plan(["Mix flour, eggs and milk into a batter"], task,
                      ["Mix flour, eggs and milk into a batter"])


def test_the_dependency_question_shows_the_steps_as_kept_when_the_answer_lost_a_line():
    """When a line of the model's steps answer was no step (it said the prompt back), the
    numbers of the kept steps are not those of its lines: the conversation shows the steps as
    kept, numbered as the question means them."""
    from flowmagic.engine.stepwise import clean_steps, needs_continued, steps_messages

    said = ("1. Task: explore sales.csv\n2. Summarise each column of sales.csv\n"
            "3. Plot two relationships in sales.csv")
    steps = clean_steps(said, 8)
    assert steps == ["Summarise each column of sales.csv", "Plot two relationships in sales.csv"]
    ask = steps_messages(DS_TASK, [], 2, 5)
    turns = needs_continued(ask, steps, [], said)
    assert turns[len(ask)]["content"] == ("1. Summarise each column of sales.csv\n"
                                          "2. Plot two relationships in sales.csv")
    # lines numbered 2 and 3 are not steps 1 and 2 either
    assert needs_continued(ask, steps, [], said.split("\n", 1)[1])[len(ask)] == turns[len(ask)]
    own = "1. Summarise each column of sales.csv\n2. Plot two relationships in sales.csv"
    assert needs_continued(ask, steps, [], own + "\n")[len(ask)]["content"] == own + "\n"
