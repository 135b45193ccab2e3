"""Model text shown as HTML or Markdown runs nothing, wherever flowmagic shows it (issue 13).

A corpus of hostile answers goes through every view of model text: the panel (Show output
while a node streams and once it is done, the result, node info, the candidate list), the
ChatView, the exported notebook (its Markdown cells and outputs), the same notebook run
again (replayed `%%flow_node` cells and the result), and an exported orchestration. Each
bundle is read as JupyterLab would render it: text/html as it is, text/markdown with raw
HTML passed through and every link kept (JupyterLab trusts the outputs of a notebook it ran
itself, so nothing else cleans them). Nothing that could run, load or submit may be built.
tests/test_browser.py checks the same in JupyterLab itself.
"""

import json
import re
from html.parser import HTMLParser

import nbformat
import pytest
from nbclient import NotebookClient

import flowmagic
from flowmagic.flow import Flow
from flowmagic.llm import LLM
from flowmagic.testing.loopback import LoopbackServer

HOSTILE = [
    "<script>window.pwned = 1</script>",
    '<img src=x onerror="window.pwned = 1">',
    '<svg onload="window.pwned = 1"><circle r="5"/></svg>',
    '<iframe src="https://evil.example/"></iframe>',
    '<a href="javascript:window.pwned = 1">click</a>',
    '<a href="jav&#x61;script:window.pwned = 1">click</a>',
    "[click](javascript:window.pwned=1)",
    "[click](jav&#x61;script:window.pwned=1)",
    "[click](  JaVa\tScRiPt:window.pwned=1)",
    '**bold** and <b onmouseover="window.pwned = 1">raw HTML</b> inside Markdown',
    '<div onclick="window.pwned = 1">\n\n*Markdown inside a raw block*\n\n</div>',
    "![chart](data:image/svg+xml;base64,PHN2ZyBvbmxvYWQ9ImFsZXJ0KDEpIi8+)",
    '<img src="data:image/svg+xml,<svg onload=alert(1)>">',
    '<object data="data:text/html,<script>window.pwned=1</script>"></object>',
    '<form action="https://evil.example"><input name="q"><button>go</button></form>',
    "<style>body { display: none }</style>",
    '<p style="position:fixed;top:0;left:0;width:100%;height:100%">over the page</p>',
    '<details open ontoggle="window.pwned = 1">x</details>',
    '<meta http-equiv="refresh" content="0;url=https://evil.example/">',
    "```\nclosed early\n```\n</div><script>window.pwned = 1</script>",
]
# What a user must still be able to read: raw HTML shows as the text it is.
SHOWN = ["<script>window.pwned = 1</script>", '<img src=x onerror="window.pwned = 1">']

_ACTIVE_TAGS = {"script", "iframe", "frame", "object", "embed", "form", "input", "button",
                "img", "svg", "math", "style", "link", "meta", "base", "body", "video",
                "audio", "source", "picture", "template"}
_URL_ATTRS = {"href", "src", "action", "formaction", "data", "srcset", "poster", "xlink:href"}


