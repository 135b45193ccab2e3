"""`flowmagic eval` end to end: saved predictions, a loopback planner, the embedded model,
CSV and JSON outputs, the `%flow eval` magic, and `LLM.embed` behind the similarity."""

import csv
import json
import os
import subprocess
import sys
from fractions import Fraction as F
from pathlib import Path

import pytest
from IPython.core.error import UsageError

import flowmagic
from flowmagic import cli
from flowmagic.errors import ConfigError
from flowmagic.evaluate.run import evaluate_file, load_one_gold, select_records
from flowmagic.evaluate import load_gold
from flowmagic.llm import LLM
from flowmagic.testing.loopback import LoopbackServer
from flowmagic.store import get_store

from conftest import ROOT

GOLD = Path(__file__).parent / "data" / "gold_sample.jsonl"
EXTRA = "Whistle merry tunes loudly"   # shares no word with any gold label
# (id, shape, nodes, edges) of tests/data/gold_sample.jsonl, read off the file by hand.
SAMPLE = [("asynchow-seq-0004", "sequential", 3, 2), ("asynchow-seq-0054", "sequential", 4, 3),
          ("asynchow-para-0048", "parallel", 4, 0), ("asynchow-async-0015", "dag", 5, 5),
          ("asynchow-async-0971", "dag", 4, 1), ("asynchow-async-1291", "dag", 6, 5),
          ("worfbench-seal_tools_200", "sequential", 4, 3),
          ("worfbench-lumos_25958", "parallel", 4, 0), ("worfbench-wikihow_36", "dag", 4, 4),
          ("worfbench-toolbench_18", "dag", 4, 2)]


def perturb(record):
    """Every gold node under a new id, one extra unrelated node, the first gold edge left out."""
    ids = {n["id"]: f"p{n['id']}" for n in record["nodes"]}
    nodes = [{"id": ids[n["id"]], "label": n["label"]} for n in record["nodes"]]
    nodes.append({"id": "extra", "label": EXTRA})
    edges = [[ids[a], ids[b]] for a, b in record["edges"][1:]]
    return {"id": record["id"], "nodes": nodes, "edges": edges}


def expected(n, m):
    """By hand: n of n+1 plan nodes match (P n/(n+1), R 1); all m-1 plan edges are gold
    edges (P 1, or 0 when the plan has none but gold has one; R (m-1)/m; both sides empty
    when m = 0 score 1); every gold label has an exact copy (label 1); and any edit path
    deletes a node (one node too many) and inserts an edge (one edge too few), which the
    identity matching does at cost 1 + 1."""
    node_f1 = F(2 * n, 2 * n + 1)
    if m == 0:
        p = r = F(1)
    else:
        p, r = F(1 if m > 1 else 0), F(m - 1, m)
    edge_f1 = 2 * p * r / (p + r) if p + r else F(0)
    return {"node_precision": F(n, n + 1), "node_recall": F(1), "node_f1": node_f1,
            "edge_precision": p, "edge_recall": r, "edge_f1": edge_f1,
            "label_similarity": F(1), "ssi": (1 + edge_f1) / 2, "ged": F(2 if m else 1)}


def mean(values):
    return float(sum(values, F(0)) / len(values))


@pytest.fixture
def pred_file(tmp_path):
    path = tmp_path / "pred.jsonl"
    path.write_text("".join(json.dumps(perturb(r)) + "\n" for r in load_gold(GOLD)))
    return path


