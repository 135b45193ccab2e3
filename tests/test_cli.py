"""The `flowmagic` command end to end: run (a task, a notebook), plan, export, templates, new, log.

Commands run in-process through `cli.main`; notebooks run in a real kernel (nbclient)
that reaches the loopback model server through the environment.
"""

import ast
import json
import os
import re
import subprocess
import sys

import nbformat
import pytest

from flowmagic import cli
from flowmagic.testing.loopback import LoopbackServer
from flowmagic.ops.nbrun import parameters_of, templates
from flowmagic.magic_grammar import interpolate
from flowmagic.store import get_store

from conftest import ROOT

TASK = "Write a short guide to brewing green tea"
SECRET = "sk-" + "test-DO-NOT-LEAK-cli-0123456789"   # a fake key, split so scanners skip it
PLAN = {"subtasks": [
    {"id": "leaves", "requirement": "Pick the leaves.", "agent": "researcher", "depends_on": []},
    {"id": "water", "requirement": "Heat the water.", "agent": "chemist", "depends_on": []},
    {"id": "guide", "requirement": "Write the guide.", "agent": "writer",
     "depends_on": ["leaves", "water"]}]}
# One value per parameter of each template, of the default's type.
VALUES = {"conference": "EuroSciPy 2026", "days": "3", "talks_per_day": "4",
          "venue": "Kraków Old Town", "board_size": "19", "language": "JavaScript",
          "topic": "reinforcement learning", "audience": "engineers", "pages": "20",
          "csv_path": "sales.csv", "target": "revenue", "max_plots": "2", "dataset": "wine",
          "model_a": "SVM", "model_b": "k-NN", "metric": "F1", "folds": "10",
          "notes_folder": "my_notes", "words": "150", "k": "2", "seed": "3",
          "dates": "June 1 to 3, 2026",
          "place": "Kraków", "organizer": "NumFOCUS", "gui": "pygame",
          "hours": "3"}


def responder(body):
    if body.get("response_format"):
        return json.dumps(PLAN)
    text = body["messages"][-1]["content"]
    match = re.search(r"Your subtask \((\w+)\)", text)
    return f"Answer for {match.group(1)}." if match else "The whole guide."


@pytest.fixture
def server(monkeypatch):
    with LoopbackServer(responder=responder) as srv:
        monkeypatch.setenv("FLOWMAGIC_BASE_URL", srv.base_url)
        monkeypatch.setenv("FLOWMAGIC_MODEL", "m")
        monkeypatch.setenv("FLOWMAGIC_API_KEY", SECRET)
        yield srv


