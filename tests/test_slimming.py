"""Importance, RRF, surgery and slimming against a loopback server with a deterministic scorer.

The workflow: `lookup` finds a fact about the input, `relay` passes facts on and adds
chatter (it provably does not matter: pruning it links lookup to answer), `verify` adds a
second fact only on the big model, and `answer` (the sink) lists every fact it is given.
`lookup` is expensive and harmless to downgrade; pruning `lookup` or `verify`, or
downgrading `verify`, loses a fact.
"""

import asyncio
import json
import random
import re
import xml.etree.ElementTree as ET
from fractions import Fraction

import networkx as nx
import pytest

import flowmagic
from flowmagic.ops import batch
from flowmagic.view import pareto
from flowmagic.ops import slimming
from flowmagic.errors import ConfigError, FlowError, NodeError
from flowmagic.flow import Flow
from flowmagic.model.graph import Node, Workflow
from flowmagic.llm import LLM
from flowmagic.testing.loopback import LoopbackServer, default_responder

@pytest.fixture(autouse=True)
def own_prices(monkeypatch):
    """configure(prices=...) edits a process-wide table: give each test its own copy."""
    from flowmagic.llm import endpoints
    monkeypatch.setattr(endpoints, "PRICES", dict(endpoints.PRICES))


PLAN = {"nodes": [{"id": "lookup", "requirement": "LOOKUP {{input}}", "model": "big"},
                  {"id": "relay", "requirement": "RELAY the facts", "model": "big"},
                  {"id": "verify", "requirement": "VERIFY {{input}}", "model": "big"},
                  {"id": "answer", "requirement": "ANSWER with every fact", "model": "small"}],
        "edges": [["lookup", "relay"], ["relay", "answer"], ["verify", "answer"]]}
EXAMPLES = [{"input": w, "expected": [f"FACT:{w}", "FACT:checked"]}
            for w in ("paris", "oslo", "lima", "rome", "kyiv", "quito")]
BIG, SMALL = (10.0, 30.0), (0.1, 0.3)


def facts_found(result, example):
    return sum(fact in result for fact in example["expected"]) / len(example["expected"])


def responder(body):
    user = next((m["content"] for m in body["messages"] if m["role"] == "user"), "")
    found = re.search(r"Your subtask \((\w+)\):\n(.*)", user)
    if not found:
        return default_responder(body)
    node, requirement = found.groups()
    inputs = user.split("Results of earlier subtasks:", 1)[-1].split("Later subtasks", 1)[0] \
        if "Results of earlier subtasks:" in user else ""
    facts = " ".join(re.findall(r"FACT:\w+", inputs))
    if node == "lookup":
        return "FACT:" + requirement.split()[-1] + " (looked up at length) " * 3
    if node == "relay":
        return f"some chatter about the weather; {facts}"
    if node == "verify":
        return "FACT:checked" if body["model"] == "big-model" else "unsure"
    return f"facts: {facts}"


@pytest.fixture
def server():
    with LoopbackServer(responder=responder) as srv:
        flowmagic.configure(base_url=srv.base_url, model="m")
        flowmagic.configure(name="big", base_url=srv.base_url, model="big-model")
        flowmagic.configure(name="small", base_url=srv.base_url, model="small-model")
        flowmagic.configure(prices={"big-model": BIG, "small-model": SMALL})
        yield srv


def make_flow(**settings):
    return Flow.from_dict(PLAN, task="facts about a city", llm=LLM(backoff_base=0.01), **settings)


def usd(tokens_in, tokens_out, price):
    return (tokens_in * price[0] + tokens_out * price[1]) / 1e6


# -- pure parts --------------------------------------------------------------------------------
def test_rank_counts_from_the_least_important_ties_share_and_none_is_most_important():
    assert slimming.rank({"a": 0.5, "b": 0.5, "c": 0.9, "d": None}) == {"a": 1, "b": 1, "c": 3, "d": 4}


def try_order(values: dict[str, dict[str, float]], weights: dict) -> tuple[list[str], dict]:
    """The order slimming tries nodes in, from each metric's importance values."""
    ranks = {m: slimming.rank(v) for m, v in values.items()}
    fused = slimming.fuse(ranks, weights)
    rows = [{"node": v, "position": i, "rrf": fused[v], "candidate": True}
            for i, v in enumerate(sorted(fused))]
    return slimming.Importance("prune", rows, None, weights, 10).least_important(), fused


