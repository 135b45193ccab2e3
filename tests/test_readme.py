"""The README's notebook steps, as written, in a real Jupyter kernel against a loopback model:
every ```python block the README marks `<!-- run in a kernel -->` is one cell, in order, so
the README cannot drift from what runs. The blocking calls (`flowmagic.plan`) wait in a cell
as `%%flow` does, and `flow.run()` returns at once with the run going on in the kernel."""

import json
import re
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from flowmagic.testing.loopback import LoopbackServer

ROOT = Path(__file__).resolve().parent.parent
MARK = "<!-- run in a kernel -->"


def readme_cells() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return re.findall(re.escape(MARK) + r"\n```python\n(.*?)\n```", text, flags=re.S)


def website_planner(body):
    """Plans for the tour's task; every other call gets a short text."""
    system = body["messages"][0]["content"]
    if system.startswith("You plan work"):
        sub = lambda id, req, deps=(): {"id": id, "requirement": req, "agent": "writer",
                                        "depends_on": list(deps)}
        return json.dumps({"subtasks": [
            sub("schedule", "Write the conference website's schedule page"),
            sub("venue", "Write the conference website's venue page with a map"),
            sub("site", "Join the schedule page and the venue page into the website",
                ["schedule", "venue"])]})
    return "The conference website: a schedule page and a venue page with a map."


def test_the_readme_notebook_steps_run_as_written_in_a_kernel(monkeypatch, tmp_path):
    cells = readme_cells()
    assert cells[0].strip() == "%load_ext flowmagic"
    assert any("flowmagic.plan(" in c for c in cells) and any("flow.run()" in c for c in cells)
    with LoopbackServer(responder=website_planner) as server:
        # the kernel is another process: it finds the model through the environment
        monkeypatch.setenv("FLOWMAGIC_BASE_URL", server.base_url)
        monkeypatch.setenv("FLOWMAGIC_MODEL", "m")
        nb = nbformat.v4.new_notebook()
        nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
        nb.cells.append(nbformat.v4.new_code_cell("print('STATUS', flow.status)"))
        NotebookClient(nb, timeout=120, kernel_name="python3",
                       resources={"metadata": {"path": str(tmp_path)}}).execute()
    text = lambda cell: "".join(o.get("text", "") + json.dumps(o.get("data", {}))
                                for o in cell.outputs)
    run_cell = next(c for c in nb.cells if c.source.strip().startswith("flow.run()"))
    assert not any(o.get("output_type") == "error" for c in nb.cells for o in c.outputs)
    assert "STATUS done" in text(nb.cells[-1])
    result_cell = next(c for c in nb.cells if "flow.result" in c.source)
    assert "conference website" in text(result_cell)
    assert "0/3 done" in text(run_cell)   # run() returned at once, before any node finished
