"""The magics through a real IPython InteractiveShell, with a loopback model server.

The loopback answers planning requests (they ask for JSON) with a fixed three-node plan,
and every other request with text, so each cell is fast and deterministic.
"""

import json
import re
import subprocess
import sys

import pytest
from IPython.core.error import UsageError
from traitlets.config import Config

import flowmagic
from flowmagic.flow import Flow
from flowmagic.testing.loopback import LoopbackServer
from flowmagic.magic_grammar import interpolate, parse_command, parse_flow_line

from conftest import ROOT, ipython_shell

PLAN = {"subtasks": [
    {"id": "facts", "requirement": "List three facts about tea.", "agent": "researcher",
     "depends_on": []},
    {"id": "photo", "requirement": "Describe a photo of a teacup.", "agent": "designer",
     "depends_on": []},
    {"id": "post", "requirement": "Write the post from the facts and the photo.",
     "agent": "writer", "depends_on": ["facts", "photo"]}]}


def responder(body):
    if body.get("response_format"):
        return json.dumps(PLAN)
    return "A result, with **Markdown**."


def planning_prompts(server):
    return [m["content"] for r in server.requests if r["body"].get("response_format")
            for m in r["body"]["messages"] if m["role"] == "user"]


def node_requests(server):
    return [r for r in server.requests if "/chat/" in r["path"]
            and not r["body"].get("response_format")]


@pytest.fixture
def server():
    with LoopbackServer(responder=responder) as srv:
        flowmagic.configure(base_url=srv.base_url, model="m")
        yield srv


@pytest.fixture
def shell(server, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)   # no [tool.flowmagic] from the repository's pyproject.toml
    with ipython_shell() as ip:
        yield ip


def run(ip, capsys, source):
    """Run a cell; (stdout, stderr, result)."""
    result = ip.run_cell(source, store_history=True)
    out, err = capsys.readouterr()
    return out, err, result