class _Page(HTMLParser):
    """The elements, attributes and text a browser builds from some HTML."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.elements, self.text = [], []

    def handle_starttag(self, tag, attrs):
        self.elements.append((tag, dict(attrs)))

    handle_startendtag = handle_starttag

    def handle_data(self, data):
        self.text.append(data)


def _parse(html: str) -> _Page:
    page = _Page()
    page.feed(html)
    page.close()
    return page


def _active(html: str) -> list[str]:
    """What in `html` would run, load, submit or restyle something in a browser."""
    bad = []
    for tag, attrs in _parse(html).elements:
        if tag in _ACTIVE_TAGS:
            bad.append(f"<{tag}>")
        for name, value in attrs.items():
            # browsers ignore ASCII whitespace and control characters inside a URL scheme
            url = re.sub(r"[\x00-\x20]", "", value or "").lower()
            if (name.startswith("on") or name == "style"
                    or name in _URL_ATTRS and url.startswith(("javascript:", "data:", "vbscript:"))):
                bad.append(f"<{tag} {name}={value!r}>")
    return bad


def _trusting_markdown(text: str) -> str:
    """Markdown rendered as JupyterLab renders a trusted output: raw HTML kept, any link."""
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"])
    md.validateLink = lambda url: True
    return md.render(text)


def _rendered(data: dict) -> str:
    """The HTML a front end builds from a MIME bundle (it prefers HTML to Markdown)."""
    if "text/html" in data:
        return data["text/html"]
    if "text/markdown" in data:
        return _trusting_markdown(data["text/markdown"])
    return ""


def _check(where: str, html: str, problems: list[str]) -> None:
    bad = _active(html)
    if bad:
        problems.append(f"{where}: {bad}")


def _shown_as_text(html: str) -> str:
    return "".join(_parse(html).text)


# -- a real flow whose model answers with the corpus ------------------------------------------
def _index(body: dict) -> str:
    """Node i is asked "answer #i"; the final write-up sees every node, so gets them all."""
    asked = set(re.findall(r"answer #(\d+)", body["messages"][-1]["content"]))
    if len(asked) == 1:
        return HOSTILE[int(asked.pop())]
    return "\n\n".join(HOSTILE)


@pytest.fixture
def hostile():
    with LoopbackServer(responder=_index) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        yield server


def _plan() -> dict:
    return {"nodes": [{"id": f"n{i}", "requirement": f"answer #{i}: {text}", "agent": "writer"}
                      for i, text in enumerate(HOSTILE)], "edges": []}


def _hostile_flow(task: str = "t", **settings) -> Flow:
    return Flow.from_dict(_plan(), task=task, llm=LLM(backoff_base=0.01), consolidate=True,
                          **settings)


def test_the_panel_shows_hostile_model_text_as_text(hostile):
    from flowmagic.engine.planner import Candidate
    from flowmagic.jupyter.widgets import Panel

    flow = _hostile_flow(concurrency=4)
    panel = Panel(flow)   # streaming on: Show output follows the text as it arrives
    streamed: list[tuple[str, dict]] = []

    def watch(event):
        if event["kind"] == "text":
            panel.show_output(event["node"])
            streamed.append((event["node"], panel.output.outputs[0]["data"]))

    flow.subscribe(watch)
    flow.run()
    assert flow.status == "done" and len({node for node, _ in streamed}) == len(HOSTILE)
    problems: list[str] = []
    for node, data in streamed:
        _check(f"Show output of {node} while it streams", _rendered(data), problems)
    for i, node in enumerate(flow.workflow.nodes):
        panel.node_picker.value = node
        panel.show_output(node)
        shown = _rendered(panel.output.outputs[0]["data"])
        _check(f"Show output of {node}", shown, problems)
        _check(f"node info of {node}", panel.node_info.value, problems)
        if HOSTILE[i] in SHOWN:
            assert HOSTILE[i] in _shown_as_text(shown)
            assert HOSTILE[i] in _shown_as_text(panel.node_info.value)
    result = _rendered(panel.result.outputs[0]["data"])
    _check("the result", result, problems)
    assert all(text in _shown_as_text(result) for text in SHOWN)
    flow.candidates = [Candidate(i, i, error=f"ModelOutputError: {text}")
                       for i, text in enumerate(HOSTILE)]
    panel.refresh()
    _check("the candidate list", panel.candidates.value, problems)
    assert SHOWN[0] in _shown_as_text(panel.candidates.value)
    panel.close()
    assert not problems, "\n".join(problems)


def test_the_chat_view_and_an_exported_orchestration_show_hostile_text_as_text(tmp_path):
    from flowmagic.jupyter.chatview import ChatView
    from flowmagic.orchestrator.protocol import Message, Orchestration

    o = Orchestration("run1", "Total the sales", [], {}, answer="\n\n".join(HOSTILE),
                      status="submitted", ended_by="submit")
    o.transcript = [Message(i, 1, "analyst", "orchestrator", "reply", text)
                    for i, text in enumerate(HOSTILE)]
    view = ChatView(o)
    problems: list[str] = []
    boxes = [*view.messages.children, *view.answer.children]
    assert len(boxes) == len(HOSTILE) + 1
    for box in boxes:
        shown = _rendered(box.outputs[0]["data"])
        _check("ChatView", shown, problems)
    assert SHOWN[0] in _shown_as_text(_rendered(view.answer.children[0].outputs[0]["data"]))
    view.close()
    nb = nbformat.read(o.to_notebook(tmp_path / "orch.ipynb"), as_version=4)
    cells = [c.source for c in nb.cells if c.cell_type == "markdown"]
    for source in cells:
        _check("exported transcript cell", _trusting_markdown(source), problems)
    assert any(SHOWN[0] in _shown_as_text(_trusting_markdown(s)) for s in cells)
    assert not problems, "\n".join(problems)


def _notebook_problems(nb, where: str) -> list[str]:
    problems: list[str] = []
    for n, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            _check(f"{where} Markdown cell {n}", _trusting_markdown(cell.source), problems)
        for out in cell.get("outputs", []):
            _check(f"{where} cell {n} output", _rendered(out.get("data", {})), problems)
    return problems


def test_an_exported_notebook_and_its_replay_show_hostile_text_as_text(hostile, tmp_path):
    # the task too (its {{df}} part quotes the columns of a data file that came from elsewhere)
    flow = _hostile_flow(task=f"Explore the table {SHOWN[1]}")
    flow.run()
    assert flow.status == "done"
    # a code node (its note cell quotes the model's requirement), and files named by its code
    flow.workflow.nodes["n0"].execution = {"ran": True, "ok": True, "code": "print(1)",
                                          "stdout": "1\n"}
    for i, name in enumerate(["a`<img src=x onerror=window.pwned=1>`.csv",
                              "[b](javascript:window.pwned=1).txt"]):
        (flow.workspace.root / name).write_text(str(i))
    path = flow.to_notebook(tmp_path / "hostile.ipynb")
    nb = nbformat.read(path, as_version=4)
    problems = _notebook_problems(nb, "exported")
    markdown = "".join(_shown_as_text(_trusting_markdown(c.source))
                       for c in nb.cells if c.cell_type == "markdown")

    NotebookClient(nb, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    problems += _notebook_problems(nb, "replayed")
    outputs = [o for c in nb.cells for o in c.get("outputs", [])]
    assert not [o for o in outputs if o["output_type"] == "error"], outputs
    replayed = [o for o in outputs if (o.get("metadata", {}).get("flowmagic") or {}).get("node")]
    assert not problems, "\n".join(problems)
    assert "answer #0: <script>" in markdown   # the code node's note
    assert f"Explore the table {SHOWN[1]}" in markdown   # the title cell shows the task as text
    assert "a`<img src=x onerror=window.pwned=1>`.csv" in markdown   # the files, as code
    assert any(SHOWN[1] in _shown_as_text(_rendered(o["data"])) for o in replayed)


def test_a_trials_report_quoting_the_model_is_inert():
    from flowmagic.evaluate.trials import Trial, TrialReport

    report = TrialReport([Trial(condition="c", mask_rate=0.0, index=0, seed=0, error=HOSTILE[1])], {})
    data = {"text/html": report._repr_html_()} if hasattr(report, "_repr_html_") else {
        "text/markdown": report._repr_markdown_()}
    html = _rendered(data)
    assert not _active(html), html
    assert SHOWN[1] in _shown_as_text(html)


# -- the sanitizer itself -----------------------------------------------------------------------
@pytest.mark.parametrize("text", HOSTILE)
def test_the_sanitizer_removes_what_runs(text):
    from flowmagic.view.safe import markdown_html, sanitize_html

    assert not _active(sanitize_html(text)), sanitize_html(text)
    html = markdown_html(f"Here you go:\n\n{text}\n\nDone.")
    assert not _active(html) and "Done." in html, html


def test_markdown_and_code_stay_what_they_are():
    from flowmagic.view.safe import markdown_cell, markdown_html

    text = ("# Findings\n\nThe mean is **4.2** and [the docs](https://example.com) say so.\n\n"
            "```python\nif a < b and c > d:\n    print('<b>not bold</b>')\n\n[x](javascript:y)\n```\n\n"
            "| x | y |\n|---|---|\n| 1 | $2 |\n\nIt costs $3 and $5.")
    html = markdown_html(text)
    assert "<h1>Findings</h1>" in html and "<strong>4.2</strong>" in html
    assert '<a href="https://example.com" rel="noopener noreferrer nofollow">the docs</a>' in html
    # the code is code, character for character, never markup
    assert ("<pre><code>if a &lt; b and c &gt; d:\n    print('&lt;b&gt;not bold&lt;/b&gt;')\n\n"
            "[x](javascript:y)\n</code></pre>") in html
    assert "<table>" in html and "<td>$2</td>" in html
    # dollars stay text: the block is one MathJax skips (issue 15)
    assert html.startswith('<div class="flowmagic-model-text tex2jax_ignore mathjax_ignore">')
    assert "It costs $3 and $5." in html
    # In a Markdown cell the same HTML is one raw block: nothing in it is parsed again.
    cell = markdown_cell(text)
    assert "\n" not in cell and _trusting_markdown(cell).strip() == cell
    assert not _active(_trusting_markdown(cell))


def test_a_models_image_shows_its_alt_text_and_loads_nothing():
    from flowmagic.view.safe import markdown_html

    html = markdown_html('Sales:\n\n![monthly <b>sales</b> chart](https://evil.example/p.png "t")'
                         "\n\n![](https://evil.example/q.png)")
    assert not _active(html) and "evil.example" not in html, html
    assert "[image: monthly <b>sales</b> chart]" in _shown_as_text(html)
    assert "[image]" in _shown_as_text(html)


def test_a_bundle_has_html_and_the_plain_text_but_no_markdown():
    from flowmagic.view.safe import model_bundle

    bundle = model_bundle("<img src=x onerror=alert(1)> **hi**", head="**node** (writer)\n\n")
    assert set(bundle) == {"text/html", "text/plain"}
    assert bundle["text/plain"] == "<img src=x onerror=alert(1)> **hi**"
    assert "&lt;img src=x onerror=alert(1)&gt; <strong>hi</strong>" in bundle["text/html"]
    assert "<strong>node</strong> (writer)" in bundle["text/html"]


def test_one_sanitizer_module():
    """Every view of model text imports view/safe.py; there is no second copy of it."""
    from conftest import ROOT

    sources = {p.relative_to(ROOT).as_posix(): p.read_text(encoding="utf-8")
               for p in (ROOT / "flowmagic").rglob("*.py")}
    assert [p for p, s in sources.items() if re.search(r"^\s*import (nh3|bleach)|^\s*from "
                                                       r"(nh3|bleach|markdown_it)\b", s, re.M)] \
        == ["flowmagic/view/safe.py"]
    for module in ("flowmagic/jupyter/widgets.py", "flowmagic/jupyter/chatview.py",
                   "flowmagic/ops/replay.py", "flowmagic/ops/export.py",
                   "flowmagic/view/display.py", "flowmagic/orchestrator/protocol.py"):
        assert "view.safe import" in sources[module] or ".safe import" in sources[module], module
    assert not (ROOT / "flowmagic" / "llm" / "redact.py").exists()
    assert "text/markdown" not in json.dumps([sources["flowmagic/ops/replay.py"],
                                              sources["flowmagic/jupyter/widgets.py"],
                                              sources["flowmagic/jupyter/chatview.py"]])
