"""Export of an executed flow to a notebook, and its replay: nbformat, nbclient, nbval, IPython.

Model traffic goes to a loopback server whose answers name the subtask they answer, so an
edited requirement gives a visibly different output. "Zero new calls" counts rows of the
store's `calls` table with cached=0.
"""

import json
import re
import subprocess
import sys

import nbformat
import pytest
from nbclient import NotebookClient

import flowmagic
from flowmagic.flow import Flow
from flowmagic.testing.loopback import LoopbackServer
from flowmagic.ops.export import NBVAL_IGNORE, build, export, load_cache, save_cache
from flowmagic.store import get_store
from flowmagic.view.safe import model_bundle

PLAN = {"task": "Write a short guide to green tea", "nodes": [
    {"id": "leaves", "requirement": "Pick the leaves.", "agent": "researcher"},
    {"id": "water", "requirement": "Heat the water to 80 C.", "agent": "chemist"},
    {"id": "steep", "requirement": "Steep the tea.", "agent": "writer"},
    {"id": "serve", "requirement": "Serve it.", "agent": "host"}],
    "edges": [["leaves", "steep"], ["water", "steep"], ["steep", "serve"]]}
SECRET = "sk-" + "test-DO-NOT-LEAK-0123456789abcdef"   # a fake key, split so scanners skip it


def responder(body):
    """Name the subtask (or the final write-up) the request is for."""
    text = body["messages"][-1]["content"]
    match = re.search(r"Your subtask \((\w+)\):\n(.*)", text)
    if match:
        return f"**{match.group(1)}** done: {match.group(2)}"
    return "All together: a guide to green tea."


@pytest.fixture
def server(monkeypatch):
    with LoopbackServer(responder=responder) as srv:
        # The kernel is another process: it finds the server through the environment.
        monkeypatch.setenv("FLOWMAGIC_BASE_URL", srv.base_url)
        monkeypatch.setenv("FLOWMAGIC_MODEL", "m")
        monkeypatch.setenv("FLOWMAGIC_API_KEY", SECRET)
        yield srv


@pytest.fixture
def tea(server):
    flow = Flow.from_dict(PLAN, name="tea", max_tokens=64)
    flow.run()
    assert flow.status == "done"
    return flow


def uncached():
    return get_store().count_calls(cached=False)


def execute(nb, cwd, client=None):
    client = client or NotebookClient(nb, timeout=120, kernel_name="python3",
                                      resources={"metadata": {"path": str(cwd)}})
    client.execute()
    return nb


def outputs(cell):
    """What nbval compares: output types, stream text and MIME data except images."""
    seen = []
    for out in cell.get("outputs", []):
        data = {k: v for k, v in out.get("data", {}).items() if not k.startswith("image/")}
        seen.append((out["output_type"], out.get("text"), data))
    return seen


def shown(cell) -> str:
    """The text of a cell's display (a cell that calls a model prints why first)."""
    return next(o for o in cell.outputs if o.output_type == "display_data").data["text/plain"]


def node_cell(nb, node_id):
    return next(i for i, c in enumerate(nb.cells)
                if c.cell_type == "code" and c.source.startswith(f"%%flow_node tea {node_id} "))


def test_export_layout_and_metadata(tea, tmp_path):
    path = export(tea, tmp_path / "tea.ipynb")
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    sources = [c.source.splitlines()[0] for c in nb.cells]
    assert nb.cells[0].cell_type == "markdown" and PLAN["task"] in nb.cells[0].source
    assert sources[1] == "%load_ext flowmagic"
    assert sources[2:4] == ["%%flow_plan tea", "%%flow_record tea"]
    assert sources[4:8] == ["%%flow_node tea leaves --agent researcher",
                            "%%flow_node tea water --agent chemist",
                            "%%flow_node tea steep --after leaves,water --agent writer",
                            "%%flow_node tea serve --after steep --agent host"]
    assert sources[8:] == ["show_result(tea)", "show_drawings(tea)"]
    assert nb.cells[3].metadata["jupyter"]["source_hidden"] is True
    assert NBVAL_IGNORE in nb.cells[9].metadata["tags"]
    steep = nb.cells[6]
    assert steep.source.splitlines()[1] == "Steep the tea."
    out = steep.outputs[0]
    assert out.data == model_bundle(tea.workflow.nodes["steep"].output)   # sanitized HTML
    assert out.metadata["flowmagic"]["node"] == "steep"
    assert out.metadata["flowmagic"]["cache_keys"]
    # The drawings: PNG beside SVG for the graph and the timeline.
    graph, timeline = nb.cells[9].outputs
    assert {"image/png", "image/svg+xml"} <= set(graph.data) and "image/png" in timeline.data
    meta = nb.metadata["flowmagic"]
    assert meta["run"] == tea.run_id and meta["settings"]["max_tokens"] == 64
    node = meta["nodes"]["steep"]
    assert node["seeds"] == [0] and len(node["cache_keys"]) == 1 and node["models"] == ["default:m"]
    assert node["tokens_out"] > 0 and node["duration_s"] >= 0
    assert meta["cost"]["calls"] == 5 and meta["update_log"] == []
    assert [r["node"] for r in meta["timeline"]][:2] == ["leaves", "water"]
    plan = json.loads(nb.cells[2].source.split("\n", 1)[1])
    assert plan["edges"] == PLAN["edges"]


