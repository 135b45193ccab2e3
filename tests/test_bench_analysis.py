"""The dabench-dev benchmark (bench/analysis.py): its scorer, table-tested, and the harness
end to end against a loopback model whose scripted answers are code: right answers score
3/3, wrong ones 0/3, under the one-call baseline and under a flow; a cut run resumes."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from flowmagic.testing.loopback import LoopbackServer
from flowmagic.engine.summary import SYSTEM as SUMMARY

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import dabench  # noqa: E402
import untraced  # noqa: E402

# --------------------------------------------------------------------------- the scorer
SCORES = [
    # (answer, labels, question right, sub-questions right)
    ("@mean_fare[34.65]", {"mean_fare": "34.65"}, True, 1),
    ("@is_normal[no]", {"is_normal": "no"}, True, 1),                  # strings equal
    ("@is_normal[No]", {"is_normal": "no"}, False, 0),                 # ... exactly
    ("@r[0.2100000001]", {"r": "0.21"}, True, 1),                      # floats within 1e-6
    ("@r[0.210002]", {"r": "0.21"}, False, 0),                         # ... and no further
    ("@r[0.21]", {"r": "0.210"}, True, 1),
    ("@n[1e2]", {"n": "100"}, True, 1),
    ("@p[0.0]", {"p": "0.0000"}, True, 1),
    ("@a[1] and @b[2]", {"a": "1", "b": "2"}, True, 2),
    ("@a[1]", {"a": "1", "b": "2"}, False, 1),                         # a missing pair
    ("@a[1] @b[2] @c[3]", {"a": "1", "b": "2"}, True, 2),              # an extra pair
    ("", {"a": "1"}, False, 0),
    (None, {"a": "1"}, False, 0),
    ("@r[0.5]\n@r[0.21]", {"r": "0.21"}, True, 1),                     # the later pair counts
    ("@r[ 0.21 ]", {"r": "0.21"}, True, 1),                            # float() allows spaces
    ("@v[Happiness Rank]", {"v": "Happiness Rank"}, True, 1),          # spaces inside values
    ("@ids[314, 577]", {"ids": "314, 577"}, True, 1),
    ("@ids[314,577]", {"ids": "314, 577"}, False, 0),
    ("@ r[0.21]", {"r": "0.21"}, False, 0),                            # a space breaks a name
    ("@r [0.21]", {"r": "0.21"}, False, 0),
    ("@mean fare[34.65]", {"mean_fare": "34.65"}, False, 0),
    ("@r[nan]", {"r": "nan"}, True, 1),                                # equal as strings
    ("@r[0.21", {"r": "0.21"}, False, 0),                              # no closing bracket
]


@pytest.mark.parametrize("answer, labels, right, subs", SCORES)
def test_the_scorer_follows_the_readme_rule(answer, labels, right, subs):
    scored = dabench.score(answer, labels)
    assert scored["right"] is right
    assert sum(scored["subs"].values()) == subs
    assert set(scored["subs"]) == set(labels)


def test_a_label_listed_twice_is_one_sub_question_with_its_later_value(tmp_path):
    (tmp_path / "tables").mkdir()
    (tmp_path / "questions.jsonl").write_text(json.dumps(
        {"id": 7, "question": "q", "constraints": "", "format": "@s[x]", "file_name": "t.csv",
         "level": "hard"}) + "\n")
    (tmp_path / "labels.jsonl").write_text(json.dumps(
        {"id": 7, "common_answers": [["s", "significant"], ["r", "0.5"], ["s", "non-significant"]]}) + "\n")
    [q] = dabench.load(tmp_path)
    assert q.labels == {"s": "non-significant", "r": "0.5"}
    assert dabench.score("@s[non-significant] @r[0.5]", q.labels)["right"]


def test_the_sample_is_seeded_and_spread_over_the_levels():
    questions = dabench.load()
    assert len(questions) == 133
    import analysis
    picked = analysis.select(questions, 24, 0)
    assert [q.level for q in picked[:3]] == list(dabench.LEVELS)
    assert {lv: sum(q.level == lv for q in picked) for lv in dabench.LEVELS} == \
        {"easy": 8, "medium": 8, "hard": 8}
    assert [q.id for q in picked] == [q.id for q in analysis.select(questions, 24, 0)]
    assert [q.id for q in picked] != [q.id for q in analysis.select(questions, 24, 1)]
    # a smaller sample is the start of a larger one: a first reading is resumed, not redone
    assert [q.id for q in analysis.select(questions, 6, 0)] == [q.id for q in picked[:6]]


UNTRACED = [
    ("The mean is 34.65.", ["mean    34.6492"], []),          # rounding allowed
    ("The mean is 34.70.", ["mean    34.6492"], ["34.70"]),
    ("r = 0.214", ["0.21403"], []),
    ("In 2016 there were 3 findings.", [""], []),             # years and small counts aside
    ("@mean_fare_class1[87.96]", ["87.9583"], []),            # class1 is a word, not a number
    ("Total 1,234,567 rows", ["1234567"], []),
    ("4865.95 g", ["3700.66"], ["4865.95"]),
]


@pytest.mark.parametrize("answer, outputs, left", UNTRACED)
def test_numbers_that_trace_nowhere(answer, outputs, left):
    assert untraced.untraced(answer, outputs) == left


# --------------------------------------------------------------------------- the harness
def _question_of(body: dict) -> dabench.Question:
    text = "\n".join(str(m.get("content") or "") for m in body["messages"])
    return next(q for q in QUESTIONS if q.question in text)


def _values(q: dabench.Question, right: bool) -> dict:
    if right:
        return q.labels
    return {k: ("999.5" if _number(v) else "surely-wrong") for k, v in q.labels.items()}


def _number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def _script(q: dabench.Question, values: dict, path: str) -> str:
    prints = "\n".join(f"print({('@' + k + '[' + v + ']')!r})" for k, v in values.items())
    return (f"import pandas as pd\ndf = pd.read_csv({path!r})\nprint(len(df), 'rows')\n{prints}")


def responder(right: bool):
    """A model that writes code printing the labels (or wrong values) after reading the CSV."""
    def answer(body: dict):
        q = _question_of(body)
        values = _values(q, right)
        if body.get("response_format"):   # a flow's planner
            return json.dumps({"subtasks": [
                {"id": "compute", "requirement": "Compute the asked values from the data.",
                 "agent": "analyst", "depends_on": []},
                {"id": "report", "requirement": "State the values in the asked format.",
                 "agent": "writer", "depends_on": ["compute"]}]})
        first = body["messages"][1]["content"] if len(body["messages"]) > 1 else ""
        pairs = " ".join(f"@{k}[{v}]" for k, v in values.items())
        if any(SUMMARY in m["content"] for m in body["messages"][:2]) or "(report)" in first:
            return f"The computed values: {pairs}"
        path = re.search(r"The data is the CSV file (.+?\.csv)\.", first)
        where = path.group(1) if path else q.file_name   # the baseline's path, or the workspace
        return f"```python\n{_script(q, values, where)}\n```"
    return answer


QUESTIONS = dabench.load()


def _harness(tmp_path, server, *extra, out="results.jsonl"):
    argv = [sys.executable, str(BENCH / "analysis.py"), "--limit", "3", "--seed", "0",
            "--base-url", server.base_url, "--model", "m", "--out", str(tmp_path / out),
            "--work", str(tmp_path / "work"), "--timeout", "240", *extra]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / out).read_text().splitlines()]
    return rows, done.stdout


@pytest.mark.parametrize("right", [True, False])
def test_three_questions_score_three_or_zero(tmp_path, right):
    with LoopbackServer(responder=responder(right), model="m") as server:
        rows, table = _harness(tmp_path, server, "--systems", "baseline,flow-k1")
    assert {r["system"] for r in rows} == {"baseline", "flow-k1"}
    assert len({r["id"] for r in rows}) == 3
    assert sorted(r["level"] for r in rows if r["system"] == "baseline") == ["easy", "hard", "medium"]
    expect = 3 if right else 0
    for system in ("baseline", "flow-k1"):
        mine = [r for r in rows if r["system"] == system]
        assert sum(r["right"] for r in mine) == expect, [(r["error"], r["answer"][:300]) for r in mine]
        # a flow: one node and no plan call (the question asks for a few named values), and
        # no summary call either where the node's code printed the whole form (q310's form
        # names a value its label lacks, which the flow then asks for)
        whole = [r for r in mine if "is missing" not in r["answer"]]
        assert len(whole) >= 2 and all(r["calls"] == 1 for r in whole), [r["calls"] for r in mine]
        assert all(r["prompt_tokens"] > 0 and r["completion_tokens"] > 0 for r in mine)
        assert all(not r["error"] and not r["timed_out"] for r in mine)
    flows = [r for r in rows if r["system"] == "flow-k1"]
    assert all(r["right_in_outputs"] is right for r in flows)       # the code printed them
    if right:   # every number the flow's answer states, its code printed
        assert all(r["untraced"] == [] for r in flows), [r["untraced"] for r in flows]
    assert f"| baseline | 3 | {expect}/3 ({100 * expect // 3}%) |" in table
    assert f"| flow-k1 | 3 | {expect}/3 ({100 * expect // 3}%) |" in table


def test_a_cut_run_resumes_where_it_stopped(tmp_path):
    with LoopbackServer(responder=responder(True), model="m") as server:
        argv = ("--systems", "baseline")
        first, _ = _harness(tmp_path, server, *argv, "--limit", "1")
        asked = len(server.stats(bodies=True)["requests"])
        refused = subprocess.run(
            [sys.executable, str(BENCH / "analysis.py"), "--limit", "3", "--base-url",
             server.base_url, "--model", "m", "--out", str(tmp_path / "results.jsonl"),
             "--systems", "baseline"], capture_output=True, text=True, timeout=60)
        rows, _ = _harness(tmp_path, server, *argv, "--resume")
        calls = [r for r in server.stats(bodies=True)["requests"][asked:]
                 if r["path"].endswith("/chat/completions")]
    assert len(first) == 1
    assert refused.returncode != 0 and "--resume" in refused.stderr
    assert [r["id"] for r in rows][0] == first[0]["id"] and len(rows) == 3
    assert len({_question_of(c["body"]).id for c in calls}) == 2     # only the two it lacked


def test_a_worker_stopped_from_outside_records_no_answer(tmp_path):
    """Someone stopping the benchmark is not a wrong answer: the old harness wrote a row
    "the worker failed: no output" for the question it was on."""
    import os
    import signal
    import time

    data = tmp_path / "data"
    (data / "tables").mkdir(parents=True)
    (data / "tables" / "t.csv").write_text("x\n1\n2\n")
    (data / "questions.jsonl").write_text(json.dumps(
        {"id": 1, "question": "What is the mean of x?", "constraints": "", "format": "@mean[v]",
         "file_name": "t.csv", "level": "easy"}) + "\n")
    (data / "labels.jsonl").write_text(json.dumps({"id": 1, "common_answers": [["mean", "1.5"]]}) + "\n")
    out = tmp_path / "results.jsonl"
    with LoopbackServer(latency=60.0, model="m") as server:
        harness = subprocess.Popen(
            [sys.executable, str(BENCH / "analysis.py"), "--data", str(data), "--systems",
             "baseline", "--base-url", server.base_url, "--model", "m", "--out", str(out),
             "--work", str(tmp_path / "work")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not server.stats()["requests"]:
            time.sleep(0.1)   # the worker is waiting for its answer
        worker = subprocess.run(["pgrep", "-f", f"analysis_worker.py baseline 1 --data {data}"],
                                capture_output=True, text=True).stdout.split()
        assert len(worker) == 1
        os.kill(int(worker[0]), signal.SIGTERM)
        _, err = harness.communicate(timeout=60)
    assert harness.returncode != 0 and "not recorded" in err
    assert not out.exists() or out.read_text() == ""


def test_a_sample_waits_between_questions_while_the_pause_file_exists(tmp_path):
    import threading

    import analysis

    pause = tmp_path / "quiet"
    assert analysis.wait_while(pause, every=0.01) == 0.0   # no file: no wait
    pause.touch()
    threading.Timer(0.3, pause.unlink).start()
    assert analysis.wait_while(pause, every=0.01) >= 0.2   # the timer started before it


def test_two_shards_side_by_side_share_a_sample_and_its_file(tmp_path):
    import threading

    with LoopbackServer(responder=responder(True), model="m") as server:
        results = {}
        lanes = [threading.Thread(target=lambda k=k: results.update(
            {k: _harness(tmp_path, server, "--systems", "baseline", "--resume",
                         "--shard", f"{k}/2")})) for k in (0, 1)]
        for lane in lanes:
            lane.start()
        for lane in lanes:
            lane.join()
        whole, _ = _harness(tmp_path, server, "--systems", "baseline", "--resume")
    assert len(results) == 2
    assert sorted(r["id"] for r in whole) == sorted(q.id for q in
                                                   analysis_select(3))   # each once, whole rows
    bad = subprocess.run([sys.executable, str(BENCH / "analysis.py"), "--shard", "2/2",
                          "--report", str(tmp_path / "results.jsonl")],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "--shard is K/N" in bad.stderr


def analysis_select(n):
    import analysis

    return analysis.select(dabench.load(dabench.locate()), n, 0)
