"""Model text never becomes code in an exported notebook (issue 28, finding 1).

A scripted model on a loopback server fills every field it writes with hostile values
(`{expr}`, `$(...)`, a newline and code, quotes, `\\r`, U+2028, U+0085, NUL): the task it
echoes, ids, agents, model names, requirements, outputs, file names, the updater's
rationale. The flow runs, is exported, and the export is executed in a real kernel
(nbclient); a payload that ran would create a marker file. Separately: a line or a comment
an export writes cannot be broken out of, and an edited magic line is never expanded.
"""

import json
import re

import nbformat
import pytest
from nbclient import NotebookClient

import flowmagic
from flowmagic.errors import ConfigError
from flowmagic.flow import Flow
from flowmagic.ops.celltext import comment, literal, magic_word
from flowmagic.ops.export import build, export
from flowmagic.testing.loopback import LoopbackServer

from conftest import fast_llm, run


def payloads(marker):
    """Every way a value could break out, each touching `marker` if it runs."""
    code = f'__import__("os").system("touch {marker}")'
    return [f"{{{code}}}", f"$(touch {marker})", f"x\n{code}", f"x\r{code}", f"x\u2028{code}",
            f"x\x85{code}", f"x\x00{code}", f'"""\n{code}\n"""', f"'\n{code}\n'",
            f"x\n%%bash\ntouch {marker}", f"x\n!touch {marker}", f"$({code})"]


def hostile_responder(marker, same_plan=False):
    """Candidate 0 names a hostile model (and, unless `same_plan`, forges state in a plan
    of its own); candidate 1 has hostile ids, roles and requirements. With `same_plan` the
    two are the same plan but for the model, so the old code chose candidate 0."""
    bad = payloads(marker)
    text = " | ".join(bad)

    def plan(model=None):
        return {"task": text, "subtasks": [
            {"id": p, "requirement": f"Write about green tea {p}", "agent": p,
             "depends_on": [bad[i - 1]] if i else [], **({"model": model} if model and not i else {})}
            for i, p in enumerate(bad[:4])]}

    def respond(body):
        system = body["messages"][0]["content"]
        if system.startswith("You plan work"):
            if body.get("seed") == 0 and same_plan:
                return json.dumps(plan(bad[0]))
            if body.get("seed") == 0:   # model names and state: refused by the gate
                return json.dumps({"task": text, "subtasks": [
                    {"id": "a", "requirement": "Boil water", "agent": "cook", "model": bad[0]},
                    {"id": "b", "requirement": "Steep", "agent": "cook", "status": "done",
                     "output": bad[2], "depends_on": ["a"]}]})
            return json.dumps(plan())
        if system.startswith("You are the global updater"):
            return json.dumps({"rationale": text, "action": "update", "subtasks": [
                {"id": bad[5], "requirement": f"Serve the green tea {bad[6]}", "agent": bad[7],
                 "depends_on": [bad[3]]}]})
        # a node, the judge or the write-up: hostile text and a deliverable of a hostile name
        return (f"Green tea notes. {text}\n\n```text {bad[1]}.txt\n{text}\n```\n"
                f"```python {bad[0]}.py\nprint(1)\n```\n")
    return respond


@pytest.fixture
def served(monkeypatch):
    def serve(responder):
        server = LoopbackServer(responder=responder).start()
        servers.append(server)
        monkeypatch.setenv("FLOWMAGIC_BASE_URL", server.base_url)   # the kernel inherits it
        monkeypatch.setenv("FLOWMAGIC_MODEL", "m")
        return server
    servers = []
    yield serve
    for server in servers:
        server.stop()


def execute(nb, cwd):
    client = NotebookClient(nb, timeout=120, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(cwd)}})
    client.execute()
    return nb


def errors(nb):
    """(cell, error name, message) of every failed cell; IPython shows a UsageError (the
    one-line refusal of a magic) as a line on stderr."""
    out = []
    for i, cell in enumerate(nb.cells):
        for o in cell.get("outputs", []) if cell.cell_type == "code" else []:
            if o.output_type == "error":
                out.append((i, o.get("ename"), o.get("evalue")))
            elif o.output_type == "stream" and o.text.startswith("UsageError: "):
                out.append((i, "UsageError", o.text.removeprefix("UsageError: ").strip()))
    return out


