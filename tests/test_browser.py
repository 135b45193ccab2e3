"""End to end in a real browser: JupyterLab, headless Debian chromium driven by Playwright.

A JupyterLab server on 127.0.0.1 with a token serves a notebook with a `%%flow` cell. The
first test plans on the embedded model, clicks Step, then Prune on a node, and reads from
the page that the drawing changed each time. The second, on a loopback server with slow
answers, clicks Run, Stop, Downgrade, Run, Rerun and Show output, reads the Flow back from
the kernel (which answers while a run is under way) and the drawing from the page.
Screenshots are saved under artifacts/. Playwright never downloads a browser here: it
drives /usr/bin/chromium (`make browser-deps`).
"""

import contextlib
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

from flowmagic.testing.loopback import LoopbackServer

from conftest import ROOT

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = ROOT / "artifacts"
# Stop chromium phoning home (component updates, sync, field trials, QUIC probes).
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--disable-default-apps", "--disable-extensions",
                 "--metrics-recording-only", "--no-default-browser-check"]
EMBEDDED_CELLS = ["%load_ext flowmagic\n%flow config max_tokens=48",
                  "%%flow demo --k 1\nList two facts about green tea, then write one sentence "
                  "using them."]
PLAN = {"subtasks": [
    {"id": "facts", "requirement": "List facts.", "agent": "researcher", "depends_on": []},
    {"id": "photo", "requirement": "Describe a photo.", "agent": "designer", "depends_on": []},
    {"id": "post", "requirement": "Write the post.", "agent": "writer",
     "depends_on": ["facts", "photo"]}]}
