"""Every test gets its own FLOWMAGIC_HOME, no endpoint from the developer's shell, and no
discovery of local servers (a developer's Ollama or CI's service on 8000 must not change a
test; tests/test_discovery.py turns it on against its own loopback server); loopback
endpoints are treated as hosted unless a test says otherwise."""

import contextlib
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"
SHARED = ROOT.parent / "shared" / "datasets"

_ENDPOINT_VARS = ("OPENAI_API_KEY", "OPENAI_BASE_URL", "FLOWMAGIC_BASE_URL",
                  "FLOWMAGIC_API_KEY", "FLOWMAGIC_MODEL", "FLOWMAGIC_EMBED_MODEL")


@pytest.fixture(autouse=True)
def flowmagic_home(tmp_path, monkeypatch):
    home = tmp_path / "flowmagic-home"
    monkeypatch.setenv("FLOWMAGIC_HOME", str(home))
    for var in _ENDPOINT_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("FLOWMAGIC_DISCOVER", "0")
    # The loopback servers of the tests stand for hosted endpoints unless a test says
    # otherwise (tests/test_local_endpoints.py): a local one is streamed and queued.
    monkeypatch.setenv("FLOWMAGIC_SELF_HOSTED", "0")
    monkeypatch.delenv("FLOWMAGIC_DISCOVER_PORTS", raising=False)
    # the loopback server answers any model name but lists one: tests of the model check
    # (test_model_choice.py) turn it on
    monkeypatch.setenv("FLOWMAGIC_CHECK_MODELS", "0")
    from flowmagic.llm import catalog, discovery, endpoints
    endpoints.reset()
    discovery.forget()
    catalog.forget()
    prices, cached_prices = dict(endpoints.PRICES), dict(endpoints.CACHED_PRICES)
    yield home
    from flowmagic.store import close_stores
    close_stores()   # each test's store held 3 descriptors to the end: past 1,024 select() fails
    endpoints.reset()
    endpoints.PRICES.clear()
    endpoints.PRICES.update(prices)
    endpoints.CACHED_PRICES.clear()
    endpoints.CACHED_PRICES.update(cached_prices)


@pytest.fixture
def loopback():
    """A loopback OpenAI-compatible server with no latency and no faults."""
    from flowmagic.testing.loopback import LoopbackServer
    with LoopbackServer() as server:
        yield server


@pytest.fixture(scope="session")
def embedded_url(tmp_path_factory):
    """The embedded SmolLM2 server, started once for the whole session."""
    from flowmagic.llm import local
    os.environ.setdefault("FLOWMAGIC_HOME", str(tmp_path_factory.mktemp("embedded-home")))
    url = local.ensure_server()
    yield url


def is_summary(messages) -> bool:
    """Whether a chat request is a flow's closing summary (a one-node flow's summary goes on
    from the node's conversation: its request is last)."""
    from flowmagic.engine.summary import SYSTEM
    return any(SYSTEM in m["content"] for m in messages if m["role"] != "assistant")


def fast_llm(store=None, **kwargs):
    """An LLM that backs off in milliseconds, for tests that inject faults."""
    from flowmagic.llm import LLM
    kwargs.setdefault("backoff_base", 0.01)
    kwargs.setdefault("backoff_max", 0.05)
    kwargs.setdefault("timeout", 10.0)
    return LLM(store, **kwargs)


def run(make, llm):
    """Await `make()` from a test, closing `llm`'s HTTP clients after."""
    from flowmagic._internal.aio import run_blocking
    return run_blocking(make, close=llm.aclose)


@pytest.fixture
def empty_tool_registry():
    from flowmagic.engine.tools import unregister
    unregister()
    yield
    unregister()


@contextlib.contextmanager
def ipython_shell(config=None):
    """A fresh InteractiveShell (history in memory) with flowmagic loaded, unloaded after."""
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    config = config or Config()
    config.HistoryManager.hist_file = ":memory:"
    InteractiveShell.clear_instance()
    ip = InteractiveShell.instance(config=config)
    try:
        ip.run_line_magic("load_ext", "flowmagic")
        yield ip
    finally:
        ip.run_line_magic("unload_ext", "flowmagic")
        InteractiveShell.clear_instance()