def test_the_try_order_is_agentslimming_eq6_not_its_mirror():
    # Ten nodes, two metrics, kappa = 10. X is the least important on degree and the most
    # important on betweenness; Y sits in the middle of both (5th from the bottom).
    # Eq. 6 with rank 1 = least important: RRF(X) = 1/11 + 1/20 > RRF(Y) = 2/15, so X goes
    # first; ranking from the most important and taking the smallest RRF first gives Y
    # (1/20 + 1/11 > 2/16): 1/(kappa + r) is convex, the two orders differ.
    others = [f"o{i}" for i in range(8)]
    degree = {"x": 0.0, **{o: 0.1 * (i + 1) for i, o in enumerate(others)}, "y": 0.35}
    between = {"x": 1.0, **{o: 0.1 * (i + 1) for i, o in enumerate(others)}, "y": 0.45}
    order, fused = try_order({"degree": degree, "betweenness": between},
                             {"degree": 1, "betweenness": 1, "loo": 0, "cost": 0})
    assert fused["x"] == pytest.approx(1 / 11 + 1 / 20) and fused["y"] == pytest.approx(2 / 15)
    assert order.index("x") < order.index("y")
    assert order[0] == "o0"   # ranks (2, 1): the least important but for x's degree


def test_rrf_matches_a_hand_computation():
    ranks = {"degree": {"a": 1, "b": 2, "c": 3}, "betweenness": {"a": 2, "b": 1, "c": 3},
             "loo": {"a": 3, "b": 1, "c": 2}, "cost": {"a": 1, "b": 3, "c": 2}}
    # kappa = max(10, 3) = 10; weights deg 1, bet 1, loo 2, cost 1.
    hand = {"a": Fraction(1, 11) + Fraction(1, 12) + Fraction(2, 13) + Fraction(1, 11),
            "b": Fraction(1, 12) + Fraction(1, 11) + Fraction(2, 11) + Fraction(1, 13),
            "c": Fraction(1, 13) + Fraction(1, 13) + Fraction(2, 12) + Fraction(1, 12)}
    fused = slimming.fuse(ranks)
    assert fused == {k: pytest.approx(float(v), abs=1e-15) for k, v in hand.items()}
    # A bigger graph raises kappa; weights are a parameter.
    big = slimming.fuse(ranks, n_nodes=12, weights={"loo": 0, "cost": 2})
    assert big["a"] == pytest.approx(1 / 13 + 1 / 14 + 2 / 13)
    with pytest.raises(ConfigError, match="unknown importance weight"):
        slimming.fuse(ranks, weights={"shapley": 1})


def random_dag(seed, n=9, p=0.35):
    rng = random.Random(seed)
    wf = Workflow("t")
    for i in range(n):
        wf.add_node(Node(id=f"n{i}", requirement=f"step {i}"))
    for i in range(n):
        for j in range(i + 1, n):
            if rng.random() < p:
                wf.add_edge(f"n{i}", f"n{j}")
    return wf


@pytest.mark.parametrize("seed", range(12))
def test_surgery_keeps_every_connected_pair_connected(seed):
    wf = random_dag(seed)
    reach = {(a, b) for a in wf.nodes for b in nx.descendants(wf.graph, a)}
    ends = set(batch.sinks(wf))
    rng = random.Random(seed)
    for victim in rng.sample([i for i in wf.nodes if i not in ends], 4):
        wf = slimming.without(wf, victim)
        assert wf.nodes[victim].status == "pruned" and wf.graph.degree(victim) == 0
        g = wf.active()
        assert nx.is_directed_acyclic_graph(g) and nx.number_of_selfloops(g) == 0
        assert len(wf.edges()) == len(set(wf.edges()))
        alive = list(g.nodes)
        for a in alive:
            for b in alive:
                assert ((a, b) in reach) == nx.has_path(g, a, b) or a == b, (a, b)
        assert set(batch.sinks(wf)) == ends   # pruning a non-sink never makes a new sink
    with pytest.raises(NodeError, match="never pruned"):
        slimming.without(wf, sorted(ends)[0])