def test_executed_export_replays_with_zero_calls_and_equal_outputs(tea, tmp_path):
    path = export(tea, tmp_path / "tea.ipynb")
    before = uncached()
    nb = execute(nbformat.read(path, as_version=4), tmp_path)
    assert uncached() == before, "replaying an exported notebook called the model"
    exported = nbformat.read(path, as_version=4)
    for ran, ref in zip(nb.cells, exported.cells):
        if ref.cell_type == "code" and NBVAL_IGNORE not in ref.metadata.get("tags", []):
            assert outputs(ran) == outputs(ref), ref.source[:60]
            assert not any(o.get("name") == "stderr" for o in ran.outputs), ran.outputs
    replayed = [c.outputs[0].metadata["flowmagic"]["replayed"] for c in nb.cells[4:8]]
    assert replayed == [True] * 4


def test_replay_needs_neither_the_cache_nor_the_endpoint(tea, tmp_path, monkeypatch):
    """Another machine: an empty FLOWMAGIC_HOME and no endpoint configured."""
    path = export(tea, tmp_path / "tea.ipynb")
    other = tmp_path / "other-home"
    monkeypatch.setenv("FLOWMAGIC_HOME", str(other))
    for var in ("FLOWMAGIC_BASE_URL", "FLOWMAGIC_MODEL", "FLOWMAGIC_API_KEY"):
        monkeypatch.delenv(var)
    nb = execute(nbformat.read(path, as_version=4), tmp_path)
    exported = nbformat.read(path, as_version=4)
    assert [outputs(c) for c in nb.cells[2:9]] == [outputs(c) for c in exported.cells[2:9]]
    store = flowmagic.Store(other / "flowmagic.db")
    assert store.count_calls() == 0


def test_nbval_passes_on_an_exported_notebook(tea, tmp_path):
    path = export(tea, tmp_path / "tea.ipynb")
    before = uncached()
    run = subprocess.run([sys.executable, "-m", "pytest", "--nbval", str(path), "-q",
                          "-p", "no:cacheprovider", "--rootdir", str(tmp_path)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "9 passed" in run.stdout   # the code cells
    assert uncached() == before


def test_editing_one_node_reruns_only_it_and_marks_descendants_stale(tea, tmp_path):
    path = export(tea, tmp_path / "tea.ipynb")
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}})
    steep, serve, result = node_cell(nb, "steep"), node_cell(nb, "serve"), len(nb.cells) - 2
    with client.setup_kernel():
        for i, cell in enumerate(nb.cells):
            client.execute_cell(cell, i)
        before = uncached()
        nb.cells[steep].source = nb.cells[steep].source.replace("Steep the tea.",
                                                                "Steep for two minutes.")
        client.execute_cell(nb.cells[steep], steep)
        assert uncached() == before + 1, "an edit must re-execute exactly that node"
        text = shown(nb.cells[steep])
        assert text == "**steep** done: Steep for two minutes."
        assert "stale now: serve" in nb.cells[steep].outputs[-1]["text"]
        # The descendant's and the result's cells were updated in place.
        assert "stale" in shown(nb.cells[serve])
        assert "stale" in shown(nb.cells[result])
        # Running the stale cell brings it up to date: one call for it, one for the write-up.
        client.execute_cell(nb.cells[serve], serve)
        client.execute_cell(nb.cells[result], result)
        assert uncached() == before + 3
        assert "stale" not in shown(nb.cells[serve])
        # Unchanged cells run again show the same output and call nothing.
        client.execute_cell(nb.cells[steep], steep)
        assert uncached() == before + 3
    # The edited notebook, run top to bottom in a new kernel, comes from the cache.
    nb2 = execute(nb, tmp_path)
    assert uncached() == before + 3
    assert shown(nb2.cells[steep]) == text


def test_an_unfinished_flow_exports_and_its_cells_run_the_nodes(server, tmp_path):
    flow = Flow.from_dict(PLAN, name="tea", max_tokens=64)
    path = export(flow, tmp_path / "plan.ipynb")
    nb = nbformat.read(path, as_version=4)
    assert shown(nb.cells[node_cell(nb, "steep")]) == \
        "*not run: waits for leaves, water*"
    before = uncached()
    nb = execute(nb, tmp_path)
    assert uncached() == before + 5   # four nodes and the final write-up
    assert shown(nb.cells[node_cell(nb, "serve")]) == \
        "**serve** done: Serve it."