KERNEL_IDLE = """() => {
  const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
  return Boolean(k && k.status === 'idle');
}"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _get(url: str) -> dict | list | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return json.loads(response.read() or b"null")
    except OSError:
        return None


def _write_notebook(path: Path, cells: list[str]) -> None:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(source) for source in cells]
    nbformat.write(nb, path)


@pytest.fixture
def lab(tmp_path, flowmagic_home):
    """`start(cells, **env)`: a JupyterLab server serving flow.ipynb with those cells."""
    servers = []

    def start(cells: list[str], **env: str) -> dict:
        server = _start_lab(tmp_path, flowmagic_home, cells, env)
        servers.append(server)
        return server

    yield start
    for server in servers:
        _stop_lab(server["proc"], server["base"], server["token"])
        server["log_file"].close()
    _stop_leftovers(flowmagic_home)


def _start_lab(tmp_path: Path, flowmagic_home: Path, cells: list[str], extra_env: dict) -> dict:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing; run `make browser-deps` (apt-get install chromium)")
    root, jupyter = tmp_path / "root", tmp_path / "jupyter"
    root.mkdir()
    for sub in ("config", "runtime", "settings", "workspaces", "ipython"):
        (jupyter / sub).mkdir(parents=True)
    (jupyter / "config" / "jupyter_server_config.json").write_text(json.dumps({
        "LabApp": {"expose_app_in_browser": True, "news_url": None,
                   "check_for_updates_class": "jupyterlab.NeverCheckForUpdate",
                   "extension_manager": "readonly"},
        "ServerApp": {"terminals_enabled": False},
        # The kernel's atexit stops its embedded model server (up to 5 s); give it time.
        "KernelManager": {"shutdown_wait_time": 20}}))
    # Never ask to fetch news (a network call, and a toast over the screenshot).
    notify = jupyter / "settings" / "@jupyterlab" / "apputils-extension"
    notify.mkdir(parents=True)
    (notify / "notification.jupyterlab-settings").write_text(json.dumps(
        {"fetchNews": "false", "checkForUpdates": False}))
    _write_notebook(root / "flow.ipynb", cells)
    token, port = secrets.token_hex(16), _free_port()
    env = {**os.environ, **extra_env, "FLOWMAGIC_HOME": str(flowmagic_home),
           "JUPYTER_CONFIG_DIR": str(jupyter / "config"),
           "JUPYTER_RUNTIME_DIR": str(jupyter / "runtime"),
           "JUPYTERLAB_SETTINGS_DIR": str(jupyter / "settings"),
           "JUPYTERLAB_WORKSPACES_DIR": str(jupyter / "workspaces"),
           "IPYTHONDIR": str(jupyter / "ipython")}
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", f"--IdentityProvider.token={token}",
           "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
           f"--ServerApp.root_dir={root}"]
    if os.geteuid() == 0:   # CI containers run as root; jupyter refuses that unless told
        cmd.append("--allow-root")
    log = open(tmp_path / "jupyter.log", "wb")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while _get(f"{base}/api/status?token={token}") is None:
        if proc.poll() is not None or time.monotonic() > deadline:
            _stop_lab(proc, base, token)
            log.close()
            raise RuntimeError("jupyter lab did not start:\n"
                               + (tmp_path / "jupyter.log").read_text()[-3000:])
        time.sleep(0.3)
    return {"base": base, "token": token, "proc": proc, "log_file": log}


def _stop_lab(proc: subprocess.Popen, base: str, token: str) -> None:
    # Shut kernels down through the API first, so each stops its embedded model server.
    for kernel in _get(f"{base}/api/kernels?token={token}") or []:
        request = urllib.request.Request(f"{base}/api/kernels/{kernel['id']}?token={token}",
                                         method="DELETE")
        try:
            urllib.request.urlopen(request, timeout=30).close()
        except OSError:
            pass
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _stop_leftovers(home: Path) -> None:
    """Stop an embedded model server the kernel started and left behind (a kernel killed
    after the shutdown grace period never runs its atexit handlers). Found by this test's
    own FLOWMAGIC_HOME, so no other process is touched."""
    marker = f"FLOWMAGIC_HOME={home}".encode()
    found = []
    for proc_dir in Path("/proc").glob("[0-9]*"):
        try:
            if (b"llama_cpp.server" in (proc_dir / "cmdline").read_bytes()
                    and marker in (proc_dir / "environ").read_bytes().split(b"\0")):
                found.append(int(proc_dir.name))
        except OSError:
            continue
    for pid in found:
        print(f"\nstopping a leftover embedded model server (pid {pid})")
        _end(pid)


def _end(pid: int) -> None:
    """SIGTERM, then SIGKILL after 5 s (the server may wait on open connections)."""
    try:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            os.kill(pid, 0)
            time.sleep(0.1)
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _node_states(page) -> dict:
    return page.evaluate("""() => Object.fromEntries(
        [...document.querySelectorAll('.flowmagic-drawing svg g.node')]
          .map(g => [g.id.replace(/^node-/, ''), g.getAttribute('class')]))""")


def button(page, label: str):
    # The label follows an icon; match the whole text so "Run" is not "Rerun".
    return page.locator(".flowmagic-panel button", has_text=re.compile(rf"^\s*{label}\s*$"))


def kernel_eval(page, code: str) -> str:
    """Run code in the notebook's kernel from the page; its printed output."""
    return page.evaluate("""async code => {
      const k = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
      const future = k.requestExecute({code, store_history: false});
      let out = '';
      future.onIOPub = msg => { if (msg.header.msg_type === 'stream') out += msg.content.text; };
      await future.done;
      return out;
    }""", code)


def flow_state(page, name: str = "demo") -> dict:
    """The Flow as the kernel sees it: status, busy, and per node [status, model, attempts]."""
    return json.loads(kernel_eval(page, (
        f"import json; print(json.dumps({{'status': {name}.status, 'busy': {name}.busy, "
        f"'nodes': {{i: [n.status, n.model, len(n.attempts)] "
        f"for i, n in {name}.workflow.nodes.items()}}}}))")))


