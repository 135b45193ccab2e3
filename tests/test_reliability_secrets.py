"""Reliability, part 5 (issue 9): the API key is sent to the endpoint and written nowhere.

With a distinctive key set, the test plans, runs (with an LLM judge, an update, a refused
key on a second endpoint, and a node whose code tries to read the key from the parent
process), exports the notebook, writes the call cache, and prints the call log, first
through the Python API with every logger at DEBUG, then through the `flowmagic` command
with the openai SDK's own debug logging on. Then every byte under FLOWMAGIC_HOME (the
database, its WAL and anything else), every exported file, every log and all captured
output is searched: the key (and its random core) occurs nowhere. The loopback server
confirms that each request did carry it.

Only the command-line test has the key in the *initial* environment of the process that
starts the sandbox, which is what /proc/<pid>/environ shows (monkeypatch.setenv does not
change it): that test is the one that caught generated code reading the key from there.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

import flowmagic
from flowmagic import cli
from flowmagic.ops import export as notebook
from flowmagic.errors import EndpointError
from flowmagic.llm import LLM
from flowmagic.testing.loopback import LoopbackServer

from conftest import ROOT

pytestmark = pytest.mark.timeout(240)

CORE = secrets.token_hex(12)
KEY = "sk-" + f"flowmagic-reliability-{CORE}"   # fake; split so scanners skip it
PLAN = {"subtasks": [
    {"id": "gather", "requirement": "gather the facts", "agent": "researcher", "depends_on": []},
    {"id": "probe", "requirement": "write Python that reads the environment", "agent": "coder",
     "depends_on": []},
    {"id": "report", "requirement": "write the report", "agent": "writer",
     "depends_on": ["gather"]}]}
# What a hostile or confused model might write: the child's own environment has no key,
# so it goes looking in its parent's.
PROBE = ("```python\nimport os\n"
         "env = open(f'/proc/{os.getppid()}/environ', 'rb').read().decode()\n"
         "raise SystemExit([v for v in env.split('\\0') if 'KEY' in v])\n```")


def responder(body: dict) -> str:
    system = body["messages"][0]["content"]
    user = body["messages"][-1]["content"]
    if "You plan work" in system:
        return json.dumps(PLAN)
    if "strict reviewer" in system:
        return json.dumps({"verdict": "pass", "feedback": "fine"})
    if "global updater" in system:
        return json.dumps({"action": "no_change"})
    node = re.search(r"Your subtask \((\w+)\)", user)
    if node and node.group(1) == "probe":
        return PROBE
    return f"The result of {node.group(1) if node else 'the task'}: all done."


def files_under(*roots: Path) -> list[Path]:
    return [p for root in roots if root.exists() for p in sorted(root.rglob("*")) if p.is_file()]


def assert_no_key(label: str, data) -> None:
    blob = data if isinstance(data, bytes) else str(data).encode("utf-8", "replace")
    for secret in (KEY, CORE):
        for form in (secret.encode(), secret.encode("utf-16-le"), secret[::-1].encode()):
            assert form not in blob, f"the API key leaked into {label}"


def assert_server_got_key(server: LoopbackServer) -> None:
    chats = [r for r in server.requests if r["path"].endswith("/chat/completions")]
    assert chats and all(r["had_auth"] for r in chats)
    assert all(r["headers"].get("authorization") == "REDACTED" for r in chats)


@pytest.fixture
def debug_log(tmp_path):
    """Every logger (openai, httpx, httpcore, flowmagic) at DEBUG into one file."""
    path = tmp_path / "debug.log"
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    old = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield path
    finally:
        root.removeHandler(handler)
        root.setLevel(old)
        handler.close()


def test_python_api_writes_the_key_nowhere(monkeypatch, tmp_path, flowmagic_home, capsys,
                                           debug_log):
    out = tmp_path / "export"
    with LoopbackServer(responder=responder) as server, \
            LoopbackServer(faults={"401": 1.0}) as refusing:
        monkeypatch.setenv("FLOWMAGIC_BASE_URL", server.base_url)
        monkeypatch.setenv("FLOWMAGIC_MODEL", "m")
        monkeypatch.setenv("FLOWMAGIC_API_KEY", KEY)
        llm = LLM(backoff_base=0.01, max_retries=1)
        flow = flowmagic.plan("Write a short report with facts and a code check", k=2,
                              name="secret_run", llm=llm, validate="llm",
                              update="after-completion", max_updates=1, max_attempts=1)
        flow.run()
        assert flow.workflow.nodes["gather"].status == "done"
        probe = flow.workflow.nodes["probe"]
        # under bubblewrap its "parent" is the sandbox's pid 1: its environment has no key
        # (as root it is not even readable); either way the probe finds nothing and fails
        assert probe.status == "failed"
        # a second endpoint that refuses the same key: its error is logged, without the key
        flowmagic.configure(name="refusing", base_url=refusing.base_url, api_key=KEY, model="m")
        with pytest.raises(EndpointError) as refused:
            llm.complete_sync("hello", model="refusing")
        assert "refused the API key" in str(refused.value)
        assert_no_key("the EndpointError", refused.value)

        write = getattr(flow, "to_notebook", None)
        exported = write(out / "flow.ipynb") if write else notebook.export(flow, out / "flow.ipynb")
        notebook.save_cache(out / "cache.json")
        assert Path(exported).exists() and (out / "cache.json").exists()
        for argv in (["log", "--json", "-n", "200"], ["log", "-n", "200"],
                     ["export", "secret_run", str(out / "cli.ipynb")]):
            assert cli.main(argv) == 0
        captured = capsys.readouterr()
        assert_server_got_key(server)
        assert refusing.requests and all(r["had_auth"] for r in refusing.requests)
        assert json.loads(captured.out[:captured.out.index("\n]") + 2])   # the JSON log printed

        checked = files_under(flowmagic_home, out) + [debug_log]
        assert any(p.name == "flowmagic.db" for p in checked) and len(checked) >= 5
        assert debug_log.stat().st_size > 0   # the SDK and HTTP loggers did log
        for path in checked:
            assert_no_key(str(path), path.read_bytes())
        assert_no_key("stdout", captured.out)
        assert_no_key("stderr", captured.err)
        assert_no_key("the flow's repr and state", [repr(flow), flow.to_dict() if hasattr(
            flow, "to_dict") else flow.workflow.to_dict(), flow.settings, flow.update_log])


def test_command_line_writes_the_key_nowhere(tmp_path, flowmagic_home):
    out = tmp_path / "out"
    with LoopbackServer(responder=responder) as server:
        env = {**os.environ, "FLOWMAGIC_HOME": str(flowmagic_home),
               "FLOWMAGIC_BASE_URL": server.base_url, "FLOWMAGIC_MODEL": "m",
               "FLOWMAGIC_API_KEY": KEY, "OPENAI_LOG": "debug"}

        def flowmagic_cli(*argv: str) -> subprocess.CompletedProcess:
            return subprocess.run([sys.executable, "-m", "flowmagic.cli", *argv], env=env,
                                  cwd=tmp_path, capture_output=True, text=True, timeout=180)

        runs = [
            flowmagic_cli("run", "Write a short report with facts and a code check", "--k", "2",
                          "--name", "cli_secret", "--out", str(out), "--no-execute",
                          "--set", "validate=llm", "--set", "max_attempts=1"),
            flowmagic_cli("plan", "Write another report", "--k", "2", "--name", "planned"),
            flowmagic_cli("export", "cli_secret", str(out / "again.ipynb")),
            flowmagic_cli("log", "--json", "-n", "500"),
            flowmagic_cli("log", "-n", "500"),
        ]
        assert_server_got_key(server)
    assert runs[0].returncode == 1   # the probe node failed, so the run is incomplete
    assert all(r.returncode == 0 for r in runs[1:]), [r.stderr[-500:] for r in runs]
    assert "HTTP Request: POST" in runs[0].stderr   # the SDK's debug logging was on
    written = files_under(flowmagic_home, out)
    assert {p.suffix for p in written} >= {".ipynb", ".svg", ".db"}, written
    for path in written:
        assert_no_key(str(path), path.read_bytes())
    for r in runs:
        assert_no_key(f"the output of flowmagic {r.args[3]}", r.stdout + r.stderr)


@pytest.mark.parametrize("execute", ["auto", "off"])   # run as the node's work / by the judge
def test_a_key_in_sandbox_output_is_scrubbed_from_every_stored_and_sent_text(flowmagic_home,
                                                                             execute):
    """Were the key to reach sandbox output (here the model's own code prints it), the node's
    error, its stored attempts, the retry prompt and the judge's prompt hold "[key hidden]"."""
    configured = "sk-" + f"configured-only-{CORE}"
    code = f"print({configured[:12]!r} + {configured[12:]!r})\nraise ValueError({configured!r})"

    def leaky(body: dict) -> str:
        if "strict reviewer" in body["messages"][0]["content"]:
            return json.dumps({"verdict": "pass", "feedback": "fine"})
        return f"```python\n{code}\n```"

    plan = {"nodes": [{"id": "leak", "requirement": "print the key"}], "edges": []}
    with LoopbackServer(responder=leaky) as server:
        flowmagic.configure(base_url=server.base_url, model="m", api_key=configured)
        flow = flowmagic.Flow.from_dict(plan, task="t", validate="llm", max_attempts=2,
                                        update="off", consolidate=False, execute=execute,
                                        llm=LLM(backoff_base=0.01)).run()
        sent = [json.dumps(r["body"]) for r in server.requests]
    node = flow.workflow.nodes["leak"]
    assert node.status == "failed" and "[key hidden]" in node.error
    # auto: node, node again (the code's traceback in the retry prompt); off: node, judge,
    # node again (the judge is asked once: its second prompt is the same, from the cache)
    assert len(sent) == (2 if execute == "auto" else 3) and "[key hidden]" in sent[-1]
    assert any("ValueError: [key hidden]" in a["feedback"] for a in node.attempts)
    for label, text in [("a request", s) for s in sent] + [
            ("the flow's state", json.dumps(flow.workflow.to_dict()))] + [
            (str(p), p.read_bytes()) for p in files_under(flowmagic_home)]:
        data = text if isinstance(text, bytes) else text.encode()
        assert configured.encode() not in data, f"the key reached {label}"