def one_line_error(err):
    """The one line a user error shows: IPython's UsageError form, which fails the cell."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("UsageError: flowmagic: ") and "Traceback" not in err
    return lines[0]


# ---------------------------------------------------------------------------------- loading
_HEAVY = ("ipywidgets", "flowmagic.flow", "networkx", "openai", "pandas", "numpy", "scipy",
          "matplotlib", "tqdm")


def test_load_ext_is_lazy():
    """%load_ext registers the magics and imports none of the heavy modules (its time is a
    target of `make bench`, not of a unit test: a loaded machine would fail it)."""
    code = ("import sys; from IPython.core.interactiveshell import InteractiveShell;"
            "from traitlets.config import Config; c = Config(); c.HistoryManager.hist_file=':memory:';"
            "ip = InteractiveShell.instance(config=c);"
            "ip.run_line_magic('load_ext', 'flowmagic');"
            "m = ip.magics_manager.magics;"
            f"print('flow' in m['line'], 'flow' in m['cell'], *[x in sys.modules for x in {_HEAVY!r}])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT / "tests", check=True).stdout.split()
    assert out == ["True", "True"] + ["False"] * len(_HEAVY), dict(zip(("line", "cell") + _HEAVY, out))


# ---------------------------------------------------------------------------------- %%flow
def test_cell_interpolates_notebook_values_and_keeps_json(shell, server, capsys):
    shell.user_ns["topic"] = "green tea"
    first = shell.run_cell("'quoted from Out'", store_history=True)
    capsys.readouterr()
    body = ("Write about {{topic}} for {{ audience['who'] }}; cite {{Out[%d]}}.\n"
            'Reply as JSON like {"title": "x", "tags": ["a", {"b": 1}]} and keep f"{x}" too.'
            % first.execution_count)
    shell.user_ns["audience"] = {"who": "students"}
    out, err, result = run(shell, capsys, "%%flow report --k 2\n" + body)
    assert result.success and err == ""
    prompts = planning_prompts(server)
    assert len(prompts) == 2   # two candidates, no node has run (plan-only is the default)
    assert ("Write about green tea for students; cite quoted from Out.\n"
            'Reply as JSON like {"title": "x", "tags": ["a", {"b": 1}]} and keep f"{x}" too.'
            ) in prompts[0]
    flow = shell.user_ns["report"]
    assert isinstance(flow, Flow) and flow.name == "report" and flow.status == "planned"
    assert len(flow.candidates) == 2 and flow.settings["k"] == 2
    assert set(flow.workflow.nodes) == {"facts", "photo", "post"}
    assert "estimate of a run:" in out and "facts [researcher, pending]" in out
    assert node_requests(server) == []


def test_cell_default_name_and_options_reach_the_flow(shell, server, capsys):
    out, err, _ = run(shell, capsys, "%%flow --k 1 --update off --concurrency 2 --context "
                                     "ancestors --validate none --strategy coarse\nMake tea")
    assert err == ""
    flow = shell.user_ns["flow"]
    assert (flow.settings["update"], flow.settings["concurrency"], flow.settings["context"],
            flow.settings["strategy"]) == ("off", 2, "ancestors", "coarse")


def test_no_interpolate_keeps_double_braces(shell, server, capsys):
    _, err, _ = run(shell, capsys, "%%flow t --k 1 --no-interpolate\nRender {{ name }} in Jinja")
    assert err == ""
    assert "Render {{ name }} in Jinja" in planning_prompts(server)[0]


def test_run_and_step_modes(shell, server, capsys):
    run(shell, capsys, "%%flow a --k 1 --step\nMake tea")
    assert shell.user_ns["a"].counts() == {"done": 2, "pending": 1}
    run(shell, capsys, "%%flow b --k 1 --run\nMake tea")
    assert shell.user_ns["b"].counts() == {"done": 3} and shell.user_ns["b"].status == "done"


def test_budget_stops_a_run_that_would_exceed_it(shell, server, capsys):
    out, err, _ = run(shell, capsys, "%%flow pricey --k 1 --model gpt-4o --budget-usd 0.00001 "
                                     "--run\nMake tea")
    line = one_line_error(err)
    assert "over the budget of $0.0000" in line and "%flow run pricey" in line
    flow = shell.user_ns["pricey"]   # bound and shown, so the user can prune or downgrade
    assert flow.counts() == {"pending": 3} and node_requests(server) == []


def test_defaults_from_config_and_pyproject(server, tmp_path, monkeypatch, capsys):
    (tmp_path / "pyproject.toml").write_text(
        '[tool.flowmagic]\nk = 1\nstrategy = "fine"\nmax_tokens = 64\n')
    monkeypatch.chdir(tmp_path)
    config = Config()
    config.FlowMagics.default_strategy = "coarse"   # %config wins over pyproject.toml
    with ipython_shell(config) as ip:
        ip.run_line_magic("config", "FlowMagics.default_update = 'off'")
        run(ip, capsys, "%%flow\nMake tea")
        flow = ip.user_ns["flow"]
        assert (flow.settings["k"], flow.settings["strategy"], flow.settings["max_tokens"],
                flow.settings["update"]) == (1, "coarse", 64, "off")
        out, _, _ = run(ip, capsys, "%flow config")
        assert "max_tokens" in out and str(tmp_path / "pyproject.toml") in out


# ---------------------------------------------------------------------------------- %flow
def test_every_subcommand(shell, server, capsys, tmp_path, monkeypatch):
    run(shell, capsys, "%%flow report --k 1\nMake tea")
    flow = shell.user_ns["report"]

    out, err, _ = run(shell, capsys, "%flow list")
    assert err == "" and "report" in out and flow.run_id in out and "recent runs" in out
    out, _, _ = run(shell, capsys, "%flow show report")
    assert "flow 'report' (planned): 0/3 done" in out

    out, _, _ = run(shell, capsys, "%flow step report")
    assert flow.counts() == {"done": 2, "pending": 1} and "2/3 done" in out
    out, _, _ = run(shell, capsys, "%flow prune report photo")
    assert flow.workflow.nodes["photo"].status == "pruned" and "pruned 'photo'" in out
    out, _, _ = run(shell, capsys, "%flow downgrade report post gpt-4o-mini")
    post = flow.workflow.nodes["post"]
    assert (post.model, post.downgraded_from) == ("gpt-4o-mini", "default")
    out, _, _ = run(shell, capsys, "%flow run report")
    assert flow.status == "done" and "2/2 done" in out
    assert node_requests(server)[-2]["body"]["model"] == "gpt-4o-mini"   # then consolidation
    out, _, _ = run(shell, capsys, "%flow step report")
    assert "no node is ready to run" in out

    before = len(node_requests(server))
    out, _, _ = run(shell, capsys, "%flow rerun report facts")
    assert len(node_requests(server)) > before and flow.workflow.nodes["facts"].status == "done"
    out, _, _ = run(shell, capsys, '%flow edit report post "Write a two-line post, with quotes"')
    assert post.requirement == "Write a two-line post, with quotes" and post.status == "pending"

    out, _, _ = run(shell, capsys, "%flow cost report")
    assert "purpose" in out and "total" in out and "plan" in out
    out, _, _ = run(shell, capsys, "%flow timeline report")
    assert "facts" in out and "took s" in out
    out, _, _ = run(shell, capsys, "%flow stop report")
    assert "nothing is running" in out

    out, err, _ = run(shell, capsys, f"%flow export report {tmp_path / 'report.ipynb'}")
    if err:   # notebook export is a separate module; without it the error is one line
        assert "export" in one_line_error(err)
    else:
        assert (tmp_path / "report.ipynb").exists() and "wrote" in out

    out, _, _ = run(shell, capsys, "%flow log 3")
    assert out.count("default:") >= 3 and "purpose" in out
    out, _, _ = run(shell, capsys, "%flow help")
    assert "%flow downgrade NAME NODE MODEL" in out


def test_config_subcommand_sets_defaults(shell, server, capsys):
    out, err, _ = run(shell, capsys, "%flow config k=1 max_tokens=32 budget_usd=none")
    assert err == "" and out == ""
    out, _, _ = run(shell, capsys, "%flow config")
    assert re.search(r"^max_tokens +32$", out, re.M)
    run(shell, capsys, "%%flow\nMake tea")
    assert shell.user_ns["flow"].settings["max_tokens"] == 32
    assert len(planning_prompts(server)) == 1


def test_models_ticks_key_variables(shell, capsys, monkeypatch):
    monkeypatch.setenv("FLOWMAGIC_API_KEY", "sk-not-shown")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    out, err, _ = run(shell, capsys, "%flow models")
    assert err == "" and "sk-not-shown" not in out
    assert re.search(r"^✓ +FLOWMAGIC_API_KEY$", out, re.M)
    assert re.search(r"^✗ +OPENAI_API_KEY$", out, re.M)
    assert "gpt-4o-mini" in out and "default" in out


# ---------------------------------------------------------------------------------- errors
@pytest.mark.parametrize("line, expected", [
    ("%flow frob", "unknown subcommand 'frob'; subcommands: list, show, run"),
    ("%flow show nope", "no flow named 'nope'; flows in this notebook: report"),
    ("%flow prune report nope", "unknown node 'nope'; known nodes: facts, photo, post"),
    ("%flow rerun report", "%flow rerun takes NAME NODE, got 1 argument(s)"),
    ("%flow edit report post 'unclosed", "cannot split the line"),
    ("%flow config colour=blue", "unknown setting 'colour'; known: k, model"),
    ("%flow config update=sometimes", "update strategy 'sometimes' is not one of"),
    ("%flow log many", "takes a number of calls"),
    ("%%flow x --k 0\nMake tea", "argument --k: must be at least 1"),
    ("%%flow x --run --step\nMake tea", "not allowed with argument --run"),
    ("%%flow my-flow\nMake tea", "must be a Python identifier"),
    ("%%flow x --frob\nMake tea", "unrecognized arguments: --frob"),
    ("%%flow x\n   ", "the task is empty"),
    ("%%flow x\nAbout {{missing}}", "'missing' is not defined in the notebook"),
    ("%%flow x\nAbout {{ f(1) }}", "is not a name, attribute or index"),
    ("%%flow x --update sometimes\nMake tea", "update strategy 'sometimes'"),
])
def test_errors_are_one_line(shell, capsys, line, expected):
    run(shell, capsys, "%%flow report --k 1\nMake tea")
    out, err, result = run(shell, capsys, line)
    # The cell fails (Run All and papermill stop here), with one line and no traceback.
    assert not result.success and isinstance(result.error_in_exec, UsageError)
    assert expected in one_line_error(err)


def test_debug_shows_the_traceback(shell, capsys):
    _, _, result = run(shell, capsys, "%flow show nope --debug")
    assert isinstance(result.error_in_exec, flowmagic.ConfigError)


def test_a_bug_is_not_hidden(shell, capsys):
    # Only FlowError becomes one line; anything else keeps its traceback.
    shell.user_ns["report"] = Flow.from_dict(PLAN, task="t", name="report")
    shell.user_ns["report"].workflow = None   # a broken object: a bug, not a user error
    _, _, result = run(shell, capsys, "%flow prune report facts")
    assert isinstance(result.error_in_exec, AttributeError)


# ---------------------------------------------------------------------------------- grammar
def test_grammar_units():
    args = parse_flow_line("report --k 2 --budget-usd 0.5 --plan-only --debug")
    assert (args.name, args.mode, args.debug, args.settings) == (
        "report", "plan-only", True, {"k": 2, "budget_usd": 0.5})
    assert parse_command("edit r n 'a b' --debug").args == ["r", "n", "a b"]
    ns = {"Out": {3: "three"}, "rows": [1, 2, 3], "cfg": {"a": {"b": "deep"}}}
    assert interpolate("{{Out[3]}} {{rows[-1]}} {{rows[:2]}} {{ cfg['a']['b'] }} {x} {{}",
                       ns) == "three 3 [1, 2] deep {x} {{}"


# ---------------------------------------------------------------------------------- slimming
SLIM_PLAN = {"nodes": [{"id": "lookup", "requirement": "LOOKUP {{input}}", "model": "big"},
                       {"id": "relay", "requirement": "RELAY the facts", "model": "big"},
                       {"id": "answer", "requirement": "ANSWER with every fact", "model": "small"}],
             "edges": [["lookup", "relay"], ["relay", "answer"]]}
CITIES = [{"input": w, "expected": f"FACT:{w}"} for w in ("paris", "oslo")]


def slim_responder(body):
    user = next((m["content"] for m in body["messages"] if m["role"] == "user"), "")
    node, requirement = re.search(r"Your subtask \((\w+)\):\n(.*)", user).groups()
    facts = " ".join(re.findall(r"FACT:\w+", user.split("Your subtask", 1)[1]))
    if node == "lookup":
        return f"FACT:{requirement.split()[-1]}" + " (looked up at length)" * 3
    return f"chatter; {facts}" if node == "relay" else f"facts: {facts}"


@pytest.fixture
def slim_endpoints(shell):
    with LoopbackServer(responder=slim_responder) as srv:
        flowmagic.configure(base_url=srv.base_url, model="m")
        flowmagic.configure(name="big", base_url=srv.base_url, model="big-model")
        flowmagic.configure(name="small", base_url=srv.base_url, model="small-model")
        flowmagic.configure(prices={"big-model": (10.0, 30.0), "small-model": (0.1, 0.3)})
        yield srv


def test_importance_and_slim_subcommands(shell, slim_endpoints, capsys):
    from flowmagic.view.display import importance_cells

    scorer = lambda result, example: float(example["expected"] in result)  # noqa: E731
    cities = shell.user_ns["cities"] = Flow.from_dict(SLIM_PLAN, task="facts", name="cities")
    out, err, _ = run(shell, capsys, "%flow slim cities")
    assert "flow 'cities' has no probe set; attach one first: cities.attach_probe(" in \
        one_line_error(err)
    cities.attach_probe(CITIES, scorer)

    out, err, result = run(shell, capsys, "%flow importance cities")
    assert err == "" and result.success
    shown = result.result   # a Report: the text table in a terminal, HTML in a notebook
    assert shown.text.startswith("importance (prune; baseline S=1.000") and shown.text in out
    rows = importance_cells(cities.importance().to_rows())
    assert [line.split()[0] for line in shown.text.splitlines()[2:]] == [r[0] for r in rows]
    assert "<td>answer</td><td>small</td>" in shown.html and "produces the final result" in out

    out, err, result = run(shell, capsys, "%flow slim cities --cheaper big=small --tau 0.9")
    assert err == "" and result.success
    slim, report = cities.last_slim
    assert shell.user_ns["cities_slim"] is slim   # bound, like the flow a %%flow cell makes
    assert slim.workflow.nodes["relay"].status == "pruned"
    assert slim.workflow.nodes["lookup"].model == "small"
    assert report.settings["tau_prune"] == 0.9 and report.settings["cheaper"] == {"big": "small"}
    text = result.result.text
    assert text.startswith(f"slimmed 'cities' to [{report.final['label']}]")
    assert "the slimmed flow is cities_slim (%flow show cities_slim)" in text
    assert text.endswith(report.text()) and text in out
    bundle, _ = result.result._repr_mimebundle_()
    assert "<svg" in bundle["text/html"] and "image/svg+xml" in bundle
    out, _, _ = run(shell, capsys, "%flow show cities_slim")
    assert "flow 'cities-slim'" in out

    shell.user_ns["cities_slim"] = "mine"   # a name the user took is never overwritten
    out, _, _ = run(shell, capsys, "%flow slim cities --tau 0.9")
    assert shell.user_ns["cities_slim"] == "mine" and "cities.last_slim" in out


@pytest.mark.parametrize("line, expected", [
    ("%flow slim cities --tau 2", "--tau must be in (0, 1]"),
    ("%flow slim cities --tau x", "argument --tau: must be a number"),
    ("%flow slim cities --cheaper big", "cheaper takes model=cheaper-model pairs"),
    ("%flow slim cities --frob", "%flow slim: unrecognized arguments: --frob"),
    ("%flow slim", "%flow slim takes NAME [--cheaper A=B,...] [--tau T], got 0"),
    ("%flow importance nope", "no flow named 'nope'"),
    ("%flow importance cities extra", "%flow importance takes NAME, got 2"),
])
def test_slim_mistakes_are_one_line(shell, capsys, line, expected):
    shell.user_ns["cities"] = Flow.from_dict(SLIM_PLAN, task="facts", name="cities")
    _, err, _ = run(shell, capsys, line)
    assert expected in one_line_error(err)


# ---------------------------------------------------------------------------------- orchestrations
def orchestrating(body):
    """The orchestrator asks the writer once, then submits; the writer answers."""
    system = body["messages"][0]["content"]
    if "Write only the final answer" in system:
        return "best answer so far"
    if "The orchestrator proposes this final answer" in body["messages"][-1]["content"]:
        return json.dumps({"agree": True, "reason": "tea is a drink"})   # the consensus vote
    if system.startswith("You are the orchestrator"):
        if any(m["role"] == "tool" for m in body["messages"]):
            return {"tool_calls": [{"function": {"name": "submit_answer",
                                                 "arguments": json.dumps({"answer": "Tea."})}}]}
        return {"tool_calls": [{"function": {"name": "send_message", "arguments": json.dumps(
            {"agent": "writer", "content": "Name a drink"})}}]}
    return "Tea, hot."


def test_export_of_an_orchestrator(shell, capsys, tmp_path):
    import nbformat

    from flowmagic.orchestrator import Orchestrator

    with LoopbackServer(responder=orchestrating) as srv:
        flowmagic.configure(base_url=srv.base_url, model="m")
        shell.user_ns["waiting"] = Orchestrator("Name a drink", ["writer"])
        _, err, _ = run(shell, capsys, f"%flow export waiting {tmp_path / 'w.ipynb'}")
        assert ("orchestration 'waiting' has not finished; wait for its answer (await "
                "waiting.wait(), or waiting.stop()), then export it") in one_line_error(err)
        assert not (tmp_path / "w.ipynb").exists()

        out, err, _ = run(shell, capsys, "%%flow chat --mode orchestrate --agents writer "
                                         "--max-turns 3\nName a drink")
        assert err == "" and "Tea." in out
        path = tmp_path / "chat.ipynb"
        out, err, _ = run(shell, capsys, f"%flow export chat {path}")
    assert err == "" and out.strip() == f"orchestration 'chat': wrote {path}"
    nb = nbformat.read(str(path), as_version=4)
    o = shell.user_ns["chat"].result
    assert nb.metadata["flowmagic"]["run"] == o.run_id
    text = "\n".join(c.source for c in nb.cells)
    assert "<strong>orchestrator → writer</strong>" in text and "Tea, hot." in text   # sanitized
    assert "replay=" in text
    # an Orchestration itself (e.g. flowmagic.orchestrate's result) exports too
    shell.user_ns["outcome"] = o
    out, err, _ = run(shell, capsys, f"%flow export outcome {tmp_path / 'o.ipynb'}")
    assert err == "" and (tmp_path / "o.ipynb").exists()


# ------------------------------------------------------------------ names, braces, re-runs
def test_a_failing_magic_stops_a_notebook_run_all(server, tmp_path):
    """papermill and Run All go through nbclient: a broken %flow stops the notebook there."""
    import nbclient
    import nbformat
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in
                ("%load_ext flowmagic", "%flow show nope", "after = 1")]
    client = nbclient.NotebookClient(nb, timeout=60, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    with pytest.raises(CellExecutionError) as caught:
        client.execute()
    assert "no flow named 'nope'" in str(caught.value)
    assert nb.cells[2].get("execution_count") is None   # the cell after it never ran
    shown = [o for o in nb.cells[1].outputs if o["output_type"] == "stream"]
    assert [o["text"].strip() for o in shown] == [
        "UsageError: flowmagic: no flow named 'nope'; flows in this notebook: none yet "
        "(make one with a %%flow NAME cell)"]


@pytest.mark.parametrize("name", ["get_ipython", "frame", "list"])
def test_a_name_holding_something_else_is_refused_unless_forced(shell, server, capsys, name):
    shell.user_ns["frame"] = {"rows": 3}
    before = shell.user_ns.get(name)
    out, err, result = run(shell, capsys, f"%%flow {name} --k 1\nMake tea")
    assert not result.success and f"{name!r} already holds a" in one_line_error(err)
    assert "add --force to replace it" in err
    assert shell.user_ns.get(name) is before and not server.requests   # nothing planned
    assert run(shell, capsys, "%flow list")[2].success   # later magics still work

    if name == "get_ipython":
        return   # --force would break every later magic: exactly what the refusal prevents
    out, err, result = run(shell, capsys, f"%%flow {name} --k 1 --force\nMake tea")
    assert result.success and isinstance(shell.user_ns[name], Flow), err
    # A name that holds a flow is replanned without --force.
    assert run(shell, capsys, f"%%flow {name} --k 1\nMake tea")[2].success


def test_single_braces_naming_a_variable_are_warned_once(shell, server, capsys):
    shell.user_ns["csv_path"] = "data.csv"
    out, err, result = run(shell, capsys, "%%flow report --k 1\nLoad {csv_path}, "
                                          "keep {not_defined} and {{csv_path}}; JSON {\"a\": 1}")
    assert result.success and err == ""
    warned = [line for line in out.splitlines() if "did you mean" in line]
    assert warned == ["flowmagic: {csv_path} in the task goes to the model as written, though "
                      "csv_path is a variable here; did you mean {{csv_path}}? (said once)"]
    assert "Load {csv_path}, keep {not_defined} and data.csv" in planning_prompts(server)[0]
    out, _, _ = run(shell, capsys, "%%flow report --k 1\nLoad {csv_path} again")
    assert "did you mean" not in out
    out, _, _ = run(shell, capsys, "%%flow report --k 1 --no-interpolate\nLoad {csv_path}")
    assert "did you mean" not in out


def test_rerunning_a_cell_stops_the_run_still_going(capsys, tmp_path, monkeypatch):
    """In a kernel the run is a task on the loop: the old one must not go on unseen."""
    import asyncio

    with LoopbackServer(responder=responder, latency=0.3) as slow:
        flowmagic.configure(base_url=slow.base_url, model="m")
        monkeypatch.chdir(tmp_path)
        with ipython_shell() as ip:
            def cell(source):
                return ip.run_cell_async(source, transformed_cell=ip.transform_cell(source))

            async def cells():
                await cell("%%flow report --k 1 --run\nMake tea")
                old = ip.user_ns["report"]
                await asyncio.sleep(0.1)
                assert old.busy
                result = await cell("%%flow report --k 1\nMake tea")
                await old.wait()
                return old, result

            old, result = asyncio.run(cells())
            out, err = capsys.readouterr()
            assert result.success, err
            assert old.status == "stopped" and not old.busy
            assert ip.user_ns["report"] is not old
            assert (f"flowmagic: stopped the earlier run of 'report' ({old.run_id}) that was "
                    "still going") in out


def test_tables_with_dollars_are_html_that_mathjax_skips(shell, server, capsys):
    """JupyterLab typesets the text between two `$` of a Markdown output as maths, which
    collapsed whole rows of %flow cost / list / log; tables are HTML in a no-maths block."""
    flowmagic.configure(prices={"m": (1.0, 2.0)})   # priced, so the tables hold dollars
    run(shell, capsys, "%%flow report --k 1 --run\nMake tea")
    for line in ("%flow cost report", "%flow list", "%flow log", "%flow models", "%flow config"):
        data, meta = run(shell, capsys, line)[2].result._repr_mimebundle_()
        assert "text/markdown" not in data, line
        page = data["text/html"]
        assert page.startswith('<div class="flowmagic-table tex2jax_ignore mathjax_ignore">')
        assert page.count("<table>") == page.count("</table>") >= 1, line
    cost = run(shell, capsys, "%flow cost report")[2].result
    rows = cost._repr_mimebundle_()[0]["text/html"].split("<tbody>")[1].count("<tr>")
    assert rows == len(cost.text.splitlines()) - 1 and "$" in cost.text


def test_planning_says_what_it_is_doing(shell, server, capsys):
    out, err, result = run(shell, capsys, "%%flow report --k 2\nMake tea")
    assert result.success, err
    lines = [line for line in out.splitlines() if "plan" in line]
    assert lines[:2] == ["planning 'report': asking for 2 candidate plans",
                         "planned 'report': 2 of 2 candidate plans usable; candidate 0 chosen "
                         "(the panel lists them all)"]


def test_the_planning_line_in_a_notebook_counts_replies_and_the_embedded_wait():
    from flowmagic.view.display import PlanningLine

    line = PlanningLine("tea", 3, embedded=True)
    assert line.text == ("planning 'tea': asking for 3 candidate plans; the embedded model "
                         "answers one plan at a time, ~2-6 s each (~6-18 s)")
    assert line.event({"phase": "received", "done": 2, "k": 3, "ok": 1}) == (
        "planning 'tea': 2/3 candidate plans received (1 unusable); the embedded model "
        "answers one plan at a time, ~2-6 s each (~6-18 s)")
    assert line.event({"phase": "received", "done": 3, "k": 3, "ok": 2}).endswith(
        "3/3 candidate plans received (1 unusable); scoring them")
    assert line._repr_mimebundle_()[0] == {"text/plain": line.text}