def wait_flow(page, ready, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        state = flow_state(page)
        if ready(state) or time.monotonic() > deadline:
            return state
        time.sleep(0.3)


@contextlib.contextmanager
def notebook_page(server: dict, shot: Path):
    """The notebook open in headless chromium, its cells run; a screenshot at the end."""
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        try:
            page.goto(f"{server['base']}/lab/tree/flow.ipynb?token={server['token']}")
            page.wait_for_function(KERNEL_IDLE, timeout=120_000)
            page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
            try:
                page.locator(".flowmagic-drawing svg").first.wait_for(timeout=300_000)
            except Exception:
                raise AssertionError("no flow drawing appeared; outputs:\n" + _outputs_text(page))
            yield page
            page.wait_for_timeout(500)   # the panel's labels settle before the picture
        finally:
            page.screenshot(path=str(shot), full_page=True)
            print(f"\nscreenshot: {shot}")
            browser.close()


def wait_node(page, node: str, cls: str, timeout: float = 60_000) -> None:
    page.wait_for_function(
        "([id, cls]) => { const g = document.getElementById('node-' + id);"
        " return Boolean(g && g.classList.contains(cls)); }", arg=[node, cls], timeout=timeout)


def _outputs_text(page) -> str:
    return page.evaluate("() => [...document.querySelectorAll('.jp-OutputArea-output')]"
                         ".map(e => e.innerText).join('\\n---\\n')")


@pytest.mark.embedded
@pytest.mark.timeout(600)
def test_flow_cell_step_and_prune_in_jupyterlab(lab):
    started = time.monotonic()
    server = lab(EMBEDDED_CELLS)
    with notebook_page(server, ARTIFACTS / "browser-flow.png") as page:
        planned = time.monotonic()
        drawing = page.locator(".flowmagic-drawing").first
        before = drawing.inner_html()
        states = _node_states(page)
        assert states and all("pending" in c for c in states.values()), states

        button(page, "Step").click()
        # The kernel is idle while a node runs: the step is a task on its loop.
        page.wait_for_function(f"() => document.querySelector("
                               f"'.flowmagic-drawing svg g.node.running') && ({KERNEL_IDLE})()",
                               timeout=240_000, polling=50)
        page.wait_for_function("() => document.querySelector('.flowmagic-drawing svg "
                               "g.node.done') && !document.querySelector("
                               "'.flowmagic-drawing svg g.node.running')", timeout=240_000)
        stepped = drawing.inner_html()
        assert stepped != before
        states = _node_states(page)
        assert any("done" in c for c in states.values()), states

        # Prune a node that has not run if there is one, else a finished one.
        node = next((n for n, c in states.items() if "pending" in c),
                    next(n for n, c in states.items() if "done" in c))
        page.locator(".flowmagic-panel select").first.select_option(label=node)
        button(page, "Prune").click()
        # the click waits its turn behind the step's dynamic update, itself an embedded-model
        # call that takes minutes when the machine is loaded (the prune then shows at once)
        wait_node(page, node, "pruned", timeout=240_000)
        assert drawing.inner_html() != stepped
        assert flow_state(page)["nodes"][node][0] == "pruned"
    print(f"browser test (embedded): planned after {planned - started:.1f} s, "
          f"whole run {time.monotonic() - started:.1f} s")


@pytest.fixture
def slow_plan_server():
    """Plans for planning requests, text for the rest, each answer after 1.5 s."""
    def responder(body):
        return json.dumps(PLAN) if body.get("response_format") else "Some **bold** text."

    with LoopbackServer(responder=responder, latency=1.5) as server:
        yield server


@pytest.mark.timeout(600)
def test_every_button_in_jupyterlab(lab, slow_plan_server):
    started = time.monotonic()
    server = lab(["%load_ext flowmagic", "%%flow demo --k 1\nMake tea"],
                 FLOWMAGIC_BASE_URL=slow_plan_server.base_url, FLOWMAGIC_MODEL="m")
    with notebook_page(server, ARTIFACTS / "browser-buttons.png") as page:
        button(page, "Run").click()
        wait_node(page, "facts", "running")
        # The kernel answers while the run goes on: the run is a task on its loop.
        state = flow_state(page)
        assert state["busy"] and state["nodes"]["facts"][0] == "running"
        button(page, "Stop").click()
        page.wait_for_function("() => !document.querySelector('.flowmagic-drawing svg "
                               "g.node.running')", timeout=60_000)
        state = flow_state(page)
        assert state["status"] == "stopped" and not state["busy"]
        assert {n[0] for n in state["nodes"].values()} == {"pending"}

        selects = page.locator(".flowmagic-panel select")
        selects.nth(0).select_option(label="post")
        choose(selects.nth(1), "gpt-5-nano")
        button(page, "Downgrade").click()
        wait_node(page, "post", "downgraded")
        assert flow_state(page)["nodes"]["post"][:2] == ["pending", "gpt-5-nano"]

        button(page, "Run").click()
        wait_node(page, "post", "done")
        assert wait_flow(page, lambda st: st["status"] == "done")["nodes"]["facts"][2] == 1
        selects.nth(0).select_option(label="facts")
        button(page, "Rerun").click()
        wait_node(page, "facts", "running")
        wait_node(page, "post", "done")
        state = wait_flow(page, lambda st: st["status"] == "done" and not st["busy"])
        # facts and its descendant post ran again; photo did not.
        assert {i: n[2] for i, n in state["nodes"].items()} == {"facts": 2, "photo": 1, "post": 2}

        button(page, "Show output").click()
        page.locator(".flowmagic-panel .flowmagic-output .jp-RenderedHTMLCommon strong",
                     has_text="bold").wait_for(timeout=30_000)
    print(f"browser test (buttons): {time.monotonic() - started:.1f} s")


@pytest.fixture
def quick_plan_server():
    """Plans for planning requests, text for the rest, at once."""
    def responder(body):
        return json.dumps(PLAN) if body.get("response_format") else "Some text."

    with LoopbackServer(responder=responder) as server:
        yield server


@contextlib.contextmanager
def kernel_busy(page, seconds: float = 6.0):
    """The kernel runs `time.sleep(seconds)` (as a long cell would) for the whole block, and
    the block's choices and clicks are made meanwhile; on leaving, wait until it is done."""
    page.evaluate("""s => {
      const k = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
      window.__fmBusy = k.requestExecute({code: `import time; time.sleep(${s})`,
                                          store_history: false}).done.then(() => true);
    }""", seconds)
    page.wait_for_function(f"() => !({KERNEL_IDLE})()", timeout=10_000, polling=20)
    started = time.monotonic()
    yield
    assert time.monotonic() - started < seconds, "the block outlasted the busy kernel"
    page.evaluate("() => window.__fmBusy")


def choose(select, text: str) -> None:
    """Choose the option whose text starts with `text`, as a user would (ipywidgets writes
    the spaces of option texts as no-break spaces: compared as spaces)."""
    texts = select.evaluate("sel => [...sel.options].map(o => o.textContent.replace(/\\s+/g, ' ')"
                            ".trim())")
    index = next((i for i, t in enumerate(texts) if t.startswith(text)), None)
    assert index is not None, (text, texts)
    select.select_option(index=index)


@pytest.mark.timeout(400)
def test_a_click_acts_on_the_node_and_model_chosen_just_before_it(lab, quick_plan_server):
    """The user picks a node and clicks at once while the kernel is busy (a cell runs): the
    kernel must act on the node and model the page showed at the click. ipywidgets holds a
    dropdown's second change back until the kernel answers the first, and sends a click at
    once; a panel whose click carries no choice prunes the node chosen before."""
    server = lab(["%load_ext flowmagic", "%%flow demo --k 1\nMake tea"],
                 FLOWMAGIC_BASE_URL=quick_plan_server.base_url, FLOWMAGIC_MODEL="m")
    with notebook_page(server, ARTIFACTS / "browser-click-race.png") as page:
        selects = page.locator(".flowmagic-panel select")
        models = json.loads(kernel_eval(page, "import json; from flowmagic.jupyter.widgets "
                                              "import model_choices; "
                                              "print(json.dumps(model_choices()))"))
        (first, _), (second, want) = models[-2], models[-1]
        with kernel_busy(page):
            choose(selects.nth(0), "post")    # sent at once: the dropdown had nothing in flight
            choose(selects.nth(0), "photo")   # held back until the kernel answers the first
            choose(selects.nth(1), first)
            choose(selects.nth(1), second)
            button(page, "Downgrade").click()
        state = wait_flow(page, lambda st: any(n[1] for n in st["nodes"].values()))
        assert {i: n[1] for i, n in state["nodes"].items() if n[1]} == {"photo": want}, state
        wait_node(page, "photo", "downgraded")

        with kernel_busy(page):
            choose(selects.nth(0), "facts")
            choose(selects.nth(0), "post")
            button(page, "Prune").click()
        state = wait_flow(page, lambda st: any(n[0] == "pruned" for n in st["nodes"].values()))
        assert {i for i, n in state["nodes"].items() if n[0] == "pruned"} == {"post"}, state
        wait_node(page, "post", "pruned")
        panel = page.locator(".flowmagic-panel")
        assert "pruned post" in " ".join(panel.inner_text().split())

        # Slim's row (shown once a probe set is attached): its click carries the tau typed
        # last, not the one the kernel was told before; "7" is refused in one red line.
        kernel_eval(page, "demo.attach_probe(['tea'], lambda result, example: 1.0)")
        tau = panel.locator(".flowmagic-field", has_text="tau").locator("input")
        tau.wait_for(state="visible", timeout=30_000)
        with kernel_busy(page):
            tau.fill("0.9")   # sent at once
            tau.fill("7")     # held back until the kernel answers the first
            button(page, "Slim").click()
        panel.get_by_text("tau must be a number in (0, 1], e.g. 0.95, not '7'").wait_for(
            timeout=30_000)
        assert kernel_eval(page, "print(demo.last_slim)").strip() == "None"


def run_cell(page, index: int) -> None:
    """Run one cell of the notebook as a user would (select it, Shift+Enter)."""
    page.evaluate("""async i => {
      const nb = window.jupyterapp.shell.currentWidget;
      nb.content.activeCellIndex = i;
      await window.jupyterapp.commands.execute('notebook:run-cell');
    }""", index)


def cell_output(page, index: int):
    return page.locator(".jp-Notebook .jp-Cell").nth(index).locator(".jp-OutputArea")


def wait_kernel(page, expression: str, expected, timeout: float = 30.0) -> None:
    """Wait until `expression`, evaluated in the kernel, equals `expected` (JSON)."""
    deadline = time.monotonic() + timeout
    while True:
        got = json.loads(kernel_eval(page, f"import json; print(json.dumps({expression}))"))
        if got == expected:
            return
        assert time.monotonic() < deadline, f"{expression} is {got!r}, not {expected!r}"
        time.sleep(0.2)


@pytest.fixture
def plan_server():
    """Plans for planning requests, text for the rest (dollars in it), each after 1.5 s."""
    def responder(body):
        if body.get("response_format"):
            return json.dumps(PLAN)
        return "The tea costs $3 and the cup $5; **steep** it."

    with LoopbackServer(responder=responder, latency=1.5) as server:
        yield server


@pytest.mark.timeout(600)
def test_the_notebook_experience_in_jupyterlab(lab, plan_server):
    """One JupyterLab session for the panel's parts a data scientist trips over: the
    legend, no slim row without a probe set, every candidate and a click to use one,
    unprune, a re-run cell that stops the old run, "pausing" at once, the result at the
    end, tables with dollars that MathJax leaves alone, and after a kernel restart and a
    reload, the static drawing in place of the dead widget and load(NAME) on the real run."""
    started = time.monotonic()
    server = lab(["%load_ext flowmagic", "%%flow demo --k 2\nMake tea", "%flow cost demo"],
                 FLOWMAGIC_BASE_URL=plan_server.base_url, FLOWMAGIC_MODEL="m")
    with notebook_page(server, ARTIFACTS / "browser-experience.png") as page:
        panel = page.locator(".flowmagic-panel")
        # 15: a legend; the Importance/Slim row only once a probe set is attached.
        assert "critical path" in panel.locator(".flowmagic-legend").inner_text()
        assert page.locator(".flowmagic-slim").is_hidden()
        assert button(page, "Slim").is_hidden() and button(page, "Importance").is_hidden()
        # 2: the static copy is in the output, hidden while the live panel is there.
        static = page.locator(".flowmagic-static")
        assert static.count() == 1 and static.is_hidden()
        # 6: every candidate, and a click to use another.
        selects = panel.locator("select")
        plans = selects.nth(2).evaluate("sel => [...sel.options].map(o => o.textContent)")
        assert len(plans) == 2 and all("candidate" in p for p in plans), plans
        other = 1 - json.loads(kernel_eval(page, "print(demo.chosen)"))
        selects.nth(2).select_option(index=other)
        button(page, "Use plan").click()
        wait_kernel(page, "demo.chosen", other)

        # 15: prune, then unprune, from the panel.
        selects.nth(0).select_option(label="photo")
        button(page, "Prune").click()
        wait_node(page, "photo", "pruned")
        assert page.locator(".flowmagic-drawing #edge-photo-post").count() == 0
        button(page, "Unprune").click()
        wait_node(page, "photo", "pending")
        page.locator(".flowmagic-drawing #edge-photo-post").wait_for(timeout=10_000)

        # 3: re-running the cell while its flow runs stops the old run, and says so.
        button(page, "Run").click()
        wait_node(page, "facts", "running")
        kernel_eval(page, "_old = demo")
        run_cell(page, 1)
        cell_output(page, 1).get_by_text("stopped the earlier run of 'demo'").wait_for(
            timeout=30_000)
        wait_kernel(page, "_old.status", "stopped")
        assert json.loads(kernel_eval(page, "print(json.dumps(_old.busy or demo is _old))")) \
            is False
        page.locator(".flowmagic-drawing svg").first.wait_for(timeout=60_000)

        # 7: Pause says at once what it waits for (the nodes take 1.5 s).
        button(page, "Run").click()
        wait_node(page, "facts", "running")
        button(page, "Pause").click()
        page.wait_for_function("() => document.querySelector('.flowmagic-panel').innerText"
                               ".includes('pausing: waiting for 2 running nodes to finish')",
                               timeout=1_000)
        wait_node(page, "facts", "done")
        wait_kernel(page, "demo.status", "paused")
        button(page, "Resume").click()
        # 4: the result, rendered, when the run ends.
        result = panel.locator(".flowmagic-result .jp-RenderedHTMLCommon")
        result.locator("strong", has_text="Result of demo").wait_for(timeout=60_000)
        assert "The tea costs $3 and the cup $5; steep it." in result.inner_text()
        page.wait_for_timeout(500)
        page.screenshot(path=str(ARTIFACTS / "browser-experience-result.png"), full_page=True)

        # 1: a table with dollar amounts keeps every row (MathJax leaves it alone).
        run_cell(page, 2)
        table = cell_output(page, 2).locator("table")
        table.wait_for(timeout=30_000)
        expected = json.loads(kernel_eval(page, "print(len(demo.cost()['rows']) + 1)"))
        page.wait_for_timeout(1_000)   # MathJax, if it were to typeset, has done so
        assert table.locator("tbody tr").count() == expected
        assert cell_output(page, 2).locator("mjx-container, .MathJax").count() == 0
        assert "$" in table.inner_text()
        done_run = json.loads(kernel_eval(page, "print(json.dumps(demo.run_id))"))

        # 2: save, restart the kernel, reopen: the static drawing shows where the widget was.
        page.wait_for_timeout(500)   # the static copy's last update
        page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
        page.wait_for_timeout(1_000)
        page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.session"
                      ".kernel.restart()")
        page.reload()
        page.wait_for_function(KERNEL_IDLE, timeout=120_000)
        static = page.locator(".flowmagic-static")
        static.locator("svg g.node").first.wait_for(state="visible", timeout=30_000)
        assert "flow 'demo' (done): 3/3 done" in static.inner_text()
        assert static.locator("svg g.node.done").count() == 3
        page.screenshot(path=str(ARTIFACTS / "browser-experience-reopened.png"), full_page=True)
        loaded = kernel_eval(page, "import flowmagic, json; f = flowmagic.load('demo'); "
                                   "print(json.dumps([f.run_id, f.status, f.result is not None]))")
        assert json.loads(loaded) == [done_run, "done", True]
    print(f"browser test (notebook experience): {time.monotonic() - started:.1f} s")


