"""Reliability against bad input and unbounded work (issue 19, items 2 and 3).

Through the doors a user has (the `flowmagic` command, the `%%flow` magic, the Python API):
paths that cannot be written, absurd `log -n`, lone surrogates in a task or a requirement,
a `--k` that would send a thousand paid planning calls, and plans too big to print. Each ends
in one `flowmagic:` line before any model call, or works; never a traceback.
"""

from __future__ import annotations

import json

import pytest

import flowmagic
from flowmagic import cli
from flowmagic.errors import ConfigError
from flowmagic.flow import Flow
from flowmagic.testing.loopback import LoopbackServer

from conftest import fast_llm, ipython_shell

pytestmark = pytest.mark.timeout(120)

PLAN = {"subtasks": [
    {"id": "leaves", "requirement": "Pick the leaves.", "agent": "researcher", "depends_on": []},
    {"id": "guide", "requirement": "Write the guide.", "agent": "writer",
     "depends_on": ["leaves"]}]}


def responder(body):
    return json.dumps(PLAN) if body.get("response_format") else "Done."


@pytest.fixture
def server(monkeypatch):
    with LoopbackServer(responder=responder) as srv:
        monkeypatch.setenv("FLOWMAGIC_BASE_URL", srv.base_url)
        monkeypatch.setenv("FLOWMAGIC_MODEL", "m")
        yield srv


def fm(capsys, *argv) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("flowmagic: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# ------------------------------------------------------------------------------ paths
@pytest.fixture
def blocker(tmp_path):
    """A file where a folder should be: no user, root included, can write below it."""
    path = tmp_path / "a-file"
    path.write_text("not a folder")
    return path


@pytest.mark.parametrize("argv", [
    ("plan", "make tea", "--svg", "{blocker}/tea.svg"),
    ("plan", "make tea", "--svg", "{folder}"),
    ("run", "make tea", "--out", "{blocker}/out"),
])
def test_an_unwritable_output_path_is_one_line_before_any_call(argv, server, blocker, tmp_path,
                                                               capsys):
    argv = [a.format(blocker=blocker, folder=tmp_path) for a in argv]
    code, _, err = fm(capsys, *argv)
    assert code == 1 and "cannot write" in one_line(err)
    assert server.stats()["calls"] == 0   # said before paying for a plan


def test_new_and_export_to_an_unwritable_path_are_one_line(server, blocker, capsys):
    code, _, err = fm(capsys, "new", "gobang", blocker / "g.ipynb")
    assert code == 1 and "cannot write" in one_line(err)
    assert fm(capsys, "plan", "make tea", "--k", "1", "--name", "tea")[0] == 0
    code, _, err = fm(capsys, "export", "tea", blocker / "tea.ipynb")
    assert code == 1 and "cannot write" in one_line(err)


@pytest.mark.parametrize("n", ["0", "-1", "-99999999999999999999999"])
def test_log_n_that_is_not_a_count_is_one_line(n, capsys):
    code, _, err = fm(capsys, "log", "-n", n)
    assert code == 1 and "-n" in one_line(err)


def test_a_huge_log_n_shows_what_there_is(capsys):
    code, out, err = fm(capsys, "log", "-n", str(10**30))
    assert code == 0 and "no model calls" in out and not err


# ------------------------------------------------------------------------------ surrogates
def test_a_lone_surrogate_in_a_task_or_requirement_does_not_crash(server, capsys):
    code, out, err = fm(capsys, "plan", "make tea \ud800 now", "--k", "1")
    assert code == 0, err
    flowmagic.configure(base_url=server.base_url, model="m")
    wf = {"nodes": [{"id": "a", "requirement": "half a pair: \udc00 here", "agent": "w"}],
          "edges": []}
    flow = Flow.from_dict(wf, task="bad \ud83d", llm=fast_llm(), consolidate=False).run()
    assert flow.counts() == {"done": 1}


# ------------------------------------------------------------------------------ --k
@pytest.mark.parametrize("k", ["11", "1000", "100000000"])
def test_k_above_the_limit_needs_an_explicit_flag(k, server, capsys):
    code, _, err = fm(capsys, "plan", "make tea", "--k", k)
    line = one_line(err)
    assert code == 1 and "max-k" in line and f"{int(k):d} paid" in line
    assert server.stats()["calls"] == 0
    with pytest.raises(ConfigError, match="max_k"):
        flowmagic.plan("make tea", k=int(k))


def test_k_above_ten_with_the_flag_plans_that_many(server, capsys):
    code, out, err = fm(capsys, "plan", "make tea", "--k", "12", "--max-k", "12")
    assert code == 0, err
    assert server.stats()["calls"] == 12
    code, _, err = fm(capsys, "plan", "make tea", "--k", "2000", "--max-k", "2000")
    assert code == 1 and "1000" in one_line(err)


def test_the_magic_asks_for_the_flag_too(server, capsys):
    with ipython_shell() as ip:
        result = ip.run_cell("%%flow tea --k 1000\nmake tea")
        assert "tea" not in ip.user_ns and result.error_in_exec is not None
    err = capsys.readouterr().err
    assert err.startswith("UsageError: flowmagic: ") and "max-k" in err and err.count("\n") == 1
    assert server.stats()["calls"] == 0


# ------------------------------------------------------------------------------ big plans
def test_a_huge_plan_prints_a_bounded_summary():
    from flowmagic.cli.report import describe as cli_describe
    from flowmagic.view.display import describe

    n = 3000
    nodes = [{"id": f"t{i}", "requirement": f"do part {i}", "agent": "writer"} for i in range(n)]
    edges = [[f"t{i}", f"t{i + 1}"] for i in range(n - 1)]
    flow = Flow.from_dict({"nodes": nodes, "edges": edges}, task="t", save=False)
    for text in (cli_describe(flow), describe(flow)):
        lines = text.splitlines()
        assert len(lines) < 70
        assert f"and {n - 60:,} more subtasks" in text
        assert "t1 [writer" in text and "after t0" in text
