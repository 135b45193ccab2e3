"""Reliability, part 1 (issue 9): damaged plans and updates give a DAG or one line.

tests/test_plan_repair.py and tests/test_updater.py fuzz the *shapes* of plans and
updates. Here the damage is done the way it arrives from a model: to the text (characters
dropped or doubled, a cut-off, fences and prose around it, quotes swapped, stray
brackets, NUL, lone surrogates, 50,000-character strings) and to a valid plan's structure
(cycles, unknown and self references, duplicate ids, empty and huge requirements, unicode
ids). About 1,900 examples in all, derandomized so CI sees the same ones every time.

The contract: `parse_plan` returns a valid DAG, or raises `PlanError` with a one-line
message; `updater.merge` returns a valid DAG in which every finished node that the update
did not rerun or remove keeps its output, or raises a one-line `PlanError`; planning over
HTTP turns any reply into a Flow or a one-line FlowError. Never another exception.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random

import networkx as nx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import flowmagic
from flowmagic.errors import FlowError, PlanError
from flowmagic.model.graph import STATUSES, Workflow, is_slug, parse_plan
from flowmagic.llm import LLM
from flowmagic.testing.loopback import LoopbackServer
from flowmagic.engine.updater import DIFF_KEYS, merge

pytestmark = pytest.mark.timeout(240)

_HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
           HealthCheck.large_base_example]


def fuzz(n: int):
    """Hypothesis settings for this file: fixed examples (derandomized), no database."""
    return settings(max_examples=n, deadline=None, derandomize=True, database=None,
                    suppress_health_check=_HEALTH)


# ------------------------------------------------------------------------------ invariants
def one_line(message: str) -> None:
    assert isinstance(message, str) and message.strip(), repr(message)
    assert "\n" not in message and "\r" not in message, repr(message)


def assert_dag(wf: Workflow) -> None:
    """A valid workflow: slug ids, a DAG among active nodes, derived counts, a lossless round trip."""
    assert isinstance(wf, Workflow) and wf.nodes
    assert nx.is_directed_acyclic_graph(wf.graph)
    assert set(wf.graph.nodes) == set(wf.nodes)
    for a, b in wf.graph.edges:
        assert a != b and "pruned" not in (wf.nodes[a].status, wf.nodes[b].status)
    for node_id, node in wf.nodes.items():
        assert is_slug(node_id) and node.id == node_id
        assert isinstance(node.requirement, str) and node.requirement.strip()
        assert node.status in STATUSES and isinstance(node.agent, str) and node.agent.strip()
    for warning in wf.warnings:
        one_line(warning)
    wf.order()  # a topological order exists and is computable
    again = Workflow.from_dict(json.loads(json.dumps(wf.to_dict())))
    assert list(again.nodes) == list(wf.nodes) and again.edges() == wf.edges()


def check_plan(obj) -> Workflow | None:
    try:
        wf = parse_plan(obj)
    except PlanError as err:
        one_line(str(err))
        return None
    assert_dag(wf)
    return wf


# ------------------------------------------------------------------------------ valid plans
SLUG_IDS = [f"t{i}" for i in range(12)]
ODD_IDS = ["Load the data", "数据_清洗", "Ünïcödé ☃", "step 2", "1", "2", "none", "A", "a",
           "x" * 300, " padded ", "emoji 🎉", "rtl \u202eevil", "tab\tand\nnewline"]
REQUIREMENTS = (st.text(min_size=1, max_size=40)
                | st.sampled_from(["load sales.csv", "plot y against z", "写一份报告",
                                   "x" * 50_000, "line one\nline two", "   ", "", "\x00nul",
                                   "emoji 🎉🎉", "\u202eright to left", "none", "{not json}"]))


@st.composite
def valid_plans(draw):
    """A plan the planner's schema allows: ids, requirements, agents, backward dependencies."""
    n = draw(st.integers(1, 12))
    ids = [draw(st.sampled_from(SLUG_IDS[i:i + 1] + ODD_IDS)) if draw(st.integers(0, 4)) == 0
           else SLUG_IDS[i] for i in range(n)]
    subtasks = []
    for i in range(n):
        parents = draw(st.lists(st.integers(0, max(i - 1, 0)), max_size=3, unique=True)) if i else []
        subtasks.append({"id": ids[i], "requirement": f"do part {i}",
                         "agent": draw(st.sampled_from(["coder", "writer", "researcher"])),
                         "depends_on": [ids[p] for p in parents]})
    return {"subtasks": subtasks}


