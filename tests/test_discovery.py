"""Finding the user's own local server: a loopback server on a known port stands in for Ollama.

conftest turns discovery off for every other test (FLOWMAGIC_DISCOVER=0), so whatever
listens on 11434, 1234, 8080 or 8000 of this machine cannot change the suite; here it is
turned on and pointed only at the port of a server the test starts.
"""

import socket
import subprocess
import sys
import time

import pytest

from flowmagic.llm import discovery, endpoints
from flowmagic.view.display import models_report
from flowmagic.llm import LLM
from flowmagic.testing.loopback import LoopbackServer

from conftest import run


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def ollama(monkeypatch):
    port = free_port()
    with LoopbackServer(port=port, model="llama3.2:3b",
                        responder=lambda body: "hello from the user's server") as server:
        monkeypatch.setenv("FLOWMAGIC_DISCOVER", "1")
        monkeypatch.setenv("FLOWMAGIC_DISCOVER_PORTS", f"{port}=Ollama")
        discovery.forget()
        yield server, port
    discovery.forget()


def test_a_running_local_server_is_found_and_used_with_one_line(ollama, capsys):
    server, port = ollama
    started = time.perf_counter()
    (found,) = discovery.found()
    assert time.perf_counter() - started < 2.0
    assert (found.kind, found.base_url) == ("Ollama", f"http://127.0.0.1:{port}/v1")
    assert found.model == "llama3.2:3b"
    endpoint = endpoints.resolve_default()
    assert (endpoint.base_url, endpoint.model, endpoint.local) == (found.base_url, "llama3.2:3b", False)
    endpoints.resolve_default()
    out = capsys.readouterr().out
    assert out.count(f"flowmagic: using Ollama at http://127.0.0.1:{port}/v1 with its model "
                     "llama3.2:3b") == 1
    llm = LLM()
    reply = run(lambda: llm.complete("hi"), llm)
    assert reply.text == "hello from the user's server" and reply.model == "default:llama3.2:3b"
    # Found once per process: the scan is not repeated for every call.
    before = len(server.stats()["requests"])
    discovery.found()
    assert len(server.stats()["requests"]) == before
    report = models_report(()).text
    assert "Ollama" in report and "llama3.2:3b" in report


def test_nothing_listening_means_the_embedded_model(monkeypatch):
    monkeypatch.setenv("FLOWMAGIC_DISCOVER", "1")
    monkeypatch.setenv("FLOWMAGIC_DISCOVER_PORTS", str(free_port()))
    discovery.forget()
    started = time.perf_counter()
    assert discovery.found() == []
    assert time.perf_counter() - started < 1.0
    assert endpoints.resolve_default().local
    assert "none found on 127.0.0.1 ports" in models_report(()).text


def test_discovery_off_never_connects(ollama, monkeypatch):
    server, _ = ollama
    monkeypatch.setenv("FLOWMAGIC_DISCOVER", "0")
    assert discovery.found() == [] and endpoints.resolve_default().local
    assert server.stats()["requests"] == []
    assert "not looked for" in models_report(()).text


@pytest.mark.parametrize("models, best", [
    (["nomic-embed-text", "llama3.2:1b", "qwen2.5:7b-instruct"], "qwen2.5:7b-instruct"),
    (["bge-m3", "all-minilm"], None),
    (["phi3:mini", "mistral:7b", "llama3.2:1b"], "mistral:7b"),
    (["text-embedding-nomic", "model.gguf"], "model.gguf"),
])
def test_best_chat_model(models, best):
    assert discovery.best_chat_model(models) == best


def test_flowmagic_models_lists_what_was_found(ollama):
    _, port = ollama
    import os

    env = {**os.environ, "FLOWMAGIC_DISCOVER": "1", "FLOWMAGIC_DISCOVER_PORTS": f"{port}=Ollama"}
    out = subprocess.run([sys.executable, "-m", "flowmagic.cli", "models"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert f"http://127.0.0.1:{port}/v1" in out.stdout and "llama3.2:3b" in out.stdout


# -- hostile servers (issue 28): a listed id is untrusted ------------------------------------
def hostile_ids(marker):
    code = f"__import__('os').system('touch {marker}')"
    return [f"evil-instruct-70b\n{code}", f"evil-chat-70b\r{code}", f"{{{code}}}-instruct-70b",
            f"evil-instruct-70b\u2028{code}", f"evil-instruct-70b\x85{code}",
            f"evil-instruct-70b\x00{code}", "evil'instruct'70b", 'evil"""-instruct-70b',
            "$(touch x)-instruct-70b", "i" * 10_000 + "-instruct-70b", "-instruct-70b"]


@pytest.fixture
def hostile(monkeypatch, tmp_path):
    port = free_port()
    marker = tmp_path / "PWNED"
    models = hostile_ids(marker) + ["qwen2.5:3b-instruct"]
    with LoopbackServer(port=port, models=models,
                        responder=lambda body: "Green tea is steeped at 80 C.") as server:
        monkeypatch.setenv("FLOWMAGIC_DISCOVER", "1")   # the kernel of the replay inherits these
        monkeypatch.setenv("FLOWMAGIC_DISCOVER_PORTS", f"{port}=Ollama")
        discovery.forget()
        yield server, port, marker
    discovery.forget()


def test_hostile_model_ids_are_refused_with_one_line(hostile, capsys):
    server, port, marker = hostile
    (found,) = discovery.found()
    assert found.models == ["qwen2.5:3b-instruct"] and found.model == "qwen2.5:3b-instruct"
    out = capsys.readouterr().out
    (line,) = [x for x in out.splitlines() if "model ids" in x]
    assert line.startswith(f"flowmagic: ignored 11 of the 12 model ids http://127.0.0.1:{port}/v1 ")
    assert "not model names" in line and line.isprintable() and len(line) < 400
    assert len(out.splitlines()) == len(out.split("\n")) - 1   # nothing broke a line
    discovery.list_models(found.base_url, 1.0)   # asked again (a model check): said once
    assert "model ids" not in capsys.readouterr().out
    report = models_report(()).text
    assert "import" not in report and "evil" not in report and "qwen2.5:3b-instruct" in report


def test_a_hostile_id_reaches_no_call_store_export_or_replay(hostile, tmp_path):
    import nbformat
    from nbclient import NotebookClient

    from flowmagic.flow import Flow
    from flowmagic.ops.export import export
    from flowmagic.store import get_store

    server, port, marker = hostile
    flow = Flow.from_dict({"nodes": [{"id": "steep", "requirement": "Say how to steep tea"}]},
                          task="A guide to green tea", name="tea")
    flow.run()
    assert flow.status == "done"
    path = export(flow, tmp_path / "tea.ipynb")
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=120, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    assert not marker.exists()
    assert not [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
                if o.output_type == "error"]
    text = path.read_text()
    assert "evil" not in text and "touch" not in text
    assert {r["model"] for r in get_store().recent_calls(100)} == {"default:qwen2.5:3b-instruct"}


def test_an_endpoint_asked_for_its_first_model_never_takes_a_hostile_one(monkeypatch, tmp_path):
    import flowmagic

    with LoopbackServer(models=hostile_ids(tmp_path / "PWNED") + ["good-model"],
                        responder=lambda body: "ok") as server:
        flowmagic.configure(base_url=server.base_url)   # no model: the first listed is asked
        llm = LLM()
        reply = run(lambda: llm.complete("hi"), llm)
    assert reply.model == "default:good-model"
