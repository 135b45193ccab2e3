"""The Flow paper's per-criterion scores (its Tables 1-3): each criterion 0 or 1, checked by
a program wherever a program can, by an LLM judge only where none can, and "not checkable"
(None) when neither can here (no TeX engine for "compiles"). A template declares its
criteria by name in its metadata (`flowmagic.template.criteria`); `score(names, folder,
params)` scores the files a run left in `folder`.

- website: the basic facts (name, dates, place, organiser: from the template's parameters)
  in the page's text; a schedule part (with times) and a venue part; an embedded map. The
  HTML is parsed with html.parser.
- gobang: `gobang.py` runs in the sandbox only, headless, under a stand-in GUI that records
  what the program asks of it: the board (new_board / place / winner on scripted lines of
  stones), interactable (the program starts and binds a mouse click), the black/white
  choice (a dialog, button or menu that offers it), an AI opponent (ai_move plays a legal
  move through a scripted game, takes its own win and blocks the player's four).
- beamer: compiles (in the sandbox, when a TeX engine is installed), the page count (the
  PDF's pages, else the frames in the source, within 10% of the pages asked for), and
  completeness (every algorithm with its motivation, problem, intuition and equations),
  which only a reader can judge: the LLM judge.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any, Awaitable, Callable

from ..errors import ConfigError

__all__ = ["Score", "CRITERIA", "score", "read_text", "GOBANG_PROBE"]

_MAX_READ = 2_000_000   # bytes of one deliverable read on the host
Judge = Callable[[str, str], Awaitable[tuple[bool, str]]]   # (question, text) -> (pass, why)


@dataclass
class Score:
    criterion: str
    value: float | None      # 1.0, 0.0, or None: not checkable here
    how: str                 # "program", "LLM judge" or "not checkable"
    note: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def read_text(folder: Path, rel: str) -> str | None:
    """A deliverable's text, or None: never through a symlink, never outside `folder`
    (the files were written by model code), at most _MAX_READ bytes."""
    root = Path(folder).resolve()
    path = root / rel
    probe = root
    for part in Path(rel).parts:
        probe = probe / part
        if probe.is_symlink():
            return None
    if not path.is_file() or root not in path.resolve().parents:
        return None
    with open(path, "rb") as fh:
        return fh.read(_MAX_READ).decode("utf-8", errors="replace")


def _files(folder: Path, suffix: str) -> list[str]:
    root = Path(folder)
    if not root.is_dir():
        return []
    found = sorted(str(p.relative_to(root)) for p in root.rglob(f"*{suffix}")
                   if ".flowmagic" not in p.parts)
    return found[:50]


# -- website -------------------------------------------------------------------------------------
class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.text: list[str] = []
        self.labels: list[str] = []     # ids, classes and headings: where a part is named (a
        # link to a part that is not there names nothing)
        self.iframes: list[str] = []
        self._heading = False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.labels += [str(attrs.get(k) or "") for k in ("id", "class", "name")]
        if tag == "iframe":
            self.iframes.append(str(attrs.get("src") or ""))
        self._heading = tag in ("h1", "h2", "h3", "h4", "h5", "h6", "caption", "legend")

    def handle_endtag(self, tag):
        self._heading = False

    def handle_data(self, data):
        self.text.append(data)
        if self._heading:
            self.labels.append(data)


def _site(folder: Path) -> tuple[_Page, list[str]] | None:
    names = _files(folder, ".html") + _files(folder, ".htm")
    if not names:
        return None
    page = _Page()
    for rel in names:
        text = read_text(folder, rel)
        if text is not None:
            page.feed(text)
    page.close()
    return page, names


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def _facts(params: dict) -> dict[str, list[str]]:
    """What must appear for each basic fact, from the template's parameters."""
    name = str(params.get("conference", ""))
    short = re.search(r"\(([^)]+)\)", name)
    dates = [d.strip(" ,.") for d in re.split(r"\bto\b|–|—|\s-\s", str(params.get("dates", "")))]
    ends = [" ".join(d.split()[:2]).strip(" ,.") for d in dates if d]
    return {"name": [short.group(1) if short else name],
            "dates": ends,
            "place": [str(params.get("place", "")).split(",")[0]],
            "organiser": [str(params.get("organizer", params.get("organiser", "")))]}