def _deps(subtask: dict) -> list:
    deps = subtask.get("depends_on")
    return list(deps) if isinstance(deps, list) else [] if deps is None else [deps]


@st.composite
def structurally_mutated(draw):
    """A valid plan, then 1-6 of the structural faults small models make."""
    plan = draw(valid_plans())
    subs = plan["subtasks"]
    for _ in range(draw(st.integers(1, 6))):
        i = draw(st.integers(0, len(subs) - 1))
        s = subs[i]
        kind = draw(st.sampled_from(["cycle", "unknown", "self", "duplicate", "requirement",
                                     "drop_key", "wrong_type", "rename_key", "odd_id", "next"]))
        if kind == "cycle":   # a dependency on a later subtask: closes a cycle with the chain
            j = draw(st.integers(0, len(subs) - 1))
            s["depends_on"] = _deps(s) + [subs[j].get("id")]
        elif kind == "unknown":
            s["depends_on"] = _deps(s) + [draw(st.sampled_from(
                ["ghost", "step 99", 99, -1, "", None, {"id": "ghost"}, ["nested"], "a, b and c"]))]
        elif kind == "self":
            s["depends_on"] = _deps(s) + [s.get("id")]
        elif kind == "duplicate":
            copy = dict(s)
            if draw(st.booleans()):
                copy["requirement"] = "another requirement"
            subs.insert(draw(st.integers(0, len(subs))), copy)
        elif kind == "requirement":
            s["requirement"] = draw(REQUIREMENTS)
        elif kind == "drop_key":
            s.pop(draw(st.sampled_from(["id", "requirement", "agent", "depends_on"])), None)
        elif kind == "wrong_type":
            key = draw(st.sampled_from(["id", "requirement", "agent", "depends_on", "status",
                                        "output", "attempts", "tokens_in"]))
            s[key] = draw(st.sampled_from([None, True, 3.5, float("inf"), [], {}, [1, [2]],
                                           {"x": 1}, "done", "bogus", 10**30]))
        elif kind == "rename_key":
            old = draw(st.sampled_from(["requirement", "depends_on", "id"]))
            new = draw(st.sampled_from(["description", "Depends On", "prev", "next", "name",
                                        "DEPENDENCIES", "task_id", "children"]))
            if old in s:
                s[new] = s.pop(old)
        elif kind == "odd_id":
            s["id"] = draw(st.sampled_from(ODD_IDS) | st.text(max_size=8))
        elif kind == "next":   # next/child lists that disagree with the dependencies
            s["next"] = draw(st.lists(st.sampled_from([x.get("id") for x in subs]), max_size=3))
    wrap = draw(st.sampled_from(["subtasks", "bare", "paper", "nodes_edges", "nested"]))
    if wrap == "bare":
        return subs
    if wrap == "paper":
        return {str(s.get("id", i)): s for i, s in enumerate(subs)}
    if wrap == "nodes_edges":
        ids = [s.get("id") for s in subs]
        edges = draw(st.lists(st.lists(st.sampled_from(ids) | st.just("ghost"), min_size=2,
                                       max_size=2), max_size=8))
        return {"nodes": subs, "edges": edges}
    if wrap == "nested":
        return {"plan": {"title": "T", "steps": subs}}
    return {"subtasks": subs}


# ------------------------------------------------------------------------------ text damage
INSERTS = st.sampled_from([
    "{", "}", "[", "]", '"', "'", ",", ":", "\\", "\n", "```", "```json\n", "\n```\n",
    "null", "NaN", "Infinity", "True", "None", "// a comment\n", "/* c */", "...",
    "Here is the plan:", "Sure! ", "\x00", "\ud800", "\udfff", "名前", "☃", "\u202e",
    "\ufeff", "<think>hmm</think>", "x" * 20_000, "[" * 300, "{" * 300, "}" * 300,
    '"a": ', '{"id": "ghost"}', "\\u0000", "\\ud800", "\\\"",
]) | st.text(max_size=6)

