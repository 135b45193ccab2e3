"""Issue 13's attacks fail: through `run_code` and through a real Flow, as root and as a user.

tests/sandbox_attacks.py holds the attacks and the host-side checks; it runs in a process of
its own that plays the user's kernel (a key in its environment, another in its memory,
planted secrets in its home). It runs once as the user running the tests (root on CI) and,
when that is root, once more as an unprivileged user (`tester` through runuser, else
`nobody` through setpriv), because bubblewrap isolates those two differently (see
flowmagic/engine/bwrap.py). Every attack, written to get through the sandbox that came
before bubblewrap, did get through it as root or as the user (all but "endless output",
which needs root with CAP_SYS_RESOURCE to lift the file-size limit).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile

import pytest

from conftest import ROOT

sys.path.insert(0, os.path.dirname(__file__))
import sandbox_attacks  # noqa: E402

pytestmark = pytest.mark.timeout(400)

SCRIPT = os.path.join(os.path.dirname(__file__), "sandbox_attacks.py")
USERS = ["current"] + (["unprivileged"] if os.geteuid() == 0 else [])


def _unprivileged_prefix() -> list[str]:
    try:
        pwd.getpwnam("tester")
        if shutil.which("runuser"):
            return ["runuser", "-u", "tester", "--"]
    except KeyError:
        pass
    return ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"]


def _unprivileged_python(prefix: list[str], env: dict) -> str | None:
    """An interpreter the unprivileged user can run that imports flowmagic from this
    checkout (ours may live under /root, which that user cannot enter)."""
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    for python in (sys.executable, f"/usr/bin/python{version}", f"/usr/local/bin/python{version}"):
        probe = subprocess.run([*prefix, python, "-c", "import flowmagic.engine.sandbox, openai"],
                               env=env, capture_output=True, cwd="/")
        if probe.returncode == 0:
            return python
    return None


def _run_script(user: str, mode: str, out_dir: str) -> dict:
    out = os.path.join(out_dir, f"{user}-{mode}.json")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLOWMAGIC_", "OPENAI_"))}
    if user == "current":
        argv = [sys.executable, SCRIPT, mode, out]
    else:
        prefix = _unprivileged_prefix()
        site = [p for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages")]
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *site])
        python = _unprivileged_python(prefix, env)
        if python is None:
            pytest.fail(f"no interpreter the unprivileged user ({' '.join(prefix)}) can run "
                        f"imports flowmagic from {ROOT}: is the checkout readable by others?")
        argv = [*prefix, python, SCRIPT, mode, out]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=360, cwd="/")
    assert proc.returncode == 0 and os.path.exists(out), (
        f"the attack script ({user}, {mode}) died: the kernel it plays was killed?\n"
        f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    with open(out) as fh:
        return json.load(fh)


@pytest.fixture(scope="module")
def reports():
    """Each (user, mode) report, made on first use."""
    out_dir = tempfile.mkdtemp(prefix="fm-attack-reports-")
    os.chmod(out_dir, 0o777)   # the unprivileged user writes its report here
    made: dict = {}

    def get(user: str, mode: str) -> dict:
        if (user, mode) not in made:
            made[user, mode] = _run_script(user, mode, out_dir)
        return made[user, mode]

    yield get
    shutil.rmtree(out_dir, ignore_errors=True)


@pytest.mark.parametrize("user", USERS)
@pytest.mark.parametrize("attack", list(sandbox_attacks.ATTACKS))
def test_attack_fails_through_run_code(reports, user, attack):
    report = reports(user, "run_code")
    if user == "unprivileged":
        assert report["uid"] != 0
    got = report["attacks"][attack]
    assert got["escapes"] == [], got
    assert not got["ok"], got   # the code was stopped (or fenced) before it could finish
    assert got["duration_s"] < sandbox_attacks.TIMEOUTS.get(attack, 5.0) + 5, got
    if attack == "fork bomb":   # the process limit held, not only the timeout
        assert "Resource temporarily unavailable" in got["stopped_by"], got
    if attack == "memory bomb":
        assert "No space left on device" in got["stopped_by"], got
    if attack == "endless output":
        assert got["stdout_chars"] < 25_000, got
    if attack == "setsid child outlives the timeout":
        assert got["stage"] == "timeout", got


@pytest.mark.parametrize("user", USERS)
def test_attacks_fail_through_a_flow(reports, user):
    """Each attack is a node's code, run as the node's work (execute='auto'; validate='llm'
    with a judge that passes everything): each node fails with one line, the kernel lives, nothing is written outside the workspace
    and no key reaches the store, the flow's state or a request to the endpoint."""
    report = reports(user, "flow")
    assert report["attacks"]["escapes"] == [], report["attacks"]["escapes"]
    nodes = report["attacks"]["nodes"]
    assert set(nodes) == set(sandbox_attacks.ATTACKS)
    for name, node in nodes.items():
        assert node["status"] == "failed", (name, node)
        assert node["error"] and "\n" not in node["error"], (name, node)
    assert report["attacks"]["requests"] >= len(nodes)   # each node's answer was asked for
