"""Issue 13's attacks fail: through `run_code` and through a real Flow, as root and as a user.

tests/sandbox_attacks.py holds the attacks and the host-side checks; it runs in a process of
its own that plays the user's kernel (a key in its environment, another in its memory,
planted secrets in its home). It runs once as the user running the tests (root on CI) and,
when that is root, once more as an unprivileged user (`tester` through runuser, else
`nobody` through setpriv), because bubblewrap isolates those two differently (see
flowmagic/engine/bwrap.py). That user gets a venv of its own made from an interpreter it can
execute (ours may live under a 0700 /root, as pyenv's does on Debian). Every attack, written
to get through the sandbox that came before bubblewrap, did get through it as root or as the
user (all but "endless output", which needs root with CAP_SYS_RESOURCE to lift the file-size
limit).
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata

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


def _as_user(prefix: list[str], python: str, code: str) -> subprocess.CompletedProcess:
    """Run `code` as the user in `python` after it has executed itself again, as the attack
    script does: setpriv keeps root's capabilities up to its own exec, so an interpreter
    under a 0700 /root starts once and then cannot execute itself."""
    reexec = f"import os, sys; os.execv(sys.executable, [sys.executable, '-c', {code!r}])"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
    return subprocess.run([*prefix, python, "-c", reexec], env=env, capture_output=True,
                          text=True, cwd="/", timeout=120)


def _runnable_pythons(prefix: list[str]):
    """(interpreter, "3.N") the user can run and re-run: ours, else the system's."""
    ours = "%d.%d" % sys.version_info[:2]
    seen: list[str] = []
    for python in (os.path.realpath(getattr(sys, "_base_executable", sys.executable)),
                   f"/usr/local/bin/python{ours}", f"/usr/bin/python{ours}",
                   "/usr/local/bin/python3", "/usr/bin/python3"):
        real = os.path.realpath(python)
        if real in seen or not os.path.exists(real):
            continue
        seen.append(real)
        probe = _as_user(prefix, real, "import sys; print('%d.%d' % sys.version_info[:2])")
        version = probe.stdout.strip()
        if probe.returncode == 0 and tuple(map(int, version.split("."))) >= (3, 10):
            yield real, version


def _user_venv(prefix: list[str], where: str, bases) -> str:
    """A venv in `where` the user can run, importing the copy of flowmagic in where/src,
    made from the first of `bases` ((interpreter, "3.N")) that works: our site-packages
    serve it when it is our version and that user can read them, else pip installs
    flowmagic's dependencies into it."""
    ours = "%d.%d" % sys.version_info[:2]
    imports = "import flowmagic.engine.sandbox, flowmagic.testing.loopback, openai, cffi"
    tried = []
    for base, version in bases:
        for link_ours in ([True, False] if version == ours else [False]):
            venv = os.path.join(where, f"venv-{version}-{'linked' if link_ours else 'own'}")
            subprocess.run([base, "-m", "venv", "--without-pip", venv], check=True,
                           capture_output=True)
            python = os.path.join(venv, "bin", "python")
            site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig."
                                   "get_paths()['purelib'])"], check=True,
                                  capture_output=True, text=True).stdout.strip()
            paths = [os.path.join(where, "src")] + (_our_site_dirs() if link_ours else [])
            with open(os.path.join(site, "flowmagic-tests.pth"), "w") as fh:
                fh.write("\n".join(paths) + "\n")
            if not link_ours:
                deps = [r for r in metadata.requires("flowmagic") if "extra ==" not in r]
                subprocess.run([sys.executable, "-m", "pip", "--python", python, "install",
                                "--quiet", *deps, "cffi"], check=True, capture_output=True)
            probe = _as_user(prefix, python, imports)
            if probe.returncode == 0:
                return python
            tried.append(f"{venv}: {probe.stderr.strip().splitlines()[-1:]}")
    pytest.fail(f"no Python the unprivileged user ({' '.join(prefix)}) can run and re-run "
                f"imports flowmagic: install the system's python3 (make system-deps does); "
                f"tried {tried or 'no interpreter'}")


def _copy_flowmagic(where: str) -> None:
    """flowmagic's source for the user (the checkout may be where that user cannot read)."""
    shutil.copytree(ROOT / "flowmagic", os.path.join(where, "src", "flowmagic"),
                    ignore=shutil.ignore_patterns("__pycache__"))


