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