WRAPS = ["@", "```json\n@\n```", "Sure! Here is the plan:\n@\nLet me know if you need more.",
         "```\n@", "<think>a plan with steps</think>\n@", "@\n\n@", "Plan: @ (end)",
         "```python\nplan = @\n```", "[@]", "{\"result\": @}", "```json\n@\n```\n```json\n@\n```"]


@st.composite
def garbled_text(draw, documents):
    """A JSON document as a model might send it, then 0-5 edits to its characters."""
    doc = draw(documents)
    text = json.dumps(doc, ensure_ascii=draw(st.booleans()),
                      indent=draw(st.sampled_from([None, None, 1, 2])))
    text = draw(st.sampled_from(WRAPS)).replace("@", text)
    for _ in range(draw(st.integers(0, 5))):
        op = draw(st.sampled_from(["drop", "dup", "truncate", "insert", "quotes", "swap",
                                   "replace", "strip_commas"]))
        i = draw(st.integers(0, len(text)))
        j = draw(st.integers(i, min(len(text), i + 60)))
        if op == "drop":
            text = text[:i] + text[j:]
        elif op == "dup":
            text = text[:j] + text[i:j] + text[j:]
        elif op == "truncate":
            text = text[:i]
        elif op == "insert":
            text = text[:i] + draw(INSERTS) + text[i:]
        elif op == "quotes":
            text = text[:i] + text[i:j].replace('"', "'") + text[j:]
        elif op == "swap" and j - i >= 2:
            text = text[:i] + text[j - 1] + text[i + 1:j - 1] + text[i] + text[j:]
        elif op == "replace" and j > i:
            text = text[:i] + draw(st.characters()) + text[i + 1:]
        elif op == "strip_commas":
            text = text[:i] + text[i:j].replace(",", "") + text[j:]
    return text


# ------------------------------------------------------------------------------ parse_plan
def test_generated_valid_plans_parse_exactly():
    """The generator's own baseline: an undamaged plan keeps its ids and edges, no warnings."""
    rng = random.Random(7)
    for n in range(1, 13):
        subs = [{"id": f"t{i}", "requirement": f"do {i}", "agent": "coder",
                 "depends_on": [f"t{p}" for p in sorted(rng.sample(range(i), min(i, 2)))]}
                for i in range(n)]
        wf = check_plan({"subtasks": subs})
        assert list(wf.nodes) == [s["id"] for s in subs] and wf.warnings == []
        assert sorted(wf.edges()) == sorted((p, s["id"]) for s in subs for p in s["depends_on"])


@fuzz(800)
@given(garbled_text(valid_plans() | structurally_mutated()))
def test_garbled_plan_text_is_a_dag_or_one_line(text):
    check_plan(text)


@fuzz(500)
@given(structurally_mutated())
def test_structurally_mutated_plans_are_a_dag_or_one_line(plan):
    wf = check_plan(plan)
    if wf is not None:
        assert parse_plan(plan).to_dict() == wf.to_dict()   # the same repairs every time
        subs = plan if isinstance(plan, list) else None
        if subs is not None:
            assert len(wf.nodes) <= len(subs)


