"""Issue 28 findings 6, 7 and 8 through a real Flow on a loopback model: a bad file name fails
its node, not the run, and a python block with a refused name never runs; a folder swapped
for a link while another node saves fails that node only and makes nothing outside; figures
are capped per node and per notebook with one line; endless output ends with one clear line;
an input's file is never read by a prompt (a FIFO there hangs nothing)."""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time

import nbformat
import pytest

import flowmagic
from flowmagic.flow import Flow
from flowmagic.ops.export import export
from flowmagic.testing.loopback import LoopbackServer

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(autouse=True)
def _deep_trees_removed(tmp_path):
    """pytest's own clean-up of old tmp folders recurses once a level: no deep tree is left."""
    yield
    subprocess.run(["rm", "-rf", str(tmp_path)], check=False)


def _run(answers: dict, *, edges=(), delays: dict | None = None, **settings) -> Flow:
    plan = {"task": "t", "nodes": [{"id": n, "requirement": f"Do {n}.", "agent": "a"}
                                   for n in answers], "edges": [list(e) for e in edges]}

    def answer(body):
        text = "\n".join(m["content"] for m in body["messages"])
        node = (re.search(r"Your subtask \((\w+)\)", text) or [None, None])[1]
        time.sleep((delays or {}).get(node, 0))
        return answers.get(node, "done")

    with LoopbackServer(responder=answer) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        flow = Flow.from_dict(plan, name="limits", update="off", max_attempts=1,
                              starter="off", **settings)
        flow.run()
    return flow


def test_a_bad_name_fails_its_node_and_a_refused_python_block_never_runs(tmp_path):
    """Finding 8: a part over 255 bytes (OSError) or 2,000 levels (RecursionError) escaped and
    cancelled the bystanders; ```python ../../evil.py ran as code."""
    deep = "/".join(["d"] * 2000) + "/x.txt"
    flow = _run({"long": f"```text {'n' * 300}.txt\nhello\n```",
                 "deep": f"```text {deep}\nhello\n```",
                 "evil": "```python ../../evil.py\nopen('ran.txt', 'w').write('ran')\n```",
                 "bystander": "```python\nprint('still here')\n```"})
    nodes = flow.workflow.nodes
    assert nodes["bystander"].status == "done"
    assert nodes["bystander"].execution["stdout"] == "still here\n"
    for name, why in (("long", "over 255 bytes"), ("deep", "levels deep"),
                      ("evil", "leaves the workspace")):
        assert nodes[name].status == "failed", name
        assert why in nodes[name].error and "\n" not in nodes[name].error
    assert not (flow.workspace.root / "ran.txt").exists()   # the refused block never ran
    assert "ran.txt" not in flow.files()


def test_a_folder_swapped_for_a_link_while_a_node_saves_fails_that_node_only(tmp_path):
    """Finding 6: folders were made outside the workspace and the run aborted."""
    outside = tmp_path / "outside"
    outside.mkdir()
    swap = ("import os, time\nos.makedirs('a', exist_ok=True)\nend = time.time() + 4\n"
            "while time.time() < end:\n    os.rename('a', 'a.real')\n"
            f"    os.symlink({str(outside)!r}, 'a')\n    time.sleep(0.001)\n"
            "    os.unlink('a')\n    os.rename('a.real', 'a')\n    time.sleep(0.001)\n"
            "print('swapped')")
    deliver = "".join(f"```text a/b{i}/c/d{i}.txt\n{i}\n```\n" for i in range(400))
    flow = _run({"swapper": f"```python\n{swap}\n```", "saver": deliver,
                 "bystander": "```python\nprint('fine')\n```"}, delays={"saver": 2.0},
                concurrency=3)
    nodes = flow.workflow.nodes
    assert list(outside.iterdir()) == []
    assert nodes["swapper"].status == "done", nodes["swapper"].error
    assert nodes["bystander"].status == "done"
    saver = nodes["saver"]
    assert saver.status in ("done", "failed")   # failed when it met the swap, in one line
    if saver.status == "failed":   # the link, or the folder gone between rename and symlink
        said = ("symlink" in saver.error or "No such file or directory" in saver.error)
        assert said and "\n" not in saver.error, saver.error


def test_figures_are_capped_per_node_with_one_line(tmp_path):
    """Finding 7: ten 60 MB PNGs made a 1.7 GB notebook (here ten of 9 MB, over the 8 MB a
    figure), and no count was kept (here 25 small ones, over the 20 a node)."""
    png = b"\x89PNG\r\n\x1a\n"
    big = ("for i in range(10):\n"
           f"    open(f'big_{{i}}.png', 'wb').write({png!r} + bytes(9 << 20))\nprint('big')")
    many = ("for i in range(25):\n"
            f"    open(f'small_{{i:02}}.png', 'wb').write({png!r} + bytes(100))\nprint('many')")
    flow = _run({"big": f"```python\n{big}\n```", "many": f"```python\n{many}\n```"},
                edges=[("big", "many")])
    nodes = flow.workflow.nodes
    assert nodes["big"].execution["figures"] == [f"big_{i}.png" for i in range(10)]
    path = export(flow, tmp_path / "out" / "figures.ipynb")
    assert path.stat().st_size < 2 << 20   # no 9 MB figure in it
    nb = nbformat.read(str(path), as_version=4)
    cells = {c.metadata["flowmagic"]["node"]: c for c in nb.cells   # (the prelude has no node)
             if c.cell_type == "code" and "node" in c.metadata.get("flowmagic", {})}
    images = [o for o in cells["many"].outputs if "image/png" in o.get("data", {})]
    assert len(images) == 20
    lines = [o["data"]["text/plain"] for c in cells.values() for o in c.outputs
             if o.get("data", {}).get("text/plain", "").startswith("flowmagic: ")]
    assert len(lines) == 2
    assert lines[0].startswith("flowmagic: 10 figure(s) not shown here (big_0.png")
    assert "5 figure(s) not shown here (small_20.png" in lines[1]
    from flowmagic.jupyter.widgets import Panel
    shown = Panel(flow)._figures(nodes["big"])
    assert [o["data"]["text/plain"][:33] for o in shown] == ["flowmagic: 10 figure(s) not shown"]


