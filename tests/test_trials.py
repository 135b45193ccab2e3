"""The trial harness on loopback: N trials with fresh seeds, with vs without updates, under
masking; the success table is asserted against what the scripted model does."""

import json
import random
import re

import pytest

import flowmagic
from flowmagic.cli import main
from flowmagic.llm import LLM
from flowmagic.evaluate import compare
from flowmagic.evaluate.trials import trials
from flowmagic.testing.loopback import LoopbackServer

pytestmark = pytest.mark.timeout(180)

PLAN = {"nodes": [{"id": f"s{i}", "requirement": f"step {i}"} for i in range(3)],
        "edges": [["s0", "s1"], ["s1", "s2"]]}
GOLD = {"nodes": [{"id": "a", "label": "step 0"}, {"id": "b", "label": "step 1"},
                  {"id": "c", "label": "step 2"}], "edges": [["a", "b"], ["b", "c"]]}


def node_of(body):
    found = re.search(r"Your subtask \((\w+)\)", json.dumps(body["messages"]))
    return found.group(1) if found else None


def responder(body):
    """Nodes answer 'result for X'; the updater reruns every node whose result reads 'none'."""
    user = body["messages"][-1]["content"]
    if "Results of done subtasks" in user:
        masked = re.findall(r"\[(\w+)\]\nnone\b", user)
        return json.dumps({"rationale": "rerun missing results",
                           "action": "update" if masked else "no_change",
                           "subtasks": [{"id": m, "rerun": True} for m in masked]})
    return f"result for {node_of(body)}"


def all_results(flow):
    return all((n.output or "").startswith("result for") for n in flow.workflow.nodes.values())


def masked_somewhere(seed, rate, nodes=("s0", "s1", "s2")):
    """Whether the runner masks a node of this trial (its rule: a seeded draw per node)."""
    return any(random.Random(f"{seed}:{n}:mask:0").random() < rate for n in nodes)


def test_with_and_without_updates_under_masking_give_the_scripted_success_rates():
    with LoopbackServer(responder=responder) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        report = trials(PLAN, n=6, mask_rates=(0.0, 0.2), success=all_results, consolidate=False,
                        max_updates=10, expected="result for s2",
                        plan_score=lambda wf: compare(wf, GOLD, similarity="tfidf"),
                        llm=LLM(backoff_base=0.01))
    rows = {(r["condition"], r["mask_rate"]): r for r in report.rows()}
    assert set(rows) == {(c, m) for c in ("with updates", "without updates") for m in (0.0, 0.2)}
    assert all(r["trials"] == 6 for r in rows.values())
    # No masking: both succeed every time. Masking: the updater recovers every trial;
    # without it, exactly the trials whose seed masks a node fail.
    assert rows[("with updates", 0.0)]["success_rate"] == rows[("without updates", 0.0)]["success_rate"] == 1.0
    assert rows[("with updates", 0.2)]["success_rate"] == 1.0
    failing = sum(masked_somewhere(seed, 0.2) for seed in range(6))
    assert 0 < failing < 6
    assert rows[("without updates", 0.2)]["success_rate"] == pytest.approx(1 - failing / 6)
    assert rows[("with updates", 0.2)]["mean_updates"] > 0 == rows[("without updates", 0.2)]["mean_updates"]
    assert rows[("with updates", 0.2)]["change_ratio"] > 0
    # fresh seeds: trial i ran on seed i, so the trials are not cache copies of each other
    assert sorted({t.seed for t in report.trials}) == list(range(6))
    # answer scores beside plan scores
    assert all(t.plan_scores["ssi"] == pytest.approx(1.0) for t in report.trials)
    assert {t.answer_score for t in report.trials if t.success == 1.0} == {1.0}
    table = report.success_table()
    assert "| with updates | 1.00 | 1.00 |" in table
    assert f"| without updates | 1.00 | {1 - failing / 6:.2f} |" in table
    assert "change ratio" in report.cost_table() and "Answers and plans" in report.text()


def test_the_command_line_prints_the_tables(tmp_path, capsys):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(PLAN))
    with LoopbackServer(responder=responder) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        code = main(["trials", str(plan), "--n", "2", "--mask-rate", "0", "--mask-rate", "1",
                     "--check", "result for s2", "--set", "consolidate=false",
                     "--set", "max_updates=10", "--out", str(tmp_path / "t.json")])
    out = capsys.readouterr().out
    assert code == 0
    assert "| with updates | 1.00 | 1.00 |" in out and "| without updates | 1.00 | 0.00 |" in out
    saved = json.loads((tmp_path / "t.json").read_text())
    assert len(saved["trials"]) == 8 and saved["rows"][0]["trials"] == 2


def test_the_trials_template_declares_its_checks():
    from flowmagic.evaluate.trials import template_checks
    assert template_checks("trials") == ["1.", "2.", "3."]
    with pytest.raises(flowmagic.errors.ConfigError, match="declares no checks"):
        template_checks("gobang")


def test_table5_change_ratio_is_changed_original_subtasks_over_the_initial_plan():
    # A hand-made log of one trial on the plan a, b, c, d: the first update edits a, reruns
    # a and b and adds x; the second reruns a again, removes c and adds y; the third changes
    # nothing. Changed original subtasks: a, b, c (each once; x and y are not the plan's).
    from flowmagic.evaluate.trials import Trial, TrialReport, changed_originals

    def entry(no_change=False, **diff):
        return {"kind": "replan", "no_change": no_change, "diff": diff}

    log = [entry(edited=["a"], rerun=["a", "b"], added=["x"]),
           entry(rerun=["a"], removed=["c"], added=["y"]),
           entry(no_change=True)]
    assert changed_originals(["a", "b", "c", "d"], log) == ["a", "b", "c"]
    updated = Trial("with updates", 0.5, 0, 0, initial_tasks=4, changed_tasks=3, updates=3)
    quiet = Trial("with updates", 0.5, 1, 1, initial_tasks=4, changed_tasks=0, updates=0)
    row = TrialReport([updated, quiet]).rows()[0]
    # Averaged over every trial of the condition (a trial no update touched changed 0 of
    # its subtasks), not over the trials that updated.
    assert updated.change_ratio == 0.75 and row["change_ratio"] == pytest.approx(0.375)


def test_the_with_updates_arm_is_the_papers_update_after_completion():
    from flowmagic.evaluate.trials import CONDITIONS
    assert CONDITIONS["with updates"] == {"update": "after-completion"}
