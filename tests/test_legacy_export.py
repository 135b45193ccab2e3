"""A notebook exported by flowmagic at 58fa120 (before the layer subpackages) still replays.

The fixture was written by `Flow.to_notebook` over a loopback server; its first cell imports
`flowmagic.notebook`, which must keep working for notebooks users already shared.
"""

import shutil

import nbformat
from nbclient import NotebookClient

import flowmagic
from flowmagic.view.safe import model_bundle

from conftest import DATA

FIXTURE = DATA / "export_58fa120" / "tea.ipynb"


def plain(cell):
    """Output types, stream text and plain text."""
    return [(o["output_type"], o.get("text"), o.get("data", {}).get("text/plain"))
            for o in cell.get("outputs", [])]


def test_a_notebook_exported_before_the_move_replays_with_zero_calls(tmp_path, flowmagic_home):
    path = tmp_path / "tea.ipynb"
    shutil.copy(FIXTURE, path)
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    recorded = nbformat.read(FIXTURE, as_version=4)
    codes = [(ran, ref) for ran, ref in zip(nb.cells, recorded.cells) if ref.cell_type == "code"]
    for ran, _ in codes:
        assert not any(o["output_type"] == "error" or o.get("name") == "stderr"
                       for o in ran.outputs), ran.outputs
    for ran, ref in codes[3:]:   # node cells and the result: the same text as when exported,
        # shown now as sanitized HTML where it was Markdown (model text is never trusted markup)
        assert plain(ran) == plain(ref), ref.source[:60]
        for out, old in zip(ran.outputs, ref.outputs):
            if "text/markdown" in old.get("data", {}):
                assert "text/markdown" not in out.data and "text/html" in out.data
    for ran, ref in codes[3:7]:
        assert ran.outputs[0].data == model_bundle(ref.outputs[0].data["text/markdown"])
    replayed = [c.outputs[0].metadata["flowmagic"]["replayed"] for c, _ in codes[3:7]]
    assert replayed == [True] * 4
    assert flowmagic.Store(flowmagic_home / "flowmagic.db").count_calls() == 0