def test_pareto_front_and_svg():
    points = [{"label": "baseline", "score": 1.0, "cost_usd": 0.010},
              {"label": "-a", "score": 1.0, "cost_usd": 0.006},
              {"label": "-b", "score": 0.5, "cost_usd": 0.004},
              {"label": "-a -b", "score": 0.5, "cost_usd": 0.005},
              {"label": "x<&>", "score": 0.2, "cost_usd": 0.001}]
    assert pareto.pareto_front(points) == [4, 2, 1]
    root = ET.fromstring(pareto.pareto_svg(points, final="-a"))
    ns = "{http://www.w3.org/2000/svg}"
    circles = root.findall(f"{ns}circle")
    assert len([c for c in circles if "point" in c.get("class")]) == 5
    assert len([c for c in circles if "front" in c.get("class", "")]) == 3
    assert len([c for c in circles if c.get("class") == "final"]) == 1
    assert root.find(f"{ns}polyline").get("class") == "front"


# -- over HTTP ----------------------------------------------------------------------------------------
def test_nodes_of_one_workflow_run_concurrently():
    with LoopbackServer(responder=responder, latency=0.3) as srv:
        flowmagic.configure(base_url=srv.base_url, model="m")
        flowmagic.configure(name="big", base_url=srv.base_url, model="big-model")
        flowmagic.configure(name="small", base_url=srv.base_url, model="small-model")
        run = make_flow().map(EXAMPLES[:1])
        assert run.results == ["facts: FACT:paris FACT:checked"]
        assert srv.max_in_flight == 2   # lookup and verify at once
        arrived = sorted(r["arrived"] for r in srv.requests if r["path"].endswith("/completions"))
        assert arrived[1] - arrived[0] < 0.15


def test_importance_table(server):
    flow = make_flow()
    table = flow.importance(EXAMPLES, facts_found)
    rows = {r["node"]: r for r in table.rows}
    assert table.baseline.score == 1.0 and table.kappa == 10
    assert rows["relay"]["loo"] == 0 and rows["lookup"]["loo"] == 0.5 and rows["verify"]["loo"] == 0.5
    assert rows["answer"]["loo"] is None and rows["answer"]["protected"] == "produces the final result"
    assert rows["relay"]["saved_usd"] > 0 and rows["relay"]["betweenness"] == pytest.approx(1 / 6)
    for r in table.rows:   # each row's RRF is the formula over its own ranks
        assert r["rrf"] == pytest.approx(1 / (10 + r["rank_degree"]) + 1 / (10 + r["rank_betweenness"])
                                         + 2 / (10 + r["rank_loo"]) + 1 / (10 + r["rank_cost"]))
    order = table.least_important()
    assert sorted(order) == ["lookup", "relay", "verify"]   # the sink is never a candidate
    assert [rows[v]["rrf"] for v in order] == sorted((rows[v]["rrf"] for v in order), reverse=True)
    # Weights are a parameter. Without the cost rank, Eq. 6 tries the peripheral lookup and
    # verify (ranks 1, 1, 2: 1/11 + 1/11 + 2/12) before the central relay, whose zero score
    # drop (loo rank 1) does not outweigh ranking last on degree and betweenness
    # (1/13 + 1/14 + 2/11); with loo alone, relay comes first.
    assert flow.importance(EXAMPLES, facts_found, weights={"cost": 0}).least_important() == [
        "lookup", "verify", "relay"]
    assert flow.importance(EXAMPLES, facts_found, weights={
        "cost": 0, "degree": 0, "betweenness": 0}).least_important()[0] == "relay"
    assert "relay" in table.text()
    # The downgrade stage ranks by the score drop of a downgrade instead.
    down = {r["node"]: r for r in flow.importance(stage="downgrade", cheaper={"big": "small"},
                                                  probe=EXAMPLES, scorer=facts_found).rows}
    assert down["lookup"]["loo"] == 0 and down["verify"]["loo"] == 0.5
    assert down["lookup"]["to_model"] == "small" and down["answer"]["protected"] == "no cheaper model"