@pytest.mark.parametrize("text", [
    "", " \n\t ", "\x00", "\ud800", "\ufeff", "```json\n```", "```json\n{", "null", "[]", "{}",
    "[" * 100_000, "{" * 100_000, '{"subtasks": [' + '{"id": "a", "requirement": "b"},' * 20_000 + "]",
    '{"subtasks": ["' + "x" * 1_000_000 + '"]}', "x" * 1_000_000, "☃" * 100_000,
    json.dumps({"subtasks": [{"id": "a" * 10_000, "requirement": "r", "depends_on": ["a" * 10_000]}]}),
    json.dumps({"subtasks": [{"id": "0", "requirement": "r", "depends_on": ["2000"]}]
                + [{"id": str(i), "requirement": "r", "depends_on": [str(i - 1)]}
                   for i in range(1, 2_001)]}),
], ids=lambda t: f"{len(t)}:{t[:12]!r}")
def test_extreme_texts(text):
    wf = check_plan(text)
    if text.startswith('{"subtasks": [{"id": "0", "requirement": "r", "depends_on": ["2000"]'):
        # a 2,001-node ring: exactly one edge is dropped to break it
        assert wf.graph.number_of_edges() == 2_000 and any("cycle" in w for w in wf.warnings)


# ------------------------------------------------------------------------------ planning over HTTP
@st.composite
def plan_replies(draw):
    if draw(st.integers(0, 3)) == 0:
        return json.dumps(draw(structurally_mutated()))
    return draw(garbled_text(valid_plans() | structurally_mutated()))


def test_planning_over_http_turns_any_reply_into_a_flow_or_one_line():
    """The whole planning path (structured call, extraction, repair, selection of K=2)."""
    replies: dict[str, str] = {}

    def responder(body):   # the user message opens with the task; the schema note follows
        task = body["messages"][-1]["content"].split("\n\n")[0]
        return replies.get(task, "{}")

    counter = itertools.count()
    outcomes = {"flow": 0, "error": 0}
    with LoopbackServer(responder=responder) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        llm = LLM(backoff_base=0.01, max_retries=0)

        @fuzz(60)
        @given(plan_replies())
        def one(reply):
            task = f"task number {next(counter)}"   # a new task: never a cache hit
            replies[f"Task: {task}"] = reply

            async def go():
                try:
                    return await flowmagic.aplan(task, k=2, llm=llm, name="fuzz")
                finally:
                    await llm.aclose()

            try:
                flow = asyncio.run(go())
            except FlowError as err:
                one_line(str(err))
                outcomes["error"] += 1
                return
            assert_dag(flow.workflow)
            assert len(flow.candidates) == 2
            outcomes["flow"] += 1

        one()
    assert outcomes["flow"] > 5 and outcomes["error"] > 5, outcomes


@pytest.mark.parametrize("reply", [
    "bad \ud800 text",                                                   # a lone surrogate
    '{"subtasks": [{"id": "a", "requirement": "\\ud800 escaped"}, {"id": "b", "requirement": "r"}]}',
    "[" * 1_200 + "]" * 1_200,                                            # deeper than recursion
    "{'subtasks': [{b'id': 'a', 'requirement': 'r'}, {'id': 'b', 'requirement': 's'}]}",
], ids=["surrogate", "escaped-surrogate", "deep", "bytes-key"])
def test_replies_that_used_to_crash_planning(reply):
    """Each of these escaped as UnicodeEncodeError, RecursionError or TypeError before."""
    with LoopbackServer(responder=lambda body: reply) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        llm = LLM(backoff_base=0.01, max_retries=0)

        async def go():
            try:
                return await flowmagic.aplan("a task", k=2, llm=llm)
            finally:
                await llm.aclose()

        try:
            flow = asyncio.run(go())
        except FlowError as err:
            one_line(str(err))
            return
        assert_dag(flow.workflow)
        json.dumps(flow.workflow.to_dict(), ensure_ascii=False).encode("utf-8")   # writable


# ------------------------------------------------------------------------------ merge
MERGE_IDS = ["a", "b", "c", "d", "e", "f", "g", "h"]