def test_every_model_written_field_through_run_export_and_replay(served, tmp_path):
    marker = tmp_path / "PWNED"
    served(hostile_responder(marker))
    llm = fast_llm()
    flow = run(lambda: flowmagic.aplan("Write a short guide to green tea", k=2, llm=llm,
                                       name="tea", plan_method="oneshot", update="after-completion",
                                       max_updates=1, max_tokens=200), llm)
    refused = flow.candidates[0]
    assert "holds '{'" in refused.error and "this answer was refused" in refused.error
    assert flow.chosen == 1
    run(flow.arun, llm)
    assert flow.update_log and flow.update_log[0]["rationale"].startswith("{__import__")
    for node_id, node in flow.workflow.nodes.items():
        assert re.fullmatch(r"[a-z0-9_]{1,40}", node_id) and re.fullmatch(r"[a-z0-9_]{1,40}", node.agent)
        assert node.model is None
    nb_path = export(flow, tmp_path / "tea.ipynb")
    nb = nbformat.read(nb_path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            first = cell.source.splitlines()[0]
            assert "{" not in first and "$" not in first and "'" not in first
            for line in cell.source.splitlines():
                if line.startswith("#"):
                    assert line.isascii() and line.isprintable()
    done = execute(nb, tmp_path)
    assert not marker.exists()
    assert errors(done) == []
    result = next(c for c in done.cells if c.source.startswith("show_result"))
    text = result.outputs[0].data["text/plain"]
    assert text.startswith("Result\n\nGreen tea notes.") and "stale" not in text


def test_a_hostile_model_on_a_stored_node_is_refused_at_export(served, tmp_path):
    """A run stored before the gate (or a plan the user wrote) may hold anything: the export
    refuses to write it on a magic line, in one line, instead of writing code."""
    marker = tmp_path / "PWNED"
    served(hostile_responder(marker))
    for bad in payloads(marker):
        flow = Flow.from_dict({"nodes": [{"id": "a", "requirement": "Boil water", "model": bad}]},
                              task="tea", name="tea", save=False)
        with pytest.raises(ConfigError) as err:
            build(flow)
        assert "on a notebook's magic line" in str(err.value) and "\n" not in str(err.value)


# the payloads that end a line (one notebook each: one that fails to compile stops the rest;
# a NUL stops any cell from compiling, so comment() is tested with it below)
LINE_BREAKS = [2, 3, 4, 5, 9, 10]


@pytest.mark.parametrize("which", LINE_BREAKS)
def test_the_config_cells_comments_cannot_be_broken_out_of(served, tmp_path, which):
    """An endpoint's model name (a local server's, found by discovery, is not the user's)
    is written in a comment of the configuration cell."""
    marker = tmp_path / "PWNED"
    server = served(lambda body: "Tea is steeped at 80 C.")
    flow = Flow.from_dict({"nodes": [{"id": "a", "requirement": "Boil water"}]}, task="tea",
                          name="tea")
    run(flow.arun, flow.llm)
    flowmagic.configure(name="other", base_url=server.base_url, model=payloads(marker)[which])
    nb = build(flow)
    config = nb.cells[1].source
    done = execute(nb, tmp_path)
    assert not marker.exists() and errors(done) == []
    assert config.splitlines()[:2] == ["%load_ext flowmagic",
                                       "from flowmagic.ops.export import show_drawings, show_result"]
    assert all(line.startswith("#") for line in config.splitlines()[2:])
    assert len(config.splitlines()) == len(config.split("\n"))   # no other line break


def test_an_edited_magic_line_is_never_expanded(served, tmp_path):
    """IPython expands {expr} and $var on a magic's line unless the magic opts out."""
    marker = tmp_path / "PWNED"
    served(lambda body: "Tea is steeped at 80 C.")
    flow = Flow.from_dict({"nodes": [{"id": "a", "requirement": "Boil water"}]}, task="tea",
                          name="tea")
    run(flow.arun, flow.llm)
    nb = build(flow)
    code = f"__import__('os').system('touch {marker}')"
    cell = next(c for c in nb.cells if c.source.startswith("%%flow_node"))
    first, _, body = cell.source.partition("\n")
    cell.source = f"{first} --model {{{code}}}\n{body}"
    done = execute(nb, tmp_path)
    assert not marker.exists()
    (_, name, value), *later = errors(done)
    assert name == "UsageError" and "holds '{'" in value and "fix the cell's line" in value
    assert "\n" not in value


def test_an_edited_plan_cell_is_read_as_strictly_as_a_models_plan(served, tmp_path):
    served(lambda body: "Tea is steeped at 80 C.")
    flow = Flow.from_dict({"nodes": [{"id": "a", "requirement": "Boil water"}]}, task="tea",
                          name="tea")
    run(flow.arun, flow.llm)
    nb = build(flow)
    cell = next(c for c in nb.cells if c.source.startswith("%%flow_plan"))
    head, _, body = cell.source.partition("\n")
    plan = json.loads(body)
    plan["nodes"][0].update(status="done", output="forged")
    cell.source = f"{head}\n{json.dumps(plan)}"
    done = execute(nb, tmp_path)
    first = errors(done)[0]
    assert first[1] == "UsageError" and "the %%flow_plan cell: nodes.0.status" in first[2]
    assert "'pruned'" in first[2] and "fix the cell or export the flow again" in first[2]
    plan["nodes"][0].pop("status")
    cell.source = f"{head}\n{json.dumps(plan)}"
    first = errors(execute(nb, tmp_path))[0]
    assert "nodes.0.output: only a run may set it" in first[2]


@pytest.mark.parametrize("value", payloads("/tmp/x") + ["", "a" * 10_000, "\u00e9t\u00e9"])
def test_comments_and_literals_hold_any_value_on_one_line(value):
    line = comment(value)
    assert line.startswith("# ") and line.isascii() and line.isprintable()
    assert len(line.splitlines()) == 1 and json.loads(f'"{line[2:]}"') == value
    lit = literal(value)
    assert lit.isascii() and lit.isprintable() and eval(lit) == value   # noqa: S307 - the point
    with pytest.raises(ConfigError):
        magic_word(value, "a test value")


@pytest.mark.parametrize("value", ["tea", "load_data", "a,b,c", "Qwen/Qwen2.5-7B-Instruct",
                                   "cheap:qwen2.5:3b"])
def test_magic_words_pass_safe_names_unchanged(value):
    assert magic_word(value, "a name") == value


def test_flowmagic_run_task_replays_its_own_export_and_runs_nothing_else(served, tmp_path,
                                                                         capsys):
    """`flowmagic run TASK` executes the notebook it exported, in a kernel, by itself (text
    nodes here, so the model name would stand on their %%flow_node lines)."""
    from flowmagic import cli

    marker = tmp_path / "PWNED"
    served(hostile_responder(marker, same_plan=True))
    out_dir = tmp_path / "out"
    code = cli.main(["run", "Write a short guide to green tea", "--k", "2", "--out",
                     str(out_dir), "--max-tokens", "200", "--set", "execute=off"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert not marker.exists()
    assert "0 model calls" in out.split("replayed")[1]
    (notebook,) = out_dir.glob("*.ipynb")
    for cell in nbformat.read(notebook, as_version=4).cells:
        first = cell.source.splitlines()[0] if cell.cell_type == "code" else ""
        assert not (first.startswith("%%") and set(first) & set("{}$'\"()"))


def test_an_edited_records_files_folder_never_leaves_the_notebooks_folder(tmp_path, monkeypatch):
    """`--execute` runs a code cell in the sandbox in the record's files folder, which an
    edit (with its signature computed again) could point anywhere the user can write."""
    from flowmagic.ops.replay import record_signature

    code = "open('planted.txt', 'w').write('x')\nprint('ran')"
    with LoopbackServer(responder=lambda body: f"```python\n{code}\n```") as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        flow = Flow.from_dict({"nodes": [{"id": "a", "requirement": "Write a file"}]},
                              task="tea", name="tea")
        flow.run()
    nb_dir, outside = tmp_path / "nb", tmp_path / "outside"
    nb_dir.mkdir(), outside.mkdir()
    nb = build(flow, files_dir="tea_files")
    (nb_dir / "tea_files").mkdir()
    cell = next(c for c in nb.cells if c.source.startswith("%%flow_record"))
    head, _, body = cell.source.partition("\n")
    record = json.loads(body)
    record["files_dir"] = "../outside"
    record["signature"] = record_signature(record)
    cell.source = f"{head}\n{json.dumps(record)}"
    monkeypatch.setenv("FLOWMAGIC_EXECUTE_CODE", "1")
    done = execute(nb, nb_dir)
    assert not (outside / "planted.txt").exists()
    (_, name, value), *_ = errors(done)
    assert name == "UsageError" and "'../outside' is not a folder name next to the notebook" in value