def flowmagic(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_run_a_task_writes_the_replayed_notebook_and_the_drawing(server, tmp_path, capsys):
    out_dir = tmp_path / "out"
    code, out, err = flowmagic(capsys, "run", TASK, "--k", "2", "--out", out_dir)
    assert code == 0, err
    name = "guide_brewing_green"
    files = {p.name for p in out_dir.iterdir()}
    assert {f"{name}.ipynb", f"{name}.svg", f"{name}.png"} <= files
    assert f"{name}: done; 3/3 nodes done" in out and "tokens" in out and "$0.0000" in out
    assert "0 model calls" in out.split("replayed")[1]
    # Progress: planning, every node event, every notebook cell.
    for line in ("planning", "▶ leaves (researcher)", "✓ guide", "running", "cell 1/"):
        assert line in err, err
    nb = nbformat.read(out_dir / f"{name}.ipynb", as_version=4)
    nbformat.validate(nb)
    node_cells = [c for c in nb.cells if c.source.startswith("%%flow_node")]
    assert [c.outputs[0].data["text/plain"] for c in node_cells] == [
        "Answer for leaves.", "Answer for water.", "Answer for guide."]
    assert all(c.execution_count for c in nb.cells if c.cell_type == "code")
    assert all(c.outputs[0].metadata["flowmagic"]["replayed"] for c in node_cells)
    for path in out_dir.iterdir():
        assert SECRET not in path.read_text(errors="replace"), path


def test_plan_then_export_gives_a_notebook_that_runs_the_nodes(server, tmp_path, capsys):
    code, out, err = flowmagic(capsys, "plan", TASK, "--k", "1", "--name", "tea",
                               "--svg", tmp_path / "plan.svg")
    assert code == 0, err
    assert "* candidate 0 (seed 0): 3 nodes, 2 edges, speed-up 1.50, P_avg 0.50, C_dependency 0.47" in out
    assert "chosen: the only usable candidate; connected, one final subtask" in out
    assert "selection rule: coverage" in out
    assert "guide [writer] after leaves, water: Write the guide." in out
    run_id = re.search(r"^run (\S+):", out, re.M).group(1)
    assert (tmp_path / "plan.svg").read_text().lstrip().startswith(("<?xml", "<svg", "//"))
    before = get_store().count_calls(cached=False)
    code, out, err = flowmagic(capsys, "export", run_id, tmp_path / "tea.ipynb", "--execute")
    assert code == 0, err
    assert "0/3 nodes done" in out and "4 model calls" in out   # three nodes, one write-up
    assert get_store().count_calls(cached=False) == before + 4
    code, out, err = flowmagic(capsys, "plan", TASK, "--k", "1", "--json")
    assert json.loads(out)["workflow"]["edges"] == [["leaves", "guide"], ["water", "guide"]]


def test_set_may_name_a_setting_that_has_its_own_option(server, capsys):
    # plan() got k twice (from --k's default and from --set) and the command crashed
    code, out, err = flowmagic(capsys, "plan", TASK, "--set", "k=1", "--set", "max_tokens=300",
                               "--json")
    assert code == 0, err
    assert len(json.loads(out)["workflow"]["nodes"]) == 3
    code, out, err = flowmagic(capsys, "plan", TASK, "--set", "k=0")
    assert code != 0 and "k is a number of candidate plans" in err and "Traceback" not in err


def test_every_template_fills_its_parameters(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_notes").mkdir()
    (tmp_path / "my_notes" / "a.md").write_text("Buy a kettle.")
    found = templates()
    assert {t["name"] for t in found} >= {"conference_website", "gobang", "beamer_slides",
                                          "csv_eda", "model_comparison", "notes_summary"}
    # csv_eda's seed reaches %%flow: another seed, another path through the same model
    assert "seed" in next(t for t in found if t["name"] == "csv_eda")["parameters"]
    for t in found:
        out = tmp_path / f"{t['name']}.ipynb"
        args = [a for key in t["parameters"] for a in ("-p", f"{key}={VALUES[key]}")]
        code, _, err = flowmagic(capsys, "new", t["name"], out, *args)
        assert code == 0, err
        nb = nbformat.read(out, as_version=4)
        nbformat.validate(nb)
        ns = {}
        flow_cell = None
        for cell in nb.cells:
            if cell.cell_type != "code":
                continue
            if cell.source.startswith("%%flow "):
                flow_cell = cell
                break
            exec(compile("\n".join(line for line in cell.source.splitlines()
                                   if not line.startswith("%")), "cell", "exec"), ns)
        capsys.readouterr()
        injected = next(c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", []))
        assert injected.source.startswith("# Parameters")
        for key, default in t["parameters"].items():   # a None default takes a literal
            want = ast.literal_eval(VALUES[key]) if default is None else type(default)(VALUES[key])
            assert ns[key] == want, (t["name"], key)
        task = interpolate(flow_cell.source.split("\n", 1)[1], ns)
        assert "{{" not in task, t["name"]
        typed = [str(type(d)(VALUES[k])) for k, d in t["parameters"].items()
                 if k not in ("k", "seed")]   # the %%flow line's own
        assert all(v in task for v in typed), (t["name"], task)
        line = flow_cell.source.splitlines()[0]   # k reaches %%flow (csv_eda: only when set)
        assert "{k}" in line or ("{k_option}" in line and ns["k_option"] == "--k 2"), line
        if "seed" in t["parameters"]:
            assert "--seed {seed}" in line and ns["seed"] == 3, line


def test_new_and_run_reject_bad_parameters_in_one_line(tmp_path, capsys):
    code, _, err = flowmagic(capsys, "new", "gobang", tmp_path / "g.ipynb", "-p", "colour=red")
    assert code == 1 and err.startswith("flowmagic: unknown parameter 'colour'")
    assert "board_size" in err and len(err.splitlines()) == 1
    code, _, err = flowmagic(capsys, "new", "gobang", tmp_path / "g.ipynb", "-p", "board_size=big")
    assert code == 1 and "should be a int like the default 15" in err
    code, _, err = flowmagic(capsys, "new", "nope", tmp_path / "g.ipynb")
    assert code == 1 and "no template 'nope'; templates: beamer_slides" in err
    assert flowmagic(capsys, "new", "gobang", tmp_path / "g.ipynb")[0] == 0
    code, _, err = flowmagic(capsys, "new", "gobang", tmp_path / "g.ipynb")
    assert code == 1 and "exists" in err
    code, _, err = flowmagic(capsys, "export", "no-such-run", tmp_path / "x.ipynb")
    assert code == 1 and err.startswith("flowmagic: no run 'no-such-run'")


def test_run_a_template_notebook_headless(server, tmp_path, capsys):
    path = tmp_path / "slides.ipynb"
    assert flowmagic(capsys, "new", "beamer_slides", path, "-p", "pages=8", "-p", "k=1")[0] == 0
    code, out, err = flowmagic(capsys, "run", path, "-p", "topic=bandits",
                               "--out", tmp_path / "ran.ipynb")
    assert code == 0, out + err
    assert "model calls" in out and "cell 1/" in err
    nb = nbformat.read(tmp_path / "ran.ipynb", as_version=4)
    injected = next(c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", []))
    assert "topic = 'bandits'" in injected.source
    result = next(c for c in nb.cells if c.source.startswith("await slides.wait()"))
    assert "The whole guide." in json.dumps(result.outputs)   # the flow's result
    check = next(c for c in nb.cells if "check_deliverables" in c.source)
    assert "no deliverable to check" in json.dumps(check.outputs)   # this responder writes none
    exported = tmp_path / "slides_run.ipynb"   # written by the notebook's last cell
    assert exported.exists()
    first = nbformat.read(exported, as_version=4).cells[0].source
    assert "bandits" in first and "8 frames" in first


def test_log_lists_calls(server, capsys):
    assert flowmagic(capsys, "log")[1] == "no model calls logged yet\n"
    flowmagic(capsys, "plan", TASK, "--k", "1")
    code, out, _ = flowmagic(capsys, "log", "-n", "1")
    assert code == 0 and out.startswith("#1 ") and " call  default:m " in out
    assert json.loads(flowmagic(capsys, "log", "--json")[1])[0]["purpose"] == "plan"


def test_log_filters_by_model_run_and_text_and_says_where_the_store_is(server, capsys,
                                                                       flowmagic_home):
    flowmagic(capsys, "plan", TASK, "--k", "1", "--name", "tea")
    flowmagic(capsys, "run", "Write a haiku about coffee", "--k", "1", "--no-execute",
              "--model", "other", "--name", "coffee")
    everything = json.loads(flowmagic(capsys, "log", "-n", "100", "--json")[1])
    assert {r["model"] for r in everything} == {"default:m", "default:other"}
    by_model = json.loads(flowmagic(capsys, "log", "-n", "100", "-m", "other", "--json")[1])
    assert by_model and {r["model"] for r in by_model} == {"default:other"}
    tea = get_store().load_run("tea")["id"]
    by_run = json.loads(flowmagic(capsys, "log", "-n", "100", "-r", "tea", "--json")[1])
    assert by_run and {r["run_id"] for r in by_run} == {tea}
    by_text = json.loads(flowmagic(capsys, "log", "-n", "100", "-q", "HAIKU", "--json")[1])
    assert by_text and all("haiku" in json.dumps(r["messages"]).lower() for r in by_text)
    assert len(by_text) < len(everything)
    assert flowmagic(capsys, "log", "-q", "no such words anywhere")[1] == "no model call matches\n"
    code, out, _ = flowmagic(capsys, "log", "path")
    assert code == 0 and out == f"{flowmagic_home / 'flowmagic.db'}\n"


def test_the_command_is_installed_and_its_help_is_in_the_readme():
    env = {**os.environ, "COLUMNS": "100"}
    run = subprocess.run([os.path.join(os.path.dirname(sys.executable), "flowmagic"), "--help"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert run.returncode == 0 and "new" in run.stdout
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Command line", 1)[1].split("\n## ", 1)[0]
    assert run.stdout.strip() in section, "README's `flowmagic --help` block is out of date"
    for command in ("run", "plan", "export", "log", "templates", "new"):
        assert f"flowmagic {command}" in section, command


DATA_PLAN = {"subtasks": [
    {"id": "stats", "requirement": "Print the mean of y per dataset and plot y against x.",
     "agent": "analyst", "depends_on": []},
    {"id": "findings", "requirement": "Write the findings.", "agent": "writer",
     "depends_on": ["stats"]}]}
STATS_CODE = ("means = df.groupby('dataset')['y'].mean().round(4)\nprint(means.to_string())\n"
              "df.plot.scatter(x='x', y='y')\n")


def data_responder(body):
    if body.get("response_format"):
        return json.dumps(DATA_PLAN)
    text = body["messages"][-1]["content"]
    if "Your subtask (stats)" in text:
        return f"```python\n{STATS_CODE}```"
    return "The four datasets have the same mean of y.\x1b[2J"


def test_run_says_which_node_is_done_on_the_working_start_not_the_models_answer(monkeypatch,
                                                                              tmp_path, capsys):
    """A node whose answers were all cut after the working start is done on the start's
    output: the summary line says so where it counts the nodes done, and exits 0."""
    from flowmagic.ops.nbrun import sample_data

    def responder(body):
        if body.get("response_format"):
            return json.dumps(DATA_PLAN)
        if "Your subtask (stats)" in body["messages"][-1]["content"]:
            return {"content": "print(df", "finish_reason": "length"}
        return "The four datasets have the same mean of y."

    with LoopbackServer(responder=responder) as srv:
        monkeypatch.setenv("FLOWMAGIC_BASE_URL", srv.base_url)
        monkeypatch.setenv("FLOWMAGIC_MODEL", "m")
        code, out, err = flowmagic(capsys, "run", "Explore anscombe.csv", "--k", "1",
                                   "--inputs", sample_data("anscombe.csv"), "--name", "anscombe",
                                   "--set", "starter=on", "--set", "continuations=0",
                                   "--set", "max_attempts=2", "--set", "update=off",
                                   "--out", tmp_path / "out")
    assert code == 0, err
    line = next(x for x in out.splitlines() if x.startswith("anscombe: done"))
    assert "(stats: the working start's output, the model's answers were not usable)" in line
    assert "stats (flowmagic's working start, ran" in out
    import pandas as pd   # the start's whole printout is shown, the correlations at its end too
    corr = pd.read_csv(sample_data("anscombe.csv")).groupby("dataset")[["x", "y"]].corr()
    assert str(corr).splitlines()[-1] in out


def test_run_with_inputs_shows_what_the_code_printed_and_writes_its_figure(monkeypatch,
                                                                           tmp_path, capsys):
    """`make demo`'s path on a loopback model: the CSV given with --inputs, the node's code run
    in the sandbox's session on it, its printed numbers shown, its figure in the out folder,
    and the exported notebook replayed."""
    from flowmagic.ops.nbrun import sample_data

    csv = sample_data("anscombe.csv")
    with LoopbackServer(responder=data_responder) as srv:
        monkeypatch.setenv("FLOWMAGIC_BASE_URL", srv.base_url)
        monkeypatch.setenv("FLOWMAGIC_MODEL", "m")
        out_dir = tmp_path / "out"
        code, out, err = flowmagic(capsys, "run", "Explore anscombe.csv", "--k", "1",
                                   "--inputs", csv, "--name", "anscombe", "--out", out_dir)
    assert code == 0, err
    printed = out.split("code run in the sandbox:")[1].split("anscombe: done")[0]
    assert "stats (the model's code, ran; figures:" in printed
    import pandas as pd
    means = pd.read_csv(csv).groupby("dataset")["y"].mean().round(4)
    for dataset, mean in means.items():   # numbers the code computed on the file, not typed in
        assert re.search(rf"^\s+{dataset}\s+{mean:.4f}$", printed, re.M), printed
    assert "0 model calls" in out.split("replayed")[1]
    assert (out_dir / "anscombe_files" / "stats_figure_1.png").is_file()   # the code's figure
    shown = out.split("result (written by the model from those outputs):\n")[1]
    assert shown.startswith("    The four datasets have the same mean of y")   # the findings
    assert "\x1b" not in shown and "[2J" in shown   # a terminal escape is shown, not obeyed
    code, out, err = flowmagic(capsys, "run", "csv_eda", "--inputs", csv, "--out", out_dir)
    assert code == 1 and err.count("\n") == 1 and "-p (csv_path=FILE for csv_eda)" in err