SALES = ("import pandas as pd\n"
         "sales = pd.DataFrame({'region': ['north', 'south', 'north', 'east', 'south', 'east'],\n"
         "                      'units': [3, 5, 7, 2, 8, 4]})")
EDA_PLAN = {"subtasks": [
    {"id": "totals", "requirement": "Total units per region.", "agent": "analyst", "depends_on": []},
    {"id": "chart", "requirement": "Bar chart of units per region.", "agent": "plotter",
     "depends_on": ["totals"]}]}
EDA_CODE = {
    "totals": "import pandas as pd\ndf = pd.read_csv('sales.csv')\n"
              "print(df.groupby('region')['units'].sum().to_string())",
    "chart": "import pandas as pd\nimport matplotlib.pyplot as plt\ndf = pd.read_csv('sales.csv')\n"
             "df.groupby('region')['units'].sum().plot.bar()\nplt.title('units per region')",
}


@pytest.fixture
def pandas_server():
    """Plans for planning requests; for each node, pandas code that reads the input file."""
    def responder(body):
        if body.get("response_format"):
            return json.dumps(EDA_PLAN)
        said = body["messages"][-1]["content"]
        node = re.search(r"Your subtask \((\w+)\)", said)
        if node and node.group(1) in EDA_CODE:
            return f"```python\n{EDA_CODE[node.group(1)]}\n```"
        return "Totals per region are in the table; the chart shows them."

    with LoopbackServer(responder=responder) as server:
        yield server