def test_slim_prunes_the_useless_node_downgrades_the_harmless_one_and_rolls_back(server):
    flow = make_flow()
    before = flow.workflow.to_dict()
    flow.attach_probe(EXAMPLES, facts_found, n=4, seed=3)
    slim, report = flow.slim(cheaper={"big": "small"})
    assert flow.workflow.to_dict() == before   # the original is untouched

    steps = [(s["action"], s["node"], s["accepted"]) for s in report.steps]
    assert ("prune", "relay", True) in steps
    assert ("prune", "lookup", False) in steps and ("prune", "verify", False) in steps
    assert ("downgrade", "lookup", True) in steps and ("downgrade", "verify", False) in steps
    assert not any(node == "answer" for action, node, _ in steps if action == "prune")
    rolled = next(s for s in report.steps if s["node"] == "lookup" and s["action"] == "prune")
    assert rolled["score_after"] == 0.5 and rolled["threshold"] == pytest.approx(0.95)
    assert "rolled back" in report.text()

    nodes = slim.workflow.nodes
    assert nodes["relay"].status == "pruned" and slim.workflow.graph.has_edge("lookup", "answer")
    assert nodes["lookup"].model == "small" and nodes["lookup"].downgraded_from == "big"
    assert nodes["verify"].model == "big" and all(n.output is None for n in nodes.values())
    assert report.final["score"] >= 0.95 * report.baseline["score"]
    assert report.final["cost_usd"] < report.baseline["cost_usd"] / 2
    assert report.final["label"] == "-relay lookup→small"

    # Priced by each node's own model: lookup now at small prices, verify still at big ones.
    item = slim.map(EXAMPLES[:1])[0]
    assert item.result == "facts: FACT:paris FACT:checked"
    lookup, verify = item.nodes["lookup"], item.nodes["verify"]
    assert lookup["models"] == ["small:small-model"]
    assert lookup["cost_usd"] == pytest.approx(usd(lookup["tokens_in"], lookup["tokens_out"], SMALL))
    assert verify["cost_usd"] == pytest.approx(usd(verify["tokens_in"], verify["tokens_out"], BIG))

    labels = [p["label"] for p in report.points]
    assert len(labels) == len(set(labels)) and {"baseline", "-relay lookup→small"} <= set(labels)
    assert report.final["label"] in [p["label"] for p in report.pareto()]
    ET.fromstring(report.svg())
    assert slim.probe is flow.probe


def test_a_zero_baseline_is_an_error_not_a_silent_accept(server):
    flow = make_flow()
    with pytest.raises(FlowError, match="baseline scores 0"):
        flow.slim(EXAMPLES[:2], lambda result, example: 0.0)


def test_slim_needs_a_probe_set_and_sane_options(server):
    flow = make_flow()
    with pytest.raises(ConfigError, match="attach_probe"):
        flow.slim()
    with pytest.raises(ConfigError, match="tau_prune"):
        flow.slim(EXAMPLES[:1], facts_found, tau_prune=1.5)
    with pytest.raises(ConfigError, match="cheaper"):
        flow.importance(EXAMPLES[:1], facts_found, stage="downgrade")


def test_progress_events_reach_subscribers(server):
    flow = make_flow()
    events = []
    flow.subscribe(lambda e: events.append(e) if e["kind"] == "slim" else None)

    async def main():
        try:
            return await flow.aslim(EXAMPLES[:2], facts_found, top_k=1)
        finally:
            await flow.llm.aclose()

    slim, report = asyncio.run(main())
    phases = [e["phase"] for e in events]
    assert phases.count("evaluated") == len(report.points) and phases[-1] == "done"
    assert phases.count("step") == len(report.steps)
    assert report.notes == ["no cheaper={...} map given: the downgrade stage was skipped"]


def test_pruning_keeps_the_data_edge_a_transitive_path_implies():
    # p -> v -> s and p -> x -> s: without v, s must still read p's output under
    # context="parents" (AgentSlimming links every predecessor to every successor).
    plan = {"nodes": [{"id": i, "requirement": f"STEP {i}"} for i in ("p", "v", "x", "s")],
            "edges": [["p", "v"], ["v", "s"], ["p", "x"], ["x", "s"]]}

    def answer(body):
        found = re.search(r"Your subtask \((\w+)\)", body["messages"][-1]["content"])
        return f"OUTPUT-OF-{found.group(1)}" if found else default_responder(body)

    with LoopbackServer(responder=answer) as srv:
        flowmagic.configure(base_url=srv.base_url, model="m")
        flow = Flow.from_dict(plan, task="t", llm=LLM(backoff_base=0.01), context="parents",
                              consolidate=False, validate="none", update="off")
        flow.prune("v")
        assert flow.workflow.parents("s") == ["p", "x"]
        flow.run()
        prompt = next(r["body"]["messages"][-1]["content"] for r in srv.requests
                      if "Your subtask (s)" in json.dumps(r.get("body")))
    assert "OUTPUT-OF-p" in prompt and "OUTPUT-OF-x" in prompt and "OUTPUT-OF-v" not in prompt
