"""Reliability, part 4 (issue 9): model-written code that misbehaves is contained and reported.

First through the whole path: a node's answer holds a fenced Python block, the LLM judge
(on a loopback server) says "pass", and still the sandbox stops the network attempt, the
write outside its workdir and the endless loop, fails the node and says why in one line.
Then `run_code` directly, with ways around a fence written in Python (the sandbox before
bubblewrap): directory descriptors (dir_fd=, fwalk), a changed working directory, symlinks
to outside, fifos and device nodes, another process's /proc files. Under bubblewrap none of
those paths exists in the sandbox. The attacks of issue 13 are in test_sandbox_attacks.py.
"""

from __future__ import annotations

import json
import os
import re
import socket
import tempfile

import pytest

import flowmagic
from flowmagic.flow import Flow
from flowmagic.llm import LLM
from flowmagic.testing.loopback import LoopbackServer
from flowmagic.cli import build_parser
from flowmagic.engine.sandbox import run_code, sandbox_status
from flowmagic.engine.sandbox_launch import NONE_WARNING
from flowmagic.errors import ConfigError
from flowmagic.magic_grammar import parse_assignments, parse_flow_line

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def outside(tmp_path):
    """A directory outside the sandbox that must stay empty."""
    path = tmp_path / "outside"
    path.mkdir()
    yield path
    assert sorted(os.listdir(path)) == [], "the sandboxed code wrote outside its work dir"


# ------------------------------------------------------------------------------ through a run
def test_misbehaving_code_fails_its_node_even_when_the_judge_passes_it(outside):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(0.2)
        port = listener.getsockname()[1]
        code = {
            "fetch": f"import urllib.request\nprint(urllib.request.urlopen('http://127.0.0.1:{port}/', timeout=2).read())",
            "save": f"with open({str(outside / 'result.txt')!r}, 'w') as fh:\n    fh.write('42')",
            "poll": "import time\nwhile True:\n    time.sleep(0.05)",
            "add": "def add(a, b):\n    return a + b\n\nprint(add(2, 3))",
        }

        def responder(body):
            if "strict reviewer" in body["messages"][0]["content"]:
                return json.dumps({"verdict": "pass", "feedback": "looks fine"})
            node = re.search(r"Your subtask \((\w+)\)", body["messages"][-1]["content"]).group(1)
            return f"Here is the code:\n\n```python\n{code[node]}\n```\n\nIt does the job."

        plan = {"nodes": [{"id": k, "requirement": f"write Python that does {k}"} for k in code],
                "edges": []}
        with LoopbackServer(responder=responder) as server:
            flowmagic.configure(base_url=server.base_url, model="m")
            flow = Flow.from_dict(plan, task="write four small programs", validate="llm", execute="off",
                                  max_attempts=1, update="off", consolidate=False, code_timeout=5,
                                  llm=LLM(backoff_base=0.01)).run()
        with pytest.raises(socket.timeout):
            listener.accept()   # no connection ever arrived
    nodes = flow.workflow.nodes
    assert nodes["add"].status == "done"   # the fences do not get in the way of good code
    reasons = {"fetch": "Connection refused",   # no network: not even the host's loopback
               "save": "No such file or directory",   # the host's folders are not there
               "poll": "did not finish within 5"}
    for node_id, reason in reasons.items():
        node = nodes[node_id]
        assert node.status == "failed", node_id
        assert "\n" not in node.error and reason in node.error, node.error
        assert reason in node.attempts[-1]["feedback"] and not node.attempts[-1]["passed"]
        assert "looks fine" in node.attempts[-1]["feedback"]   # the judge's view is kept too
    assert flow.status == "incomplete"
    # the endless loop was killed at the timeout, not waited for
    assert nodes["poll"].duration < 30


def _code_flow(server, marker, **settings) -> Flow:
    flowmagic.configure(base_url=server.base_url, model="m")
    plan = {"nodes": [{"id": "code", "requirement": "write Python"},
                      {"id": "text", "requirement": "write a sentence"}], "edges": []}
    return Flow.from_dict(plan, task="t", validate="llm", max_attempts=3, update="off",
                          consolidate=False, llm=LLM(backoff_base=0.01), **settings)


def _code_responder(marker):
    def responder(body):
        if "strict reviewer" in body["messages"][0]["content"]:
            return json.dumps({"verdict": "pass", "feedback": "fine"})
        if "Your subtask (code)" in body["messages"][-1]["content"]:
            return f"```python\nopen({str(marker)!r}, 'w').write('ran')\n```"
        return "A sentence."
    return responder


def test_without_bubblewrap_a_code_node_fails_in_one_line_and_its_code_never_runs(
        tmp_path, monkeypatch):
    marker = tmp_path / "ran"
    monkeypatch.setenv("PATH", str(tmp_path))   # no bwrap on it
    try:
        sandbox_status(refresh=True)
        with LoopbackServer(responder=_code_responder(marker)) as server:
            flow = _code_flow(server, marker).run()
    finally:
        monkeypatch.undo()
        sandbox_status(refresh=True)
    node = flow.workflow.nodes["code"]
    assert node.status == "failed" and not marker.exists()
    assert len(node.attempts) == 1   # a machine without bubblewrap is not fixed by retrying
    assert "\n" not in node.error and "bubblewrap is not installed" in node.error
    assert "sandbox='none'" in node.error
    assert flow.workflow.nodes["text"].status == "done"   # nodes without code are unaffected