def run_cli(capsys, *argv):
    code = cli.main(["eval", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


# ------------------------------------------------------------------------------ --pred
def test_sample_file_is_what_the_expectations_assume():
    assert [(r["id"], r["shape"], len(r["nodes"]), len(r["edges"])) for r in load_gold(GOLD)] == SAMPLE


def test_pred_scores_saved_plans_exactly_without_model_calls(pred_file, tmp_path, capsys):
    store = get_store()
    before = store.count_calls(cached=False)
    out_csv = tmp_path / "rows.csv"
    code, out, err = run_cli(capsys, GOLD, "--pred", pred_file, "--out", out_csv)
    assert code == 0, err
    assert store.count_calls(cached=False) == before == 0   # not even an embedding probe
    assert "no model calls when scoring saved plans" in err
    assert len([line for line in err.splitlines() if "/10 " in line]) == 10   # one line per record

    with out_csv.open() as fh:
        rows = list(csv.DictReader(fh))
    assert [r["id"] for r in rows] == [s[0] for s in SAMPLE]
    for row, (rid, shape, n, m) in zip(rows, SAMPLE):
        assert row["shape"] == shape and row["error"] == ""
        for key, value in expected(n, m).items():
            assert float(row[key]) == pytest.approx(float(value), abs=1e-12), (rid, key)

    table, summary = out.split("\n\n", 1)
    assert table.splitlines()[0].split()[:2] == ["id", "shape"]
    assert all(rid in table for rid, *_ in SAMPLE)
    overall = mean([expected(n, m)["node_f1"] for *_, n, m in SAMPLE])
    assert f"mean overall (n=10): node F1 {overall:.3f}" in summary
    seq = mean([expected(n, m)["edge_f1"] for _, s, n, m in SAMPLE if s == "sequential"])
    assert seq == pytest.approx((2 / 3 + 4 / 5 + 4 / 5) / 3)   # m = 2, 3, 3
    assert "mean sequential (n=3): node F1 " in summary and f"edge F1 {seq:.3f}" in summary
    assert "mean parallel (n=2): node F1 0.889, edge F1 1.000, label 1.000, SSI 1.000, GED 1.000" in summary
    assert f"wrote {out_csv}" in out


def test_pred_json_output_and_subset_and_missing(pred_file, tmp_path, capsys):
    lines = pred_file.read_text().splitlines()
    failed = {"id": SAMPLE[1][0], "nodes": [], "edges": [], "error": "PlanError: no plan"}
    partial = tmp_path / "partial.jsonl"
    partial.write_text("\n".join([lines[0], json.dumps(failed), lines[2]]) + "\n")
    out_json = tmp_path / "r.json"
    code, out, err = run_cli(capsys, GOLD, "--pred", partial, "--similarity", "tfidf",
                             "--out", out_json)
    assert code == 0, err
    data = json.loads(out_json.read_text())
    # without --limit/--sample only the records that were planned are scored
    assert [r["id"] for r in data["rows"]] == [s[0] for s in SAMPLE[:3]]
    assert data["settings"]["similarity"] == "tfidf" and data["settings"]["records"] == 3
    assert data["rows"][1]["error"] == "PlanError: no plan" and data["rows"][1]["node_f1"] == 0.0
    assert data["summary"]["overall"]["errors"] == 1
    assert data["rows"][0]["ged"] == 2.0 and data["rows"][0]["ged_exact"] is True
    assert "1 of 3 plans failed" in out
    assert f"2/3 {SAMPLE[1][0]} (sequential): failed: PlanError: no plan" in err

    # with --limit, a record without a prediction is a failed row, not a skipped one
    code, out, err = run_cli(capsys, GOLD, "--pred", partial, "--limit", "4", "--out", out_json)
    rows = json.loads(out_json.read_text())["rows"]
    assert [r["error"] for r in rows][3] == "no prediction for this id"


def test_cli_mistakes_are_one_line_before_any_work(tmp_path, capsys):
    code, out, err = run_cli(capsys, GOLD, "--pred", GOLD, "--out", tmp_path / "r.xlsx")
    assert code == 1 and err.strip() == f"flowmagic: --out {tmp_path / 'r.xlsx'}: use a .csv or .json file"
    code, _, err = run_cli(capsys, tmp_path / "missing.jsonl", "--pred", GOLD)
    assert code == 1 and "no gold file" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(ConfigError, match="unknown planning strategy"):
        evaluate_file(GOLD, strategy="nope")
    with pytest.raises(ConfigError, match="k must be"):
        evaluate_file(GOLD, k=0)


def test_select_records_spreads_a_sample_over_shapes():
    records = load_gold(GOLD)
    assert [r["id"] for r in select_records(records, sample=4)] == [
        "asynchow-seq-0004", "asynchow-seq-0054", "asynchow-para-0048", "asynchow-async-0015"]
    assert [r["shape"] for r in select_records(records, sample=3)] == ["sequential", "parallel", "dag"]
    assert len(select_records(records, limit=2)) == 2
    assert select_records([{"nodes": [], "edges": []}])[0]["id"] == "line-1"
    with pytest.raises(ConfigError):
        select_records(records, sample=0)


# ------------------------------------------------------------------------------ planning over loopback
def gold_planner(skip_task):
    """A responder that answers each planning request with that task's gold graph."""
    by_task = {r["task"]: r for r in load_gold(GOLD)}

    def respond(body):
        user = [m["content"] for m in body["messages"] if m["role"] == "user"][-1]
        task = user.split("Task: ", 1)[1].split("\n")[0].strip()
        if task == skip_task:
            return "I cannot plan that."
        record = by_task[task]
        return json.dumps({"subtasks": [
            {"id": f"s{n['id']}", "requirement": n["label"], "agent": "worker",
             "depends_on": [f"s{a}" for a, b in record["edges"] if b == n["id"]]}
            for n in record["nodes"]]})
    return respond


def test_cli_plans_over_loopback_then_rescores_saved_plans(tmp_path, monkeypatch):
    records = load_gold(GOLD)
    with LoopbackServer(responder=gold_planner(records[2]["task"])) as server:
        url = server.base_url
        monkeypatch.setenv("FLOWMAGIC_BASE_URL", url)
        monkeypatch.setenv("FLOWMAGIC_MODEL", "m")
        pred, out_json = tmp_path / "plans.jsonl", tmp_path / "r.json"
        proc = subprocess.run(
            [sys.executable, "-m", "flowmagic.cli", "eval", str(GOLD), "--k", "2", "--sample", "5",
             "--concurrency", "2", "--save-pred", str(pred), "--out", str(out_json)],
            capture_output=True, text=True, timeout=120, cwd=ROOT, env=os.environ.copy())
        stats = server.stats()
    assert proc.returncode == 0, proc.stderr
    paths = [r["path"] for r in stats["requests"]]
    assert paths.count("/v1/chat/completions") == 2 * 5   # k plans per record
    assert "/v1/embeddings" in paths
    assert f"similarity: embeddings from {url} (m)" in proc.stderr
    data = json.loads(out_json.read_text())
    rows = {r["id"]: r for r in data["rows"]}
    assert list(rows) == [r["id"] for r in select_records(records, sample=5)]
    failed = rows.pop(records[2]["id"])
    assert "all 2 candidate plans failed" in failed["error"] and failed["node_f1"] == 0.0
    assert all(r["ssi"] == 1.0 and r["ged"] == 0.0 and r["error"] is None for r in rows.values())
    assert data["settings"]["usage"]["calls"] == 10 and data["settings"]["strategy"] == "balanced"
    assert "1 of 5 plans failed" in proc.stdout and "mean overall (n=5, 1 failed)" in proc.stdout

    saved = [json.loads(line) for line in pred.read_text().splitlines()]
    assert [p["id"] for p in saved] == [r["id"] for r in data["rows"]]
    assert saved[0]["model"] == "default:m" and saved[0]["nodes"][0]["agent"] == "worker"
    # the saved plans score the same again, with no server at all
    again = evaluate_file(GOLD, pred=pred, similarity="tfidf")
    assert [(r["id"], r["node_f1"], r["edge_f1"], r["error"]) for r in again.rows] == [
        (r["id"], r["node_f1"], r["edge_f1"], r["error"]) for r in data["rows"]]


def test_context_reaches_the_planner_only_when_asked(loopback, tmp_path):
    flowmagic.configure(base_url=loopback.base_url, model="m")
    gold = tmp_path / "worf.jsonl"   # WorFBench-style: the tools the planner may use
    records = [{"id": "w1", "task": "Convert 100 USD to AUD", "context": "  Tools: [convert, rates]\n",
                "nodes": [{"id": "1", "label": "Get the rate"}], "edges": []},
               {"id": "w2", "task": "Say hello", "nodes": [{"id": "1", "label": "Say hello"}],
                "edges": []}]
    gold.write_text("".join(json.dumps(r) + "\n" for r in records))

    def prompts():
        # (the task opens the user message; the JSON schema note follows it there)
        return [m["content"].split("\n\nAnswer with one JSON value")[0]
                for r in loopback.stats(bodies=True)["requests"]
                if r["path"].endswith("/chat/completions")
                for m in r["body"]["messages"] if m["role"] == "user"]

    evaluate_file(gold, k=1, similarity="tfidf")
    assert prompts() == ["Task: Convert 100 USD to AUD", "Task: Say hello"]
    loopback.reset()
    evaluate_file(gold, k=1, similarity="tfidf", context=True)
    assert prompts() == ["Task: Convert 100 USD to AUD\n\nContext:\nTools: [convert, rates]"]
    # (the second record has no context, so its plan came from the cache)


# ------------------------------------------------------------------------------ embeddings
def test_embed_caches_each_text_and_logs_calls(loopback):
    flowmagic.configure(base_url=loopback.base_url, model="m")
    llm, store = LLM(), get_store()
    first = llm.embed_sync(["boil water", "add pasta", " "])
    assert [len(v) for v in first] == [64, 64, 0]
    again = llm.embed_sync(["add pasta", "drain pasta"])
    assert again[0] == first[1]
    sent = [r["body"]["input"] for r in loopback.stats(bodies=True)["requests"]]
    assert sent == [["boil water", "add pasta"], ["drain pasta"]]   # only new texts go out
    llm.embed_sync(["boil water"])
    calls = store.recent_calls(3)
    assert [(c["purpose"], bool(c["cached"])) for c in calls] == [
        ("embed", True), ("embed", False), ("embed", False)]
    assert calls[1]["messages"] == [{"role": "input", "content": "drain pasta"}]
    assert llm.embeddings_supported() is True


def test_embeddings_similarity_can_name_its_own_model(loopback, pred_file, monkeypatch):
    flowmagic.configure(base_url=loopback.base_url, model="chat")
    run = evaluate_file(GOLD, pred=pred_file, similarity="embeddings", embed_model="e5", limit=2)
    assert run.settings.similarity == "embeddings" and run.rows[0]["node_recall"] == 1.0
    assert {r["body"]["model"] for r in loopback.stats(bodies=True)["requests"]} == {"e5"}
    assert "similarity: embeddings from" in run.notes[0] and "(e5)" in run.notes[0]
    monkeypatch.setenv("FLOWMAGIC_EMBED_MODEL", "e6")
    loopback.reset()
    evaluate_file(GOLD, pred=pred_file, similarity="embeddings", limit=1)
    assert {r["body"]["model"] for r in loopback.stats(bodies=True)["requests"]} == {"e6"}


# ------------------------------------------------------------------------------ the magic
PLAN = {"subtasks": [
    {"id": "measure", "requirement": "Measure the saffron threads.", "agent": "cook", "depends_on": []},
    {"id": "crush", "requirement": "Crush the threads.", "agent": "cook", "depends_on": ["measure"]},
    {"id": "serve", "requirement": "Serve it with rice.", "agent": "cook", "depends_on": ["crush"]}]}


def test_flow_eval_magic_scores_a_notebook_flow(tmp_path, monkeypatch, capsys):
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    gold = load_gold(GOLD)[0]   # How to Prepare Saffron: measure -> crush -> add to dish
    (tmp_path / "gold.json").write_text(json.dumps(gold))
    monkeypatch.chdir(tmp_path)
    with LoopbackServer(responder=lambda body: json.dumps(PLAN)) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        config = Config()
        config.HistoryManager.hist_file = ":memory:"
        InteractiveShell.clear_instance()
        ip = InteractiveShell.instance(config=config)
        try:
            ip.run_line_magic("load_ext", "flowmagic")
            ip.run_cell("%%flow saffron --k 1\nHow to Prepare Saffron")
            capsys.readouterr()
            report = ip.run_line_magic("flow", "eval saffron gold.json")
            # a JSONL file is searched for the record with the flow's task
            from_jsonl = ip.run_line_magic("flow", f"eval saffron {GOLD}")
            # a user error is IPython's UsageError (one line; the cell fails)
            with pytest.raises(UsageError) as missing:
                ip.run_line_magic("flow", "eval nosuch gold.json")
            ip.run_line_magic("unload_ext", "flowmagic")
        finally:
            InteractiveShell.clear_instance()
    text = report._repr_mimebundle_()[0]["text/plain"]
    # 2 of 3 steps match (the third shares no word); 1 of 2 edges joins matched nodes
    assert "node F1 0.667, edge F1 0.500" in text, text
    assert "measure ~ gold 1 (1.00)" in text and "crush ~ gold 2 (1.00)" in text
    assert "similarity: embeddings from" in text
    assert from_jsonl.text.splitlines()[1:3] == text.splitlines()[1:3]
    assert str(missing.value).startswith("flowmagic: no flow named 'nosuch'")


def test_load_one_gold_needs_one_graph_or_the_task(tmp_path):
    assert load_one_gold(GOLD, task="how to  prepare SAFFRON")["id"] == "asynchow-seq-0004"
    with pytest.raises(ConfigError, match="none has this flow's task"):
        load_one_gold(GOLD, task="something else")
    (tmp_path / "bad.json").write_text("{nope")
    with pytest.raises(ConfigError, match="is not JSON"):
        load_one_gold(tmp_path / "bad.json")


# ------------------------------------------------------------------------------ the embedded model
@pytest.mark.embedded
def test_cli_on_the_embedded_model(embedded_url, tmp_path, capsys):
    out_csv = tmp_path / "embedded.csv"
    code, out, err = run_cli(capsys, GOLD, "--limit", "2", "--k", "1", "--max-tokens", "160",
                             "--out", out_csv, "--save-pred", tmp_path / "p.jsonl")
    assert code == 0, err
    # llama.cpp serves /embeddings only when started with --embedding: one line, then TF-IDF
    assert "similarity: tfidf (no endpoint embeddings: the embedded model cannot embed" in err
    assert flowmagic.get_llm().embeddings_supported("local") is False
    assert "mean overall (n=2" in out and "planner: the default model, strategy balanced, k 1" in out
    assert "asynchow-seq-0004" in out.split("\n\n")[0]
    with out_csv.open() as fh:
        assert [r["id"] for r in csv.DictReader(fh)] == ["asynchow-seq-0004", "asynchow-seq-0054"]
    assert len((tmp_path / "p.jsonl").read_text().splitlines()) == 2
