"""Checks of a run's deliverables, as the paper's three tasks need them; one line each.

- a web page (`index.html`): it parses as HTML and has the parts the task asked for;
- a gobang program (`gobang.py`): its game logic passes tests run in the sandbox, headless
  (a GUI toolkit that is missing or needs a display is replaced by a stand-in, so a GUI
  import cannot make the check impossible);
- Beamer slides (`slides.tex`): it compiles when a LaTeX engine is installed, inside the
  sandbox (the engine sees the slides' folder and the TeX installation, read-only but for
  that folder; no network; shell escape off), else one line says the compile was skipped;
  its frames are counted either way.

`check_deliverables(flow)` runs the checks that apply to the files in the flow's workspace.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

__all__ = ["Check", "check_html", "check_gobang", "check_latex", "check_deliverables",
           "GOBANG_TESTS"]


@dataclass
class Check:
    file: str
    ok: bool | None      # None: skipped
    line: str

    def __str__(self) -> str:
        return self.line


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)

    def handle_data(self, data):
        self.text.append(data)


def check_html(path: Path, must_mention: tuple[str, ...] = ()) -> Check:
    """It parses as HTML, has an <html> or <body>, and mentions every word asked for."""
    name = path.name
    if not path.is_file():
        return Check(name, False, f"{name}: missing; no node wrote it")
    parser = _Tags()
    try:
        parser.feed(path.read_text(encoding="utf-8", errors="replace"))
        parser.close()
    except Exception as exc:  # noqa: BLE001 - any parser failure is the check's answer
        return Check(name, False, f"{name}: does not parse as HTML ({type(exc).__name__}: {exc})")
    if not {"html", "body"} & set(parser.tags):
        return Check(name, False, f"{name}: parses, but has no <html> or <body> element")
    text = " ".join(parser.text).lower() + " " + " ".join(parser.tags)
    missing = [w for w in must_mention if w.lower() not in text]
    if missing:
        return Check(name, False, f"{name}: parses ({len(parser.tags)} elements) but never "
                                  f"mentions {', '.join(missing)}")
    return Check(name, True, f"{name}: parses as HTML ({len(parser.tags)} elements)"
                             + (f", mentions {', '.join(must_mention)}" if must_mention else ""))


# The logic API the gobang task asks for; the GUI runs only under `if __name__ == "__main__"`.
GOBANG_TESTS = '''
import os, sys, types
from unittest import mock
sys.path.insert(0, os.getcwd())
for gui in ("pygame", "tkinter", "tkinter.messagebox", "tkinter.ttk"):
    try:
        __import__(gui)
    except Exception:
        sys.modules[gui] = mock.MagicMock(name=gui)
import gobang

def _board():
    return gobang.new_board(15)

def _line(cells, player=1):
    b = _board()
    for r, c in cells:
        b = gobang.place(b, r, c, player) or b
    return b

def test_five_in_a_row_wins_every_way():
    assert gobang.winner(_line([(7, c) for c in range(3, 8)])) == 1
    assert gobang.winner(_line([(r, 2) for r in range(0, 5)], 2)) == 2
    assert gobang.winner(_line([(i, i) for i in range(4, 9)])) == 1
    assert gobang.winner(_line([(i, 10 - i) for i in range(2, 7)])) == 1

def test_four_is_not_five():
    assert gobang.winner(_line([(7, c) for c in range(3, 7)])) in (None, 0)
    assert gobang.winner(_board()) in (None, 0)

def test_the_ai_plays_an_empty_cell_and_takes_a_win():
    b = _line([(7, c) for c in range(3, 7)], 2)
    move = gobang.ai_move(b, 2)
    assert tuple(move) in ((7, 2), (7, 7))
    b = _line([(0, 0)], 1)
    r, c = gobang.ai_move(b, 2)
    assert 0 <= r < 15 and 0 <= c < 15 and (r, c) != (0, 0)
'''


def check_gobang(path: Path, timeout: float = 30.0) -> Check:
    """The logic of gobang.py (new_board, place, winner, ai_move) under tests, in the sandbox."""
    from ..engine.answer_code import run_python
    from ..engine.workspace import Workspace

    name = path.name
    if not path.is_file():
        return Check(name, False, f"{name}: missing; no node wrote it")
    ex = run_python(Workspace(path.parent), "gobang_check", GOBANG_TESTS + _CALL_TESTS,
                    timeout=timeout)
    if ex.ok:
        return Check(name, True, f"{name}: its game logic passed {ex.stdout.strip()} in the sandbox")
    return Check(name, False, f"{name}: its game logic failed in the sandbox: {ex.error}")


_CALL_TESTS = '''
_names = [n for n in list(globals()) if n.startswith("test_")]
for _n in _names:
    globals()[_n]()
print(f"{len(_names)} tests")
'''

_ENGINES = ("latexmk", "pdflatex", "tectonic")


# Runs inside the sandbox: the engine as a child of the sandbox's Python, TeX's caches on its
# private /tmp, writes and reads of TeX itself limited to the working folder (openout_any,
# openin_any = paranoid), \write18 off however the .tex or a texmf.cnf asks.
_COMPILE = """
import os, subprocess, sys
os.environ.update(TEXMFVAR="/tmp/texmf-var", TEXMFCONFIG="/tmp/texmf-config",
                  openout_any="p", openin_any="p", shell_escape="f")