def test_a_failed_node_replays_as_failed(server, tmp_path):
    flow = Flow.from_dict(PLAN, name="tea", max_tokens=64, fail_rate=1.0, max_attempts=1,
                          update="off")
    flow.run()
    assert flow.workflow.nodes["leaves"].status == "failed"
    path = export(flow, tmp_path / "failed.ipynb")
    before = uncached()
    nb = execute(nbformat.read(path, as_version=4), tmp_path)
    exported = nbformat.read(path, as_version=4)
    assert [outputs(c) for c in nb.cells[2:9]] == [outputs(c) for c in exported.cells[2:9]]
    assert uncached() == before
    assert "failed" in nb.cells[node_cell(nb, "leaves")].outputs[0].data["text/plain"]


def test_no_api_key_in_any_exported_file(tea, tmp_path):
    with pytest.raises(flowmagic.ConfigError, match="user name or key"):   # never stored
        flowmagic.configure(name="cheap", base_url="https://user:pw@example.com/v1")
    flowmagic.configure(name="cheap", base_url="https://example.com/v1?key=abc",
                        api_key=SECRET, model="small")
    tea.downgrade("serve", "cheap:small")
    path = export(tea, tmp_path / "tea.ipynb")
    text = path.read_text()
    assert SECRET not in text and "user:pw" not in text and "key=abc" not in text
    assert "https://example.com/v1" in text and "FLOWMAGIC_API_KEY" in text


def test_magics_in_a_shell(tea, tmp_path, capsys, monkeypatch):
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    monkeypatch.chdir(tmp_path)
    nb = build(tea)
    config = Config()
    config.HistoryManager.hist_file = ":memory:"
    InteractiveShell.clear_instance()
    ip = InteractiveShell.instance(config=config)
    try:
        before = uncached()
        for cell in nb.cells[1:9]:
            assert ip.run_cell(cell.source).success
        out, err = capsys.readouterr()
        assert err == "" and uncached() == before
        assert "tea: 4 subtasks (leaves, water, steep, serve), 3 dependencies" in out
        assert ip.user_ns["tea"].status == "done"
        # Mistakes are one line on stderr, never a traceback, and the cell fails.
        cases = {"%%flow_node nope steep --after leaves,water --agent writer\nx": "no flow named 'nope'",
                 "%%flow_node tea steep --after leaves --agent writer\nx": "the plan has 'steep' after",
                 "%%flow_node tea nope --agent writer\nx": "unknown node 'nope'",
                 "%%flow_plan tea\n{not json": "is not JSON",
                 "%%flow_node tea --bogus\nx": "%%flow_node:"}
        for source, message in cases.items():
            assert not ip.run_cell(source).success
            out, err = capsys.readouterr()
            assert err.startswith("UsageError: flowmagic: ") and message in err, err
            assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
        # A new plan cell: the node cells must run in order.
        ip.run_cell(nb.cells[2].source)
        ip.run_cell(nb.cells[6].source)
        out, err = capsys.readouterr()
        assert "waits for leaves, water; run their cells first" in err
    finally:
        ip.run_line_magic("unload_ext", "flowmagic")
        InteractiveShell.clear_instance()


def test_cache_files_move_answers_between_homes(tea, tmp_path, monkeypatch):
    saved = save_cache(tmp_path / "cache.json")
    assert saved == 5
    monkeypatch.setenv("FLOWMAGIC_HOME", str(tmp_path / "fresh"))
    store = get_store()
    assert load_cache(tmp_path / "cache.json", store=store) == 5
    assert load_cache(tmp_path / "cache.json", store=store) == 0
    again = Flow.from_dict(PLAN, name="tea", max_tokens=64, llm=flowmagic.LLM(store))
    again.run()
    assert store.count_calls(cached=False) == 0 and store.count_calls(cached=True) == 5
    assert again.result == tea.result


def long_enough(node, output):
    return len(output) > 3, "write more"


def test_a_function_validator_is_exported_by_name_and_replays(server, tmp_path, capsys, monkeypatch):
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    flow = Flow.from_dict(PLAN, name="tea", max_tokens=64, validate=long_enough)
    flow.run()
    nb = build(flow)
    plan = json.loads(nb.cells[2].source.split("\n", 1)[1])
    assert plan["settings"]["validate"] == "function:long_enough"
    assert nb.metadata["flowmagic"]["settings"]["validate"] == "function:long_enough"
    monkeypatch.chdir(tmp_path)
    config = Config()
    config.HistoryManager.hist_file = ":memory:"
    InteractiveShell.clear_instance()
    ip = InteractiveShell.instance(config=config)
    try:
        ip.user_ns["long_enough"] = long_enough   # the notebook defines it: it is used again
        before = uncached()
        for cell in nb.cells[1:9]:
            assert ip.run_cell(cell.source).success
        assert capsys.readouterr().err == "" and uncached() == before
        assert ip.user_ns["tea"].settings["validate"] is long_enough
    finally:
        ip.run_line_magic("unload_ext", "flowmagic")
        InteractiveShell.clear_instance()