@st.composite
def live_workflows(draw):
    """A parsed plan part-way through a run: done (with outputs), failed, running, pruned."""
    n = draw(st.integers(1, len(MERGE_IDS)))
    subs = []
    for i, node_id in enumerate(MERGE_IDS[:n]):
        parents = draw(st.lists(st.sampled_from(MERGE_IDS[:i]), max_size=2, unique=True)) if i else []
        subs.append({"id": node_id, "requirement": f"do {node_id}", "depends_on": parents})
    wf = parse_plan({"subtasks": subs}, task="fuzz the merge")
    for node_id in wf.order():
        parents_done = all(wf.nodes[p].status == "done" for p in wf.parents(node_id))
        status = draw(st.sampled_from(["done", "done", "failed", "running", "pending"])
                      if parents_done else st.just("pending"))
        node = wf.nodes[node_id]
        node.status = status
        if status == "done":
            node.output = f"output of {node_id}"
        if status == "failed":
            node.error = "it failed"
    for node_id in MERGE_IDS[:n]:
        if wf.nodes[node_id].status == "pending" and draw(st.integers(0, 6)) == 0:
            wf.prune(node_id)
    return wf


UPDATE_REFS = st.sampled_from(MERGE_IDS + ["new_1", "new_2", "ghost", "A", " b ", "数据", "",
                                           "x" * 500, "step 2", "none"]) | st.integers(-2, 10)
UPDATE_TEXTS = st.text(max_size=30) | st.sampled_from(["x" * 50_000, "line\nbreak", "☃ 名前",
                                                       "", "   ", "\x00", "\ud800"])


@st.composite
def updates(draw):
    subtasks = []
    for _ in range(draw(st.integers(0, 6))):
        entry = {"id": draw(UPDATE_REFS)}
        if draw(st.booleans()):
            entry["requirement"] = draw(UPDATE_TEXTS)
        if draw(st.booleans()):
            entry["depends_on"] = draw(st.lists(UPDATE_REFS, max_size=4))
        if draw(st.integers(0, 3)) == 0:
            entry["rerun"] = draw(st.sampled_from([True, False, "yes", None, 1]))
        if draw(st.integers(0, 4)) == 0:
            entry["agent"] = draw(st.sampled_from(["coder", "", None, 5, "ünï"]))
        if draw(st.integers(0, 6)) == 0:
            entry.pop("id")
        subtasks.append(entry)
    update = {"action": draw(st.sampled_from(["update", "update", "update", "no_change", "UPDATE",
                                              "rewrite"])),
              "subtasks": subtasks}
    if draw(st.booleans()):
        update["remove"] = draw(st.lists(UPDATE_REFS, max_size=3))
    return update


def check_merge(wf: Workflow, update) -> Workflow:
    """Merge and check the invariants; the workflow to use next (unchanged on a PlanError)."""
    before = wf.to_dict()
    try:
        new, diff = merge(wf, update)
    except PlanError as err:
        one_line(str(err))
        assert wf.to_dict() == before
        return wf
    assert wf.to_dict() == before   # merge works on a copy
    assert_dag(new)
    assert set(diff) == set(DIFF_KEYS)
    for warning in diff["warnings"]:
        one_line(warning)
    touched = set(diff["rerun"]) | set(diff["removed"]) | set(diff["stale"])
    for node_id, node in wf.nodes.items():
        after = new.nodes[node_id]
        if node.status == "done" and node_id not in touched:
            assert after.status == "done" and after.output == node.output, node_id
        if node.status == "done" and node_id in touched:   # kept: as output (pruned) or attempt
            assert after.output == node.output or any(a.get("output") == node.output
                                                      for a in after.attempts), node_id
        if node.status == "running":
            assert after.to_dict() == node.to_dict()
        if node.status == "pruned":
            assert after.status == "pruned"
    assert set(diff["kept_finished"]) == {i for i, n in new.nodes.items()
                                          if n.status == "done" and wf.nodes.get(i) is not None
                                          and wf.nodes[i].status == "done"}
    return new


def progress(wf: Workflow, rng: random.Random) -> None:
    """What a run does between two updates: some ready nodes finish, running ones end."""
    for node_id in wf.order():
        node = wf.nodes[node_id]
        if node.status == "running" or (node.status == "pending" and rng.random() < 0.5
                                         and all(wf.nodes[p].status == "done"
                                                 for p in wf.parents(node_id))):
            node.status, node.output, node.stale = "done", f"later output of {node_id}", False


@fuzz(300)
@given(live_workflows(), garbled_text(updates()))
def test_garbled_update_text_merges_or_is_one_line(wf, text):
    check_merge(wf, text)