def test_endless_output_ends_the_node_with_an_output_over_line(tmp_path):
    """Finding 7: the node's error line was 'zzzz...'."""
    flow = _run({"loud": "```python\nimport sys\nwhile True:\n    sys.stderr.write('z' * 65536)\n```",
                 "bystander": "```python\nprint('fine')\n```"})
    loud = flow.workflow.nodes["loud"]
    assert loud.status == "failed"
    assert "output over 67,108,864 bytes" in loud.error and "zzz" not in loud.error
    assert flow.workflow.nodes["bystander"].status == "done"


def test_no_prompt_reads_an_input_so_a_fifo_or_300000_columns_block_nothing(tmp_path):
    """Finding 7: each prompt read the input with pandas on the loop: a FIFO there hung the
    kernel, a 300,000-column CSV blocked it 53 s."""
    from flowmagic.engine.workspace import Workspace

    wide = tmp_path / "wide.csv"
    wide.write_text(",".join(f"c{i}" for i in range(300_000)) + "\n"
                    + ",".join("1" for _ in range(300_000)) + "\n")
    ws = Workspace(tmp_path / "ws")
    ws.add([wide])
    said = ws.describe()
    assert "1 rows x 300000 columns" in said and "... and 299940 more columns" in said
    assert len(said) < 20_000
    os.unlink(ws.root / "wide.csv")
    os.mkfifo(ws.root / "wide.csv")   # what code could leave there, were it not read-only
    done = threading.Event()

    def prompt():
        ws._example = None   # as a new session would: nothing cached in memory
        ws.example(), ws.describe(), ws.columns()
        done.set()

    thread = threading.Thread(target=prompt, daemon=True)
    thread.start()
    finished = done.wait(20)
    if not finished:   # free the reader the old code left blocked on the FIFO
        os.close(os.open(ws.root / "wide.csv", os.O_WRONLY | os.O_NONBLOCK))
    assert finished


def test_long_cells_are_cut_in_the_description_every_prompt_carries(tmp_path):
    """Five rows of a table of news articles (a whole article per cell) made a 32 KB
    description, 8,500 tokens in every call of a flow."""
    from flowmagic.engine.workspace import Workspace

    articles = tmp_path / "articles.csv"
    body = "word " * 2000
    articles.write_text("title,text,neg\n" + "".join(f"t{i},{body}{i},0.{i}\n" for i in range(6)))
    ws = Workspace(tmp_path / "ws")
    ws.add([articles])
    said = ws.describe()
    assert "6 rows x 3 columns" in said and "  - text: str" in said
    assert "word word" in said and "..." in said
    assert len(said) < 2_000, len(said)


@pytest.mark.parametrize("end", ["\r", "\r\n", "\n"])
def test_a_table_whose_lines_end_with_a_lone_carriage_return_is_a_table(tmp_path, end):
    """2 of dabench-dev's 26 tables end their lines with \\r alone (a Mac's Excel): read as one
    line, such a table was described as a file pandas could not read, the session held no
    DataFrame for it, and every subtask's code had to load it itself."""
    from flowmagic.engine.workspace import Workspace

    table = tmp_path / "old_mac.csv"
    table.write_bytes(end.join(["year,gdp", "1952,779.4", "1957,820.9", "1962,853.1"]).encode()
                      + end.encode())
    ws = Workspace(tmp_path / "ws")
    ws.add([table])
    said = ws.describe()
    assert "old_mac.csv (table): 3 rows x 2 columns" in said and "  - gdp: float64" in said
    assert ws.columns() == {"old_mac.csv": ["year", "gdp"]}
    assert "df.plot.scatter(x='year', y='gdp')" in ws.example()


@pytest.mark.parametrize("rows", [3, 2500])   # within the rows read for dtypes, and past them
def test_a_table_whose_values_hold_line_breaks_is_told_by_its_rows_not_its_lines(tmp_path, rows):
    """q209's news table has 691 lines and 166 rows (an article's text holds line breaks):
    every prompt said "691 rows" beside a session DataFrame of 166 rows."""
    import pandas as pd

    from flowmagic.engine.workspace import Workspace

    table = tmp_path / "news.csv"
    table.write_text("title,text,neg\n" + "".join(f't{i},"first line\nsecond line\nthird",0.{i}\n'
                                                  for i in range(rows)))
    assert len(pd.read_csv(table)) == rows
    ws = Workspace(tmp_path / "ws")
    ws.add([table])
    assert f"news.csv (table): {rows} rows x 3 columns" in ws.describe()