# ------------------------------------------------------------------ the signed record (issue 19)
def _record_cell(nb) -> int:
    return next(i for i, c in enumerate(nb.cells) if c.source.startswith("%%flow_record"))


def _run_each(nb, cwd) -> list:
    """Every cell in one kernel, failures kept: the outputs of each cell, in order."""
    client = NotebookClient(nb, timeout=120, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(cwd)}})
    with client.setup_kernel():
        for i, cell in enumerate(nb.cells):
            client.execute_cell(cell, i)
    return nb


def _errors(cell) -> list[str]:
    """The failures a cell shows (IPython prints a UsageError as one line on stderr)."""
    return ([f"{o.ename}: {o.evalue}" for o in cell.outputs if o.output_type == "error"]
            + [line for o in cell.outputs if o.get("name") == "stderr"
               for line in o.text.splitlines() if line.startswith("UsageError: ")])


def test_an_edited_record_is_refused_in_one_line_and_calls_nothing(tea, tmp_path):
    path = export(tea, tmp_path / "tea.ipynb")
    nb = nbformat.read(path, as_version=4)
    i = _record_cell(nb)
    head, body = nb.cells[i].source.split("\n", 1)
    record = json.loads(body)
    assert record["format"] == 2 and record["signature"].startswith("sha256:")
    record["nodes"]["serve"]["output"] = "Serve it cold, with ketchup."   # the sink's output
    record["nodes"]["serve"]["cost_usd"] = 0.0
    nb.cells[i].source = head + "\n" + json.dumps(record, indent=1)
    before = uncached()
    nb = _run_each(nb, tmp_path)
    assert uncached() == before, "a replay with a broken record called the model"
    [error] = _errors(nb.cells[i])
    assert error.startswith("UsageError: flowmagic: the record of 'tea' does not match its "
                            "signature") and "\n" not in error
    first = nb.cells[node_cell(nb, "leaves")]
    [error] = _errors(first)
    assert "no trusted record" in error and "--allow-calls" in error
    assert "ketchup" not in json.dumps([c.get("outputs") for c in nb.cells])


def test_a_deleted_record_calls_only_when_allowed_and_says_so_first(tea, tmp_path):
    path = export(tea, tmp_path / "tea.ipynb")
    nb = nbformat.read(path, as_version=4)
    del nb.cells[_record_cell(nb)]
    before = uncached()
    refused = _run_each(nbformat.reads(nbformat.writes(nb), as_version=4), tmp_path)
    assert uncached() == before
    assert "no trusted record" in _errors(refused.cells[node_cell(refused, "leaves")])[0]
    plan = next(c for c in nb.cells if c.source.startswith("%%flow_plan"))
    plan.source = plan.source.replace("%%flow_plan tea", "%%flow_plan tea --allow-calls", 1)
    allowed = execute(nb, tmp_path)
    leaves = allowed.cells[node_cell(allowed, "leaves")]
    assert leaves.outputs[0].output_type == "stream"          # the notice comes first
    assert leaves.outputs[0].text.startswith("leaves: no record of it; calling m")
    assert shown(leaves) == "**leaves** done: Pick the leaves."


@pytest.mark.parametrize("name", ["import", "for", "class"])
def test_a_flow_named_like_a_keyword_exports_a_plan_cell_that_is_accepted(server, tmp_path, capsys,
                                                                        monkeypatch, name):
    """The export names the flow's variable; a Python keyword cannot be one, whichever it is."""
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    monkeypatch.chdir(tmp_path)
    flow = Flow.from_dict(PLAN, name=name, max_tokens=64)
    flow.run()
    nb = build(flow)
    plan = next(c for c in nb.cells if c.cell_type == "code" and c.source.startswith("%%flow_plan"))
    variable = plan.source.split("\n", 1)[0].split()[1]
    assert variable != name and variable.isidentifier(), plan.source.splitlines()[0]
    config = Config()
    config.HistoryManager.hist_file = ":memory:"
    InteractiveShell.clear_instance()
    ip = InteractiveShell.instance(config=config)
    try:
        for cell in nb.cells[1:3]:
            assert ip.run_cell(cell.source).success, capsys.readouterr().err
        assert ip.user_ns[variable].total() == 4
    finally:
        ip.run_line_magic("unload_ext", "flowmagic")
        InteractiveShell.clear_instance()