try:
    run = subprocess.run({argv!r}, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                         timeout={timeout!r})
except subprocess.TimeoutExpired:
    print("! the engine did not finish in time"); sys.exit(124)
except OSError as exc:
    print(f"! cannot start the engine in the sandbox: {{exc}}"); sys.exit(127)
sys.stdout.write(run.stdout[-6000:])
sys.exit(run.returncode)
"""


def _tex_dirs(engine: str) -> list[str]:
    """Host folders the engine needs that the sandbox does not show already (it shows /usr):
    a TeX Live tree elsewhere (.../bin/<arch>/pdflatex -> the tree), Debian's generated formats."""
    real = Path(os.path.realpath(engine))
    tree = real.parents[2] if real.parent.parent.name == "bin" else real.parent
    found = [] if str(tree).startswith("/usr/") else [str(tree)]
    return found + [d for d in ("/var/lib/texmf", "/etc/texmf") if os.path.isdir(d)]


def check_latex(path: Path, timeout: float = 120.0, expect_frames: int | None = None,
                sandbox: str = "bwrap") -> Check:
    """Compile the .tex in the sandbox when a LaTeX engine is installed (shell escape off);
    count its frames."""
    from ..engine.sandbox import run_code
    from ..errors import SandboxError

    name = path.name
    if not path.is_file():
        return Check(name, False, f"{name}: missing; no node wrote it")
    text = path.read_text(encoding="utf-8", errors="replace")
    frames = len(re.findall(r"\\begin\{frame\}", text))
    count = f"{frames} frames" + (f" of the {expect_frames} asked for" if expect_frames else "")
    engine = next((e for e in _ENGINES if shutil.which(e)), None)
    if engine is None:
        return Check(name, None, f"{name}: {count}; compile skipped: no LaTeX engine "
                                 f"({', '.join(_ENGINES)}) is installed")
    where = os.path.realpath(shutil.which(engine))
    argv = {"latexmk": [where, "-pdf", "-no-shell-escape", "-interaction=nonstopmode", name],
            "pdflatex": [where, "-no-shell-escape", "-interaction=nonstopmode",
                         "-halt-on-error", name],
            "tectonic": [where, "--untrusted", name]}[engine]
    try:
        run = run_code(_COMPILE.format(argv=argv, timeout=timeout), workdir=path.parent,
                       inputs=_tex_dirs(where), timeout=timeout + 15, memory_mb=2048,
                       file_limit_mb=256, sandbox=sandbox)
    except SandboxError as exc:
        return Check(name, False, f"{name}: not compiled: {exc}")
    pdf = path.with_suffix(".pdf")
    if run.timed_out or run.returncode == 124:
        return Check(name, False, f"{name}: {engine} did not finish within {timeout:.0f} s")
    if run.ok and pdf.is_file():
        return Check(name, True, f"{name}: compiled with {engine} in the sandbox ({count})")
    errors = [line for line in run.stdout.splitlines() if line.startswith("!")]
    return Check(name, False, f"{name}: {engine} failed: "
                              f"{errors[0] if errors else 'exit status %d' % run.returncode}")


def check_deliverables(flow, *, html_words: tuple[str, ...] = (),
                       frames: int | None = None) -> list[Check]:
    """The checks that apply to the flow's files, each printed as one line."""
    root = flow.workspace.root
    files = flow.files()
    checks = []
    for rel in files:
        path = root / rel
        if rel.endswith((".html", ".htm")) and Path(rel).name == "index.html":
            checks.append(check_html(path, html_words))
        elif Path(rel).name == "gobang.py":
            checks.append(check_gobang(path))
        elif rel.endswith(".tex"):
            checks.append(check_latex(path, expect_frames=frames,
                                      sandbox=flow.settings.sandbox or "bwrap"))
    if not checks:
        checks.append(Check("-", False, "no deliverable to check: the run wrote "
                                        + (", ".join(files) if files else "no files")))
    for check in checks:
        print(check)
    return checks