@pytest.mark.timeout(400)
def test_a_flow_cell_on_a_dataframe_runs_pandas_code_in_jupyterlab(lab, pandas_server):
    """`{{sales}}` from the kernel's namespace: the agents' pandas code runs in the sandbox on
    that frame, and the panel shows the numbers it really printed and the figure it drew."""
    import pandas as pd

    frame = pd.DataFrame({"region": ["north", "south", "north", "east", "south", "east"],
                          "units": [3, 5, 7, 2, 8, 4]})
    expected = " ".join(frame.groupby("region")["units"].sum().to_string().split())
    server = lab([SALES, "%load_ext flowmagic",
                  "%%flow demo --k 1 --run\nDescribe {{sales}}: total the units per region and "
                  "draw them."], FLOWMAGIC_BASE_URL=pandas_server.base_url, FLOWMAGIC_MODEL="m")
    with notebook_page(server, ARTIFACTS / "browser-dataframe.png") as page:
        panel = page.locator(".flowmagic-panel")
        panel.locator(".flowmagic-result strong", has_text="Result of demo").wait_for(timeout=120_000)
        state = flow_state(page)
        assert state["nodes"] == {"totals": ["done", None, 1], "chart": ["done", None, 1]}, state
        selects = panel.locator("select")
        selects.first.select_option(label="totals")
        button(page, "Show output").click()
        page.wait_for_function(
            "want => (' ' + document.querySelector('.flowmagic-panel').innerText.split(/\\s+/)"
            ".join(' ') + ' ').includes(' ' + want + ' ')", arg=expected, timeout=10_000)
        shown = " ".join(panel.inner_text().split())
        assert expected in shown                       # pandas' own totals, as printed
        assert "ran without error" in shown
        selects.first.select_option(label="chart")
        button(page, "Show output").click()
        figure = panel.locator("img[src^='data:image/png']")
        figure.first.wait_for(timeout=10_000)
        assert figure.first.evaluate("img => img.naturalWidth > 100")   # a real picture
        assert "chart_figure_1.png" in panel.inner_text()


