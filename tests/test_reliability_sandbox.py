"""Reliability, part 4 (issue 9): model-written code that misbehaves is contained and reported.

First through the whole path: a node's answer holds a fenced Python block, the LLM judge
(on a loopback server) says "pass", and still the sandbox catches the network attempt, the
write outside its work dir and the endless loop, fails the node and says why in one line.
Then `run_code` directly, with the ways around the fences that tests/test_sandbox.py does
not try: directory descriptors (dir_fd=, fwalk), a changed working directory, symlinks to
outside, fifos and device nodes, another process's /proc files (the parent's environment
holds the API key), and loops that ignore signals and swallow exceptions.
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
from flowmagic.engine.sandbox import run_code

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
                                  max_attempts=1, update="off", consolidate=False,
                                  llm=LLM(backoff_base=0.01)).run()
        with pytest.raises(socket.timeout):
            listener.accept()   # no connection ever arrived
    nodes = flow.workflow.nodes
    assert nodes["add"].status == "done"   # the fences do not get in the way of good code
    reasons = {"fetch": "network access is not allowed",
               "save": "writing outside the work dir is not allowed",
               "poll": "did not finish within 10.0 s and was killed"}
    for node_id, reason in reasons.items():
        node = nodes[node_id]
        assert node.status == "failed", node_id
        assert "\n" not in node.error and reason in node.error, node.error
        assert reason in node.attempts[-1]["feedback"] and not node.attempts[-1]["passed"]
        assert "looks fine" in node.attempts[-1]["feedback"]   # the judge's view is kept too
    assert flow.status == "incomplete"
    # the endless loop was killed at the timeout, not waited for
    assert nodes["poll"].duration < 30


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
    assert not result.ok and "not allowed" in result.stderr, (name, result.stderr[-400:])


def test_the_parents_environment_cannot_be_read(monkeypatch):
    """The child's own environment has no key; the parent's, in /proc, has it."""
    monkeypatch.setenv("FLOWMAGIC_API_KEY", "sk-" + "reliability-PARENT-KEY")
    code = ("import os\n"
            "data = open(f'/proc/{os.getppid()}/environ', 'rb').read()\n"
            "print(b'PARENT-KEY' in data)\n")
    result = run_code(code, timeout=5)
    assert not result.ok and "not allowed" in result.stderr, result.stdout + result.stderr
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
            "print(len(open('/etc/hostname').read()) > 0, len(os.listdir('/')) > 0)\n"
            "os.chdir('.')\n")
    result = run_code(code, timeout=10)
    assert result.ok, result.stderr
    assert result.stdout.split("\n")[:2] == ["1,2 ['copy', 'link.csv']", "True True"]