def test_sandbox_none_is_a_setting_that_warns_on_every_run(tmp_path, capfd):
    marker = tmp_path / "ran"
    with LoopbackServer(responder=_code_responder(marker)) as server:
        flow = _code_flow(server, marker, sandbox="none").run()
    assert flow.workflow.nodes["code"].status == "done" and marker.read_text() == "ran"
    assert capfd.readouterr().err.count(NONE_WARNING) == 1
    with pytest.raises(ConfigError, match="'bwrap'.*'none'"):
        Flow.from_dict({"nodes": [{"id": "a", "requirement": "r"}]}, sandbox="docker")
    with pytest.raises(ConfigError, match="code_timeout"):
        Flow.from_dict({"nodes": [{"id": "a", "requirement": "r"}]}, code_timeout=0)


def test_the_sandbox_setting_is_reachable_from_the_cell_and_the_command_line():
    assert parse_flow_line("demo --sandbox none").settings["sandbox"] == "none"
    assert "sandbox" not in parse_flow_line("demo").settings
    with pytest.raises(ConfigError):
        parse_flow_line("demo --sandbox docker")
    args = build_parser().parse_args(["run", "a task", "--sandbox", "none"])
    assert args.sandbox == "none"
    # `%flow config sandbox=none` and `--set sandbox=none` read the word, not Python's None
    assert parse_assignments(["sandbox=none", "validate=none", "seed=none"]) == {
        "sandbox": "none", "validate": "none", "seed": None}


# ------------------------------------------------------------------------------ run_code directly
ESCAPES = {
    "dir_fd open": "import os\nfd = os.open({out!r}, os.O_RDONLY)\n"
                   "os.write(os.open('x', os.O_WRONLY | os.O_CREAT, dir_fd=fd), b'x')",
    "dir_fd mkdir": "import os\nos.mkdir('x', dir_fd=os.open({out!r}, os.O_RDONLY))",
    "dir_fd rename": "import os\nopen('a', 'w').write('x')\n"
                     "os.rename('a', 'x', dst_dir_fd=os.open({out!r}, os.O_RDONLY))",
    "fwalk": "import os\nfor _, _, _, fd in os.fwalk({out!r}):\n"
             "    os.write(os.open('x', os.O_WRONLY | os.O_CREAT, dir_fd=fd), b'x')",
    "chdir then dir_fd": (  # from the new cwd the path stays inside; from the fd it does not
        "import os\nos.makedirs('a/b')\nfd = os.open('.', os.O_RDONLY)\nos.chdir('a/b')\n"
        "os.makedirs(os.path.dirname({rel!r}), exist_ok=True)\n"
        "os.write(os.open({rel!r}, os.O_WRONLY | os.O_CREAT, dir_fd=fd), b'x')"),
    "chdir outside": "import os\nos.chdir({out!r})\nopen('x', 'w').write('x')",
    "symlink to a directory": "import os\nos.symlink({out!r}, 'link')\nopen('link/x', 'w').write('x')",
    "fifo": "import os\nos.mkfifo({out!r} + '/x')",
    "device node": "import os, stat\nos.mknod('disk', stat.S_IFCHR | 0o600, os.makedev(1, 3))",
}


@pytest.mark.parametrize("name", list(ESCAPES))
def test_ways_around_the_write_fence_are_refused(name, outside):
    # "chdir then dir_fd": the sandbox's work dir is <tempdir>/flowmagic-sandbox-*/work, so
    # from work/a/b "../../" is the work dir again, while from the work dir it is <tempdir>
    rel = "../../" + os.path.relpath(outside / "x", tempfile.gettempdir())
    result = run_code(ESCAPES[name].format(out=str(outside), rel=rel), timeout=5)
    assert not result.ok, (name, result.stdout[-400:])


def test_the_parents_environment_cannot_be_read(monkeypatch):
    """The child's own environment has no key; the parent's, in /proc, has it."""
    monkeypatch.setenv("FLOWMAGIC_API_KEY", "sk-" + "reliability-PARENT-KEY")
    code = ("import os\n"
            "data = open(f'/proc/{os.getppid()}/environ', 'rb').read()\n"
            "assert b'PARENT-KEY' in data\n")
    result = run_code(code, timeout=5)
    assert not result.ok, result.stdout + result.stderr
    assert "PARENT-KEY" not in result.stdout + result.stderr


def test_code_that_fights_the_timeout_is_killed():
    code = ("import signal, threading\n"
            "for s in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM):\n"
            "    signal.signal(s, signal.SIG_IGN)\n"
            "threading.Thread(target=lambda: [None for _ in iter(int, 1)], daemon=True).start()\n"
            "while True:\n"
            "    try:\n"
            "        pass\n"
            "    except BaseException:\n"
            "        pass\n")
    result = run_code(code, timeout=1.0)
    assert result.timed_out and result.stage == "timeout" and result.duration_s < 5
    assert "did not finish within 1.0 s" in result.error()


def test_ordinary_file_work_inside_the_work_dir_still_works():
    code = ("import os, shutil, tempfile\n"
            "os.makedirs('data/raw')\n"
            "open('data/raw/a.csv', 'w').write('x,y\\n1,2\\n')\n"
            "shutil.copytree('data', 'copy')\n"
            "shutil.rmtree('data')\n"
            "with tempfile.TemporaryDirectory() as tmp:\n"
            "    open(os.path.join(tmp, 't'), 'w').write('t')\n"
            "os.symlink('copy/raw/a.csv', 'link.csv')\n"
            "print(open('link.csv').read().split()[1], sorted(os.listdir('.')))\n"
            "print(len(open('/etc/passwd').read()) > 0, len(os.listdir('/')) > 0)\n"
            "os.chdir('.')\n")
    result = run_code(code, timeout=10)
    assert result.ok, result.stderr
    assert result.stdout.split("\n")[:2] == ["1,2 ['copy', 'link.csv']", "True True"]