# Model text that would run script if it were rendered as markup: it must show as text.
HOSTILE = ('<img src=x onerror="window.__fmPwned = (window.__fmPwned || 0) + 1"> '
           '<script>window.__fmPwned = 99</script> **bold** '
           '[click](javascript:window.__fmPwned=7) ![chart](http://127.0.0.1:9/chart.png)')
PWNED = "() => window.__fmPwned === undefined"
# a model id as an endpoint may list it: refused where it enters (issue 28), so the panel's
# model dropdown never holds it, as text or as markup
HOSTILE_MODEL = '<img src=x onerror="window.__fmPwned=3">m2'


@pytest.fixture
def hostile_server():
    """A plan whose requirement holds an <img onerror>, answers full of script, and a model
    list (GET /models) with markup in a model id."""
    plan = {"subtasks": [
        {"id": "facts", "requirement": 'List facts <img src=x onerror="window.__fmPwned=5">',
         "agent": "researcher", "depends_on": []},
        {"id": "post", "requirement": "Write the post.", "agent": "writer",
         "depends_on": ["facts"]}]}

    def responder(body):
        return json.dumps(plan) if body.get("response_format") else HOSTILE

    with LoopbackServer(responder=responder, models=["m", HOSTILE_MODEL]) as server:
        yield server