def _website_facts(folder: Path, params: dict, **_: Any) -> Score:
    site = _site(folder)
    if site is None:
        return Score("basic facts", 0.0, "program", "no .html file")
    text = _norm(" ".join(site[0].text))
    missing = [what for what, parts in _facts(params).items()
               if not all(re.search(r"(?<!\w)" + re.escape(_norm(p)) + r"(?!\w)", text)
                          for p in parts if p)]
    return Score("basic facts", 0.0 if missing else 1.0, "program",
                 f"missing: {', '.join(missing)}" if missing else "name, dates, place, organiser")


def _website_pages(folder: Path, params: dict, **_: Any) -> Score:
    site = _site(folder)
    if site is None:
        return Score("schedule and venue", 0.0, "program", "no .html file")
    page, names = site
    labels = _norm(" ".join(page.labels + names))
    times = len(re.findall(r"\b\d{1,2}[:.]\d{2}\b", " ".join(page.text)))
    parts = {"schedule": bool(re.search(r"schedule|programme|program\b|agenda", labels)) and times >= 2,
             "venue": "venue" in labels}
    missing = [k for k, ok in parts.items() if not ok]
    note = (f"missing: {', '.join(missing)}" if missing else "both parts") + f"; {times} times of day"
    return Score("schedule and venue", 0.0 if missing else 1.0, "program", note)


def _website_map(folder: Path, params: dict, **_: Any) -> Score:
    site = _site(folder)
    maps = [s for s in (site[0].iframes if site else []) if re.search(r"map", s, re.I)]
    return Score("map", 1.0 if maps else 0.0, "program",
                 "an embedded map (iframe)" if maps else "no iframe showing a map")


