"""Platforms said up front: where model-written code cannot run, %%flow says so in one line
before any paid call and text-only flows still finish; flowmagic imports and loads where `pwd`
and `grp` do not exist (native Windows); a missing extra is one line naming it."""

import json
import os
import shutil
import subprocess
import sys

import pytest

import flowmagic
from flowmagic.engine.sandbox import sandbox_status
from flowmagic.testing.loopback import LoopbackServer

from conftest import ROOT, ipython_shell

PLAN = {"subtasks": [
    {"id": "leaves", "requirement": "Pick the green tea leaves.", "agent": "writer", "depends_on": []},
    {"id": "steep", "requirement": "Steep the green tea.", "agent": "writer", "depends_on": ["leaves"]}]}

HIDE = "import sys; sys.modules['pwd'] = None; sys.modules['grp'] = None\n"


def test_flowmagic_imports_and_loads_where_pwd_and_grp_do_not_exist():
    code = HIDE + (
        "import flowmagic, flowmagic.flow, flowmagic.engine.sandbox, flowmagic.engine.bwrap\n"
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "from traitlets.config import Config\n"
        "c = Config(); c.HistoryManager.hist_file = ':memory:'\n"
        "ip = InteractiveShell.instance(config=c)\n"
        "ip.run_line_magic('load_ext', 'flowmagic')\n"
        "import flowmagic.jupyter.magics\n"
        "print('loaded', 'flow' in ip.magics_manager.magics['cell'])\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT / "tests", timeout=120)
    assert done.returncode == 0, done.stderr[-1500:]
    assert done.stdout.split() == ["loaded", "True"]


@pytest.fixture
def no_bwrap(tmp_path, monkeypatch):
    """A PATH without bubblewrap (graphviz's dot kept, to draw the plan)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if shutil.which("dot"):
        os.symlink(shutil.which("dot"), bin_dir / "dot")
    monkeypatch.setenv("PATH", str(bin_dir))
    sandbox_status(refresh=True)
    yield
    monkeypatch.undo()
    sandbox_status(refresh=True)


def test_flow_says_in_one_line_before_any_call_where_code_cannot_run(no_bwrap, tmp_path,
                                                                      monkeypatch, capsys):
    said_before = []

    def responder(body):
        said_before.append("cannot run here" in capsys.readouterr().err)
        if body.get("response_format"):
            return json.dumps(PLAN)
        return "Green tea is steeped at 80 C."

    monkeypatch.chdir(tmp_path)
    with LoopbackServer(responder=responder) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        with ipython_shell() as ip:
            result = ip.run_cell("%%flow tea --k 1 --run\nWrite a short guide to green tea")
            assert result.success
            flow = ip.user_ns["tea"]
    assert said_before and said_before[0] is True, "the line came after a model call"
    assert flow.status == "done"   # text-only nodes still run


def test_the_line_names_what_to_do(no_bwrap):
    status = sandbox_status()
    assert not status.available and "install" in status.reason and "bubblewrap" in status.reason


def test_a_missing_extra_is_one_line_naming_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "distributed", None)   # dask's distributed not installed
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rows.csv").write_text("input\nx\n")
    with LoopbackServer(responder=lambda body: json.dumps(PLAN) if body.get("response_format")
                        else "ok") as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        with ipython_shell() as ip:
            assert ip.run_cell("%%flow tea --k 1\nWrite a short guide to green tea").success
            capsys.readouterr()
            ip.run_cell("%flow map tea rows.csv")
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert lines == ['UsageError: flowmagic: map on Dask needs distributed, which is not '
                     'installed: pip install "flowmagic[dask]" (or pip install distributed)']