# The only images allowed on the page are JupyterLab's renderings of our own drawings: a PNG
# output, or an SVG output (trusted, once the cell has run), which JupyterLab shows as an <img>
# with the SVG in a data: URL. Any other <img> was built from model text (JupyterLab rewrites a
# model's src=x to a /files/ URL; a Markdown image keeps its remote src).
FOREIGN_IMAGES = """() => [...document.querySelectorAll('.jp-Notebook img')].filter(img => {
  const src = img.getAttribute('src') || '', box = img.parentElement;
  const png = box.matches('.jp-RenderedImage') && src.startsWith('data:image/png;base64,');
  const svg = box.matches('.jp-RenderedSVG') && src.startsWith('data:image/svg+xml,');
  return !(png || svg) || img.hasAttribute('onerror');
}).map(img => img.outerHTML.slice(0, 200))"""


def _no_active_markup(page) -> None:
    """Nothing ran, and no element that could run or call out was built from model text."""
    page.wait_for_timeout(1_000)   # an onerror would have fired by now
    found = [] if page.evaluate(PWNED) else [
        f"__fmPwned = {page.evaluate('() => window.__fmPwned')}"]
    found += page.evaluate(FOREIGN_IMAGES)
    found += [selector for selector in (".jp-OutputArea script", ".jp-OutputArea [onerror]",
                                        ".jp-OutputArea a[href^='javascript']",
                                        ".jp-OutputArea iframe")
              if page.locator(selector).count()]
    assert not found, found