# -- gobang -----------------------------------------------------------------------------------------
# Runs in the sandbox with the deliverable's folder as its working directory. The GUI
# toolkits are replaced by recording stand-ins (there is no display), the program is run
# as __main__ for at most a few seconds, and the logic is played with scripted moves.
GOBANG_PROBE = r'''
import json, os, re, runpy, signal, sys
from unittest import mock
sys.path.insert(0, os.getcwd())
gui = {}
for name in ("tkinter", "tkinter.messagebox", "tkinter.simpledialog", "tkinter.ttk", "pygame",
             "pygame.locals"):
    gui[name] = sys.modules[name] = mock.MagicMock(name=name)
sys.modules["tkinter"].messagebox = gui["tkinter.messagebox"]
sys.modules["tkinter"].simpledialog = gui["tkinter.simpledialog"]
sys.modules["tkinter"].ttk = gui["tkinter.ttk"]
out = {}
def check(name, fn):
    try:
        fn()
        out[name] = [1, "passed"]
    except Exception as exc:
        out[name] = [0, (type(exc).__name__ + ": " + str(exc))[:200]]

class _Stop(BaseException):
    pass
def _alarm(*_):
    raise _Stop()
signal.signal(signal.SIGALRM, _alarm)
signal.alarm(5)
started = "ran to its end"
try:
    runpy.run_path("gobang.py", run_name="__main__")
except _Stop:
    started = "still running after 5 s (an event loop)"
except SystemExit:
    pass
except BaseException as exc:
    started = "raised " + type(exc).__name__ + ": " + str(exc)[:150]
signal.alarm(0)
calls = []
for m in gui.values():
    for c in m.mock_calls:
        calls.append((str(c[0]), " ".join([str(a) for a in c[1]]
                                          + [f"{k}={v}" for k, v in c[2].items()])))
source = open("gobang.py", encoding="utf-8", errors="replace").read()
clicks = [n for n, a in calls if n.endswith("bind") and re.search(r"Button|<1>|Click", a)]
clicks += [n for n, a in calls if "command=" in a or n.endswith(("Button", "Canvas.bind"))]
pg_click = "MOUSEBUTTONDOWN" in source and not started.startswith("raised")
out["interactable"] = [1 if (clicks or pg_click) and not started.startswith("raised") else 0,
                       f"the program {started}; " + (f"mouse handlers: {len(clicks)}" if clicks
                       else "pygame mouse events" if pg_click else "no mouse handler bound")]
offer = [n for n, a in calls if re.search(r"black|white", a, re.I)
         and re.search(r"ask|Button|Radiobutton|OptionMenu|Combobox|render", n)]
out["black/white choice"] = [1 if offer else 0, f"offered by {offer[0]}" if offer else
                             "no dialog, button or menu offers black or white"]
import gobang

def board_rules():
    b = gobang.new_board(15)
    assert len(b) == 15 and all(len(r) == 15 and not any(r) for r in b), "new_board(15) is not 15 x 15 of 0"
    b = gobang.place(b, 7, 7, 1) or b
    assert b[7][7] == 1, "place() did not put the stone"
    for cells, who in (([(7, c) for c in range(3, 8)], 1), ([(r, 2) for r in range(5)], 2),
                       ([(i, i) for i in range(4, 9)], 1), ([(i, 10 - i) for i in range(2, 7)], 2)):
        b = gobang.new_board(15)
        for r, c in cells:
            b = gobang.place(b, r, c, who) or b
        assert gobang.winner(b) == who, f"five at {cells[0]}..{cells[-1]} not seen"
    b = gobang.new_board(15)
    for c in range(4):
        b = gobang.place(b, 0, c, 1) or b
    assert gobang.winner(b) in (None, 0), "four counted as five"
check("board", board_rules)

def opponent():
    b = gobang.new_board(15)
    moves = [(7, 7), (3, 11), (11, 3), (0, 0), (14, 14), (7, 0)]
    for r, c in moves:            # a scripted player; the AI answers every move
        b = gobang.place(b, r, c, 1) or b
        ar, ac = gobang.ai_move(b, 2)
        assert 0 <= ar < 15 and 0 <= ac < 15 and b[ar][ac] == 0, f"AI played {(ar, ac)}, not an empty cell"
        b = gobang.place(b, ar, ac, 2) or b
    b = gobang.new_board(15)
    for c in range(3, 7):
        b = gobang.place(b, 7, c, 2) or b
    assert tuple(gobang.ai_move(b, 2)) in ((7, 2), (7, 7)), "AI missed its own five"
    b = gobang.new_board(15)
    for c in range(3, 7):
        b = gobang.place(b, 9, c, 1) or b
    assert tuple(gobang.ai_move(b, 2)) in ((9, 2), (9, 7)), "AI did not block the player's four"
check("AI opponent", opponent)
print("CRITERIA " + json.dumps(out))
'''


def _gobang(folder: Path, sandbox: str, timeout: float) -> dict[str, list]:
    """The probe's verdicts, each [0|1, note]; every criterion 0 with the reason when the
    file is missing or the probe could not finish."""
    from ..engine.answer_code import run_python
    from ..engine.workspace import Workspace
    from ..errors import SandboxError

    names = ("board", "interactable", "black/white choice", "AI opponent")
    if read_text(folder, "gobang.py") is None:
        return {n: [0, "no gobang.py"] for n in names}
    try:
        ex = run_python(Workspace(folder), "criteria_gobang", GOBANG_PROBE, timeout=timeout,
                        sandbox=sandbox)
    except SandboxError as exc:
        return {n: [None, f"not run: {exc}"] for n in names}
    line = next((x for x in (ex.stdout or "").splitlines() if x.startswith("CRITERIA ")), None)
    if line is None:
        why = ex.error or "the probe printed no verdict"
        return {n: [0, f"gobang.py could not be loaded: {why}"[:240]] for n in names}
    got = json.loads(line[len("CRITERIA "):])
    return {n: got.get(n, [0, "not reached"]) for n in names}


def _gobang_criterion(name: str) -> Callable[..., Score]:
    def check(folder: Path, params: dict, *, cache: dict, sandbox: str = "bwrap",
              timeout: float = 60.0, **_: Any) -> Score:
        key = ("gobang", str(folder))
        if key not in cache:
            cache[key] = _gobang(folder, sandbox, timeout)
        value, note = cache[key][name]
        return Score(name, None if value is None else float(value),
                     "not checkable" if value is None else "program", note)
    return check


