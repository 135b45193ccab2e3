"""Issue 28 finding 5: the user's data is never lost. Inputs are read-only to model code and
to deliverables; with `workdir=` the code writes only in a run folder inside it (unless
`workdir_writes="all"`), modes come back as they were, nothing executable or importable is
left where Python or git would pick it up. Played as the user running the tests (root on CI)
and, as root, again as an unprivileged user (tests/workspace_attacks.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from conftest import ROOT

sys.path.insert(0, os.path.dirname(__file__))
import workspace_attacks  # noqa: E402

pytestmark = pytest.mark.timeout(300)
USERS = ["current"] + (["unprivileged"] if os.geteuid() == 0 else [])
SCRIPT = os.path.join(os.path.dirname(__file__), "workspace_attacks.py")


def _play(name: str, user: str, tmp_path) -> dict:
    if user == "current":
        return getattr(workspace_attacks, name)(str(tmp_path))
    where = tempfile.mkdtemp(prefix="flowmagic-attack-")   # tmp_path is 0700: not theirs
    try:
        os.chmod(where, 0o777)
        site = [p for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages")]
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": where,
               "PYTHONPATH": os.pathsep.join([str(ROOT), *site])}
        version = f"{sys.version_info[0]}.{sys.version_info[1]}"
        python = shutil.which(f"python{version}", path="/usr/bin:/usr/local/bin")
        if python is None:
            pytest.fail(f"no python{version} in /usr/bin or /usr/local/bin for the unprivileged user")
        argv = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--",
                python, SCRIPT, name, where]
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=240, cwd="/")
        line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
        assert line, f"{name} as nobody died:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
        return json.loads(line[len("RESULT "):])
    finally:
        subprocess.run(["rm", "-rf", where], check=False)


@pytest.mark.parametrize("user", USERS)
def test_the_inputs_copy_is_read_only_and_a_deliverable_never_replaces_it(user, tmp_path):
    seen = _play("default_workspace", user, tmp_path)
    assert seen["copy"] == workspace_attacks.DATA            # not CORRUPTED, not gone
    assert seen["copy_mode"] == "0o644"
    assert seen["child_saw"].strip() == workspace_attacks.DATA.strip()   # the child read the input
    assert seen["saved"] == ["data-2.csv"] and seen["deliverable"] == "DELIVERABLE\n"
    assert "data.csv is an input or a file that was already there, so it was saved as data-2.csv" \
        in seen["said"]


@pytest.mark.parametrize("user", USERS)
def test_with_a_workdir_the_code_writes_only_its_run_folder(user, tmp_path):
    seen = _play("workdir_run", user, tmp_path)
    assert seen["status"] == "done"
    assert seen["data"] == workspace_attacks.DATA            # the user's original
    assert seen["listing"] == ["data.csv", "flowmagic-runs", "notes.txt", "other.txt"]
    assert seen["notes_mode"] == "0o600" and seen["other"] == "keep"
    assert seen["run_folder"].startswith("flowmagic-runs/")
    assert seen["run_files"] == ["data.csv", "out.csv", "run.sh"]   # (the input's copy)
    assert seen["run_sh_mode"] == "0o644"                    # nothing left ready to run
    assert seen["child_saw"].strip() == workspace_attacks.DATA.strip()


def test_workdir_writes_all_puts_modes_back_and_keeps_git_and_the_users_files(tmp_path):
    """The opt-in: the code may write anywhere in the workdir, but the inputs and `.git` stay
    read-only, the modes it changed come back, a .git it makes is deleted, and an input or a
    deliverable never replaces a file the user had."""
    import flowmagic
    from flowmagic.flow import Flow
    from flowmagic.testing.loopback import LoopbackServer

    work = tmp_path / "project"
    (work / ".git" / "hooks").mkdir(parents=True)
    (work / "notes.txt").write_text("private")
    os.chmod(work / "notes.txt", 0o600)
    (work / "report.md").write_text("the user's report")
    elsewhere = tmp_path / "elsewhere" / "notes.txt"
    elsewhere.parent.mkdir()
    elsewhere.write_text("x,y\n1,2\n")
    code = ("import os\nfor step in (lambda: os.chmod('notes.txt', 0o666),\n"
            "             lambda: open('.git/hooks/post-checkout', 'w').write('#!/bin/sh'),\n"
            "             lambda: open('made.sh', 'w').write('#!/bin/sh'),\n"
            "             lambda: os.chmod('made.sh', 0o755)):\n"
            "    try:\n        step()\n    except OSError as exc:\n        print(type(exc).__name__)\n")
    answer = f"```python\n{code}```\n```markdown report.md\nMODEL REPORT\n```\n"
    with LoopbackServer(responder=lambda body: answer) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        flow = Flow.from_dict({"task": "t", "nodes": [{"id": "a", "requirement": "Analyse.",
                                                       "agent": "x"}], "edges": []},
                              name="all", update="off", max_attempts=1, starter="off",
                              workdir=str(work), workdir_writes="all")
        flow.add_inputs([elsewhere])
        flow.run()
    node = flow.workflow.nodes["a"]
    assert node.status == "done", node.error
    assert oct(os.stat(work / "notes.txt").st_mode & 0o777) == "0o600"
    assert (work / "notes.txt").read_text() == "private"
    assert not (work / ".git" / "hooks" / "post-checkout").exists()
    assert os.stat(work / "made.sh").st_mode & 0o111 == 0
    assert (work / "report.md").read_text() == "the user's report"
    assert node.execution["saved"] == ["report-2.md"]
    assert [i.path for i in flow.workspace.inputs] == ["notes-2.txt"]   # not over notes.txt