@pytest.mark.timeout(600)
def test_model_html_runs_nothing_in_the_panel_or_an_exported_notebook(lab, hostile_server,
                                                                      tmp_path):
    """JupyterLab trusts the outputs of a notebook it ran itself, so only our sanitizer
    stands between a model's `<img onerror>` or `<script>` and the page (issue 13)."""
    started = time.monotonic()
    server = lab(["%load_ext flowmagic", "%%flow demo --k 1\nMake tea"],
                 FLOWMAGIC_BASE_URL=hostile_server.base_url, FLOWMAGIC_MODEL="m",
                 FLOWMAGIC_CHECK_MODELS="1")   # the model dropdown lists what the server lists
    with notebook_page(server, ARTIFACTS / "browser-hostile-panel.png") as page:
        panel = page.locator(".flowmagic-panel")
        button(page, "Run").click()
        wait_flow(page, lambda st: st["status"] == "done" and not st["busy"])
        panel.locator("select").first.select_option(label="facts")
        button(page, "Show output").click()
        shown = panel.locator(".flowmagic-output")
        shown.get_by_text("<script>window.__fmPwned = 99</script>").wait_for(timeout=30_000)
        assert "<img src=x onerror=" in shown.inner_text()
        assert shown.locator("strong", has_text="bold").count() == 1   # Markdown still renders
        result = panel.locator(".flowmagic-result")
        result.get_by_text("<script>window.__fmPwned = 99</script>").wait_for(timeout=30_000)
        models = panel.locator("select").nth(1).evaluate(
            "sel => [...sel.options].map(o => o.textContent)")
        assert not any("onerror" in t for t in models), models
        assert [t.split()[0] for t in models] == ["m"], models
        _no_active_markup(page)
        kernel_eval(page, "demo.to_notebook('exported.ipynb')")

    # The exported notebook, opened and run in JupyterLab (its outputs are then trusted).
    with contextlib.ExitStack() as stack:
        from playwright.sync_api import sync_playwright

        p = stack.enter_context(sync_playwright())
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        stack.callback(browser.close)
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        page.goto(f"{server['base']}/lab/tree/exported.ipynb?token={server['token']}")
        page.wait_for_function(KERNEL_IDLE, timeout=120_000)
        # as opened: the saved outputs (not trusted yet), down to the result cell's cost table
        page.locator(".jp-OutputArea-output th", has_text="tokens in").first.wait_for(
            timeout=120_000)
        _no_active_markup(page)
        # Judge only this run's outputs: cleared first, then every code cell has run again
        # (an execution count) and the kernel is idle.
        page.evaluate("async () => { const c = window.jupyterapp.commands;"
                      " await c.execute('notebook:clear-all-cell-outputs');"
                      " c.execute('notebook:run-all-cells'); }")
        try:
            page.wait_for_function(f"""() => {{
              const cells = window.jupyterapp.shell.currentWidget.content.model.cells;
              const code = [...cells].filter(c => c.type === 'code');
              return code.length > 0 && code.every(c => c.executionCount !== null
                && c.executionState === 'idle') && ({KERNEL_IDLE})();
            }}""", timeout=180_000)
        except Exception:
            raise AssertionError("the exported notebook did not run through; outputs:\n"
                                 + _outputs_text(page)[:3000])
        page.locator(".jp-OutputArea-output th", has_text="tokens in").first.wait_for()
        assert page.locator(".jp-RenderedSVG img").count() >= 2   # trusted: drawing, timeline
        _no_active_markup(page)
        outputs = _outputs_text(page)
        assert outputs.count("<script>window.__fmPwned = 99</script>") >= 2, outputs[:2000]
        assert outputs.count("<img src=x onerror=") >= 2, outputs[:2000]   # node cells, result
        page.screenshot(path=str(ARTIFACTS / "browser-hostile-export.png"), full_page=True)
    print(f"browser test (hostile output): {time.monotonic() - started:.1f} s")