def _our_site_dirs() -> list[str]:
    return [p for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages")]


@pytest.fixture(scope="module")
def unprivileged():
    """(prefix, python, script) to run the attack script as an unprivileged user."""
    where = tempfile.mkdtemp(prefix="fm-attack-user-")
    os.chmod(where, 0o755)   # the user reads the venv and the copies here
    prefix = _unprivileged_prefix()
    try:
        _copy_flowmagic(where)
        script = shutil.copy(SCRIPT, where)
        yield prefix, _user_venv(prefix, where, _runnable_pythons(prefix)), script
    finally:
        shutil.rmtree(where, ignore_errors=True)


def _run_script(user: str, mode: str, out_dir: str, unprivileged) -> dict:
    out = os.path.join(out_dir, f"{user}-{mode}.json")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLOWMAGIC_", "OPENAI_"))}
    if user == "current":
        argv = [sys.executable, SCRIPT, mode, out]
    else:   # its own venv, not our PYTHONPATH or PYTHONHOME
        env = {k: v for k, v in env.items() if not k.startswith("PYTHON")}
        prefix, python, script = unprivileged()
        argv = [*prefix, python, script, mode, out]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=360, cwd="/")
    assert proc.returncode == 0 and os.path.exists(out), (
        f"the attack script ({user}, {mode}) died: the kernel it plays was killed?\n"
        f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    with open(out) as fh:
        return json.load(fh)


@pytest.fixture(scope="module")
def reports(request):
    """Each (user, mode) report, made on first use."""
    out_dir = tempfile.mkdtemp(prefix="fm-attack-reports-")
    os.chmod(out_dir, 0o777)   # the unprivileged user writes its report here
    made: dict = {}

    def get(user: str, mode: str) -> dict:
        if (user, mode) not in made:
            made[user, mode] = _run_script(
                user, mode, out_dir, lambda: request.getfixturevalue("unprivileged"))
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


_HOME_CHECK = '''
import grp
import json
import flowmagic
from flowmagic.engine.sandbox import sandbox_status
from flowmagic.flow import Flow
from flowmagic.testing.loopback import LoopbackServer

def responder(body):
    if "strict reviewer" in body["messages"][0]["content"]:
        return json.dumps({"verdict": "pass", "feedback": "fine"})
    return "```python\\nimport sys\\nprint(6 * 7, sys.executable)\\n```\\n"

plan = {"nodes": [{"id": "a", "requirement": "compute 6 * 7 in Python"}], "edges": []}
with LoopbackServer(responder=responder, model="m") as server:
    flowmagic.configure(base_url=server.base_url, model="m", api_key="sk-test")
    flow = Flow.from_dict(plan, task="compute", update="off", consolidate=False,
                          validate="llm").run()
node, status = flow.workflow.nodes["a"], sandbox_status()
print(json.dumps({"available": status.available, "mode": status.mode, "status": node.status,
                  "output": node.output, "error": node.error}))
'''


def _unused_id() -> int:
    for uid in range(62000, 63000):
        try:
            pwd.getpwuid(uid)
        except KeyError:
            try:
                grp.getgrgid(uid)
            except KeyError:
                return uid
    pytest.fail("no unused uid in 62000-62999")


def _python_in(home: str, prefix: list[str]) -> tuple[str, str]:
    """A copy of a system interpreter and its standard library in `home` (as a pyenv there
    would be): (its python, "3.N")."""
    base, version = next(_runnable_pythons(prefix), (None, None))
    if base is None:
        pytest.fail("no system Python to copy: install the system's python3 (make system-deps)")
    stdlib = subprocess.run([base, "-c", "import sysconfig; print(sysconfig.get_paths()"
                             "['stdlib'])"], check=True, capture_output=True, text=True)
    python = os.path.join(home, "py", "bin", f"python{version}")
    os.makedirs(os.path.dirname(python))
    shutil.copy2(base, python)
    shutil.copytree(stdlib.stdout.strip(), os.path.join(home, "py", "lib", f"python{version}"),
                    ignore=shutil.ignore_patterns("site-packages", "dist-packages", "test"))
    return python, version


@pytest.mark.skipif(os.geteuid() != 0, reason="becoming another user takes root")
def test_a_user_whose_python_is_in_their_own_home_runs_code_nodes():
    """A user who is not root, with the interpreter and the venv in a 0700 home of their own:
    the sandbox is available and a Flow's code node runs in it, with that interpreter."""
    uid = _unused_id()
    top = tempfile.mkdtemp(prefix="fm-user-home-")
    os.chmod(top, 0o755)
    home = os.path.join(top, "home")
    os.mkdir(home, 0o700)
    os.chown(home, uid, uid)
    prefix = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]
    try:
        _copy_flowmagic(home)
        python = _user_venv(prefix, home, [_python_in(home, prefix)])
        with open(os.path.join(home, "check.py"), "w") as fh:
            fh.write(_HOME_CHECK)
        subprocess.run(["chown", "-R", f"{uid}:{uid}", home], check=True)
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": home,
               "FLOWMAGIC_HOME": os.path.join(home, ".flowmagic"), "FLOWMAGIC_DISCOVER": "0"}
        proc = subprocess.run([*prefix, python, os.path.join(home, "check.py")], env=env,
                              capture_output=True, text=True, cwd="/", timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        got = json.loads(proc.stdout.strip().splitlines()[-1])
        assert (got["available"], got["mode"]) == (True, "user namespace"), got
        assert got["status"] == "done", got
        assert f"42 {os.path.join(home, 'py', 'bin')}" in got["output"], got
    finally:
        shutil.rmtree(top, ignore_errors=True)