@fuzz(200)
@given(live_workflows(), st.lists(updates(), min_size=1, max_size=5), st.integers(0, 2**16))
def test_a_run_of_updates_keeps_every_finished_output(wf, sequence, seed):
    """Updates one after another, with nodes finishing in between, as in a long run."""
    rng = random.Random(seed)
    outputs: dict[str, str] = {}
    for update in sequence:
        outputs.update({i: n.output for i, n in wf.nodes.items() if n.status == "done"})
        wf = check_merge(wf, update)
        # every output ever produced is still somewhere: the node's output or its attempts
        for node_id, text in outputs.items():
            node = wf.nodes[node_id]
            assert node.output == text or any(a.get("output") == text for a in node.attempts)
        progress(wf, rng)


# ------------------------------------------------------------------------------ {{...}} in a cell
# issue 19: the magic fills `{{...}}` from the notebook; whatever the expression and whatever
# the user's objects do (raise from a property, __str__ or __getitem__, hold a huge int), the
# result is the filled text or one ConfigError line.
class _Hostile:
    @property
    def boom(self):
        raise RuntimeError("a property that raises\nover two lines")

    def __getitem__(self, key):
        raise KeyError(key) if key == "k" else ZeroDivisionError("division by zero")

    def __str__(self):
        raise ValueError("no text for you")

    ok = "fine"


NAMESPACE = {"s": "abcdef", "n": 10**5000, "d": {"a": [1, 2, {"b": "c"}]}, "h": _Hostile(),
             "xs": list(range(10)), "none": None, "Out": {3: "three"}}
ATOMS = st.sampled_from(["s", "n", "d", "h", "xs", "none", "Out", "missing", "0", "-1", "'a'",
                         "1" * 5000, "10**9", "None", "h.ok", "'\ud800'"])


@st.composite
def template_expressions(draw):
    expr = draw(ATOMS)
    for _ in range(draw(st.integers(0, 4))):
        op = draw(st.sampled_from(["attr", "index", "slice", "nest", "junk"]))
        if op == "attr":
            expr += "." + draw(st.sampled_from(["boom", "ok", "upper", "__class__", "real", "x"]))
        elif op == "index":
            expr += "[" + draw(ATOMS | st.sampled_from(["'a'", "2", "'b'", "'k'", "5"])) + "]"
        elif op == "slice":
            expr += "[" + draw(st.sampled_from(["::0", "1:3", "::-1", ":'x'", "::10**400"])) + "]"
        elif op == "nest":
            expr = "[" * draw(st.sampled_from([1, 50, 5000])) + expr
        else:
            expr += draw(st.sampled_from(["(", ")", " + 1", "()", "\n", "}}", "{{"]))
    return expr


@fuzz(400)
@given(st.lists(template_expressions(), min_size=1, max_size=3), st.text(max_size=20))
def test_cell_interpolation_fills_or_is_one_line(expressions, filler):
    from flowmagic.errors import ConfigError
    from flowmagic.magic_grammar import interpolate

    text = filler.join("{{" + e + "}}" for e in expressions)
    try:
        out = interpolate(text, NAMESPACE)
    except ConfigError as err:
        one_line(str(err))
        assert len(str(err)) < 400
        return
    assert isinstance(out, str)


@pytest.mark.parametrize("expr", ["s[::0]", "n", "h.boom", "h", "h[0]", "[" * 5000 + "s",
                                  "s" + "[0]" * 5000, "1" * 5000])
def test_the_magic_prints_one_line_for_hostile_interpolations(expr, capsys):
    from conftest import ipython_shell

    from IPython.core.error import UsageError

    with ipython_shell() as ip:
        ip.user_ns.update(NAMESPACE)
        result = ip.run_cell("%%flow report --plan-only\nSummarise {{" + expr + "}} please")
        assert "report" not in ip.user_ns
    out, err = capsys.readouterr()
    assert isinstance(result.error_in_exec, UsageError)   # the cell fails, in one line
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("UsageError: flowmagic: "), err
    assert "Traceback" not in out + err