# -- beamer ------------------------------------------------------------------------------------------
def _tex(folder: Path) -> str | None:
    names = _files(folder, ".tex")
    rel = "slides.tex" if "slides.tex" in names else (names[0] if names else None)
    return rel


def _compiles(folder: Path, params: dict, *, cache: dict, sandbox: str = "bwrap", **_: Any) -> Score:
    from .checks import check_latex

    rel = _tex(folder)
    if rel is None:
        return Score("compiles", 0.0, "program", "no .tex file")
    key = ("latex", str(folder))
    if key not in cache:
        cache[key] = check_latex(Path(folder) / rel, sandbox=sandbox)
    check = cache[key]
    if check.ok is None:
        return Score("compiles", None, "not checkable", "no TeX engine is installed here")
    return Score("compiles", 1.0 if check.ok else 0.0, "program", check.line)


def _page_count(folder: Path, params: dict, *, cache: dict, **kwargs: Any) -> Score:
    rel = _tex(folder)
    text = read_text(folder, rel) if rel else None
    if text is None:
        return Score("page count", 0.0, "program", "no .tex file")
    asked = int(params.get("pages") or 0)
    pdf = read_text(folder, str(Path(rel).with_suffix(".pdf")))
    if pdf is not None:
        count, what = len(re.findall(r"/Type\s*/Page(?!s)", pdf)), "PDF pages"
    else:
        count, what = len(re.findall(r"\\begin\{frame\}", text)), "frames in the source (no PDF)"
    ok = asked > 0 and abs(count - asked) <= max(1, round(asked * 0.1))
    return Score("page count", 1.0 if ok else 0.0, "program", f"{count} {what}, {asked} asked")


_COMPLETE = ("The text below is a LaTeX Beamer lecture on {topic}. Does it, for every algorithm "
             "it presents, give the motivation, the problem it solves, the intuitive solution "
             "and the detailed math equations, defining every symbol before it is used?")


async def _completeness(folder: Path, params: dict, *, judge: Judge | None = None,
                        **_: Any) -> Score:
    rel = _tex(folder)
    text = read_text(folder, rel) if rel else None
    if text is None:
        return Score("completeness", 0.0, "program", "no .tex file: nothing to judge")
    if judge is None:
        return Score("completeness", None, "not checkable", "no judge was asked")
    passed, why = await judge(_COMPLETE.format(topic=params.get("topic", "the topic")), text)
    return Score("completeness", 1.0 if passed else 0.0, "LLM judge", why)


# -- the registry -----------------------------------------------------------------------------------
CRITERIA: dict[str, Callable[..., Any]] = {
    "website.facts": _website_facts,
    "website.schedule_venue": _website_pages,
    "website.map": _website_map,
    "gobang.board": _gobang_criterion("board"),
    "gobang.interactable": _gobang_criterion("interactable"),
    "gobang.black_white": _gobang_criterion("black/white choice"),
    "gobang.ai_opponent": _gobang_criterion("AI opponent"),
    "beamer.compiles": _compiles,
    "beamer.page_count": _page_count,
    "beamer.completeness": _completeness,
}


async def score(names: list[str], folder: Path, params: dict, *, judge: Judge | None = None,
                sandbox: str = "bwrap") -> list[Score]:
    """Every criterion of `names` on the files in `folder`, in order."""
    import asyncio

    unknown = [n for n in names if n not in CRITERIA]
    if unknown:
        raise ConfigError(f"unknown criteria {', '.join(unknown)}; known: {', '.join(CRITERIA)}")
    cache: dict = {}
    out = []
    for name in names:
        fn = CRITERIA[name]
        if asyncio.iscoroutinefunction(fn):
            out.append(await fn(folder, params, judge=judge, cache=cache, sandbox=sandbox))
        else:   # the sandbox and the parser block: off the loop
            out.append(await asyncio.to_thread(fn, folder, params, judge=judge, cache=cache,
                                               sandbox=sandbox))
    return out
