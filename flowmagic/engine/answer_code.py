"""A node's answer put to work: its named files saved, its Python run in the sandbox.

An answer is split into fenced blocks. A block whose fence names a file
(```python gobang.py, ```html index.html, ```latex title="slides.tex", or a file name alone
on the line just above the fence) is a *deliverable*: it is saved in the run's workspace
under that name and never executed. The unnamed Python blocks are the node's *analysis
code*: they run together, once, in the sandbox (flowmagic.sandbox) with the workspace as
the working directory, so they read the declared inputs by name and whatever they write
stays in the workspace. matplotlib draws off-screen there, and every figure still open at
the end is saved as PNG. What happened (stdout, stderr, the files written, the figures)
is the node's result; the model's own claims about it are not.

Model-written code never runs in the calling process: only `flowmagic.sandbox` runs it.
"""

from __future__ import annotations

import asyncio
import functools
import re
import time
from dataclasses import dataclass, field, fields

from .._internal.text import keep_ends
from ..errors import WorkspaceError
from . import confined
from .code_blocks import extract_code
from .sandbox import run_code

__all__ = ["Execution", "split_answer", "execute", "aexecute", "has_fence", "run_python", "report", "wants_execution",
           "EXECUTE_MODES", "WORKING_START", "instructions", "files_line", "made_files", "about_files_or_code"]

EXECUTE_MODES = ("auto", "off")
# The key, in the execution of a node whose model's code ran after flowmagic's working start,
# holding the working start's own run (its code, outputs and figures), so neither is lost.
WORKING_START = "working_start"
_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})[ \t]*([^\n`]*)$")
_FILE_NAME = re.compile(r"^/?[\w.-]+(?:/[\w.-]+)*\.[A-Za-z0-9]{1,8}$")
_NAMED_ABOVE = re.compile(r"^\s*(?:#+\s*|\*\*|`|(?:file(?:name)?|path)\s*:\s*)*"
                          r"`?([\w.-]+(?:/[\w.-]+)*\.[A-Za-z0-9]{1,8})`?(?:\*\*)?\s*:?\s*$",
                          re.IGNORECASE)
_OUT_CHARS = 6000   # of stdout / stderr kept in a node's report
_FILE_LIMIT_MB = 64   # of a file a node's code writes, its stdout and stderr included
_FIGURES_SAVED = 20   # open matplotlib figures saved as PNG at the end of a node's code
_FILES_KEPT = 200   # of the files a run of code wrote, named in its record (the rest counted)


@dataclass
class Execution:
    """What a node's code did: it is JSON (`to_dict`) on the node and in the export."""
    code: str = ""
    ran: bool = False
    ok: bool = True
    stdout: str = ""
    stderr: str = ""
    error: str = ""                    # one line when not ok
    files: list[str] = field(default_factory=list)     # written or changed by the code
    figures: list[str] = field(default_factory=list)   # PNGs among them
    saved: list[str] = field(default_factory=list)     # deliverables saved from named blocks
    renamed: dict = field(default_factory=dict)        # name asked -> name saved (one was taken)
    more_files: int = 0                # written or changed beyond those `files` lists
    notes: list[str] = field(default_factory=list)     # what flowmagic undid or left out, a line each
    duration_s: float = 0.0
    starter: bool = False              # flowmagic's working start, not the model's code
    # what the flow's session holds after this run, and where a failed one failed (see
    # flowmagic.engine.session): [{"name", "type", "about", ...}], {"line", "text"} or None
    names: list[dict] = field(default_factory=list)
    defined: list[str] = field(default_factory=list)   # names this run made, rebound or changed
    error_line: dict | None = None
    error_type: str = ""               # the exception's class name ("NameError")
    timed_out: bool = False
    seq: int | None = None             # its place in the session's order (None: no session)
    kept: bool = False                 # the session kept what it defined (it ran well)

    def to_dict(self) -> dict:
        # asdict's generic deep copy costs more than the rest of a text node's bookkeeping;
        # the fields are flat values, dicts of them and lists of those: two levels are enough
        return {name: _copy(value) for name in _EXECUTION_FIELDS
                for value in (getattr(self, name),)}

    @classmethod
    def from_dict(cls, data: dict) -> "Execution":
        """An Execution again from its `to_dict` (keys it does not know are left out)."""
        return cls(**{name: _copy(data[name]) for name in _EXECUTION_FIELDS if name in data})


def _copy(value):
    if isinstance(value, list):
        return [dict(v) if isinstance(v, dict) else v for v in value]
    return dict(value) if isinstance(value, dict) else value


_EXECUTION_FIELDS = tuple(f.name for f in fields(Execution))


def _fence_name(info: str) -> str | None:
    """The file a fence's info string names: `python gobang.py`, `html title="index.html"`."""
    for word in info.replace("=", " ").replace('"', " ").replace("'", " ").split():
        if _FILE_NAME.match(word) and not set(word) <= {"."}:
            return word   # (a bad name, "../x.py", is still a name: refused, never run)
    return None


def _deliverable_name(name: str) -> str:
    """The name a deliverable is saved under, or WorkspaceError (one line): relative, inside
    the workspace, no hidden part (those are flowmagic's own), within the file system's limits."""
    rel = "/".join(confined.parts(name))
    if any(p.startswith(".") for p in rel.split("/")):
        raise WorkspaceError(f"file name {name[:80]!r} starts a part with '.', which is kept "
                             "for flowmagic's own files; give a plain name")
    return rel


def split_answer(text: str) -> tuple[list[str], dict[str, str]]:
    """(unnamed Python blocks to run, {file name: content} of named blocks), in order. The
    names are as the answer wrote them: `execute` refuses the bad ones."""
    if not isinstance(text, str):
        return [], {}
    lines, files, unnamed_parts, i = text.splitlines(), {}, [], 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, info = m.group(1), m.group(2).strip()
        start = i
        body, i, closed = [], i + 1, False
        while i < len(lines):
            stripped = lines[i].strip()
            if stripped and set(stripped) == {fence[0]} and len(stripped) >= len(fence):
                closed, i = True, i + 1
                break
            body.append(lines[i])
            i += 1
        above = next((lines[j] for j in range(start - 1, max(start - 3, -1), -1)
                      if lines[j].strip()), "")
        named = _fence_name(info) or (m2.group(1) if (m2 := _NAMED_ABOVE.match(above)) else None)
        if named:   # a deliverable, never code to run, even when its name is refused later
            files[named] = "\n".join(body) + "\n"
        else:
            unnamed_parts.append("\n".join(lines[start:i]) + ("" if closed else "\n"))
    return extract_code("\n".join(unnamed_parts)), files


def wants_execution(mode: str, code_blocks: list[str]) -> bool:
    return mode == "auto" and bool(code_blocks)


_PLOTTING = re.compile(r"matplotlib|pyplot|plt\.|seaborn|\.plot\b|\.hist\(|\.boxplot\(")


def _program(code: str, node_id: str) -> str:
    """The code with matplotlib set to draw off-screen and its open figures saved as PNG.
    The node's code itself runs from its own file so tracebacks show its line numbers."""
    head = ["import os as _fm_os, sys as _fm_sys",
            "_fm_os.environ.setdefault('MPLBACKEND', 'Agg')",
            "_fm_os.environ['MPLCONFIGDIR'] = _fm_os.path.join(_fm_os.getcwd(), '.matplotlib')"]
    figure_prefix = f"{node_id}_figure"
    tail: list[str] = []
    if _PLOTTING.search(code):
        head += ["import matplotlib as _fm_mpl", "_fm_mpl.use('Agg')",
                 "import matplotlib.pyplot as _fm_plt", "_fm_plt.show = lambda *a, **k: None"]
        tail = [f"for _fm_i, _fm_n in enumerate(_fm_plt.get_fignums()[:{_FIGURES_SAVED}], 1):",
                f"    _fm_plt.figure(_fm_n).savefig(f'{figure_prefix}_{{_fm_i}}.png', dpi=90, "
                "bbox_inches='tight')"]
    run = [f"_fm_src = open({'.flowmagic/' + node_id + '.py'!r}, encoding='utf-8').read()",
           f"exec(compile(_fm_src, {node_id + '.py'!r}, 'exec'), "
           "{'__name__': '__main__', '__builtins__': __builtins__})"]
    return "\n".join(head + run + tail) + "\n"


def _output_over(size) -> str:
    """The one line of a run stopped by its output's size ('' when it was not)."""
    limit = _FILE_LIMIT_MB << 20
    if not isinstance(size, int) or size < limit:
        return ""
    return (f"output over {limit:,} bytes: the code printed without end and was stopped; "
            "print a summary instead (df.head(), a count, a mean)")


def _one_line_error(stderr: str, timed_out: bool, seconds: float) -> str:
    if timed_out:
        return f"the code did not finish within {seconds:.0f} s and was stopped"
    last = [line for line in stderr.strip().splitlines() if line.strip()]
    return last[-1].strip()[:300] if last else "the code failed with no error output"


_INSTALL = re.compile(r'File "/[^"]*/lib/python3\.\d+/')


def _clean_traceback(stderr: str) -> str:
    """The traceback without the frames of the wrapper that loaded the node's file, and
    without the machine's install paths (the same error reads the same everywhere)."""
    stderr = _INSTALL.sub('File "<python>/', stderr)
    out = []
    skip = False
    for line in stderr.splitlines():
        if line.startswith('  File "solution.py"') or line.startswith("  File \"<string>\""):
            skip = True
            continue
        if skip and line.startswith("    "):
            continue
        skip = False
        out.append(line)
    return "\n".join(out)


def execute(workspace, node_id: str, answer: str, *, mode: str = "auto", timeout: float = 60.0,
            memory_mb: int = 2048, sandbox: str = "bwrap", session=None,
            hold: bool = False) -> Execution:
    """Save the answer's named files, run its unnamed Python in the sandbox; see the module.
    A file name that cannot be saved (it leaves the workspace, it is too long or too deep)
    is the node's failure in one line: nothing of the answer runs."""
    blocks, files = split_answer(answer)
    saved, renamed = [], {}
    try:
        names = {_deliverable_name(name): content for name, content in files.items()}
        for rel, content in names.items():
            got = workspace.save(rel, content)
            saved.append(got)
            if got != rel:
                renamed[rel] = got
    except WorkspaceError as exc:
        return Execution(ok=False, error=str(exc), saved=saved, renamed=renamed)
    if not wants_execution(mode, blocks):
        return Execution(saved=saved, renamed=renamed)
    result = run_python(workspace, node_id, "\n\n".join(blocks), timeout=timeout,
                        memory_mb=memory_mb, sandbox=sandbox, session=session, hold=hold)
    result.saved, result.renamed = saved, renamed
    return result


def run_python(workspace, node_id: str, code: str, *, timeout: float = 60.0,
               memory_mb: int = 2048, sandbox: str = "bwrap", session=None,
               hold: bool = False) -> Execution:
    """Run `code` in the sandbox with the workspace as its working directory (SandboxError,
    one line, when the sandbox cannot run here: the code is never run another way). Given
    the flow's `session` (flowmagic.engine.session), it runs there as its next cell, on
    the names earlier cells defined; else in a fresh interpreter of its own."""
    if session is not None:
        return _run_in_session(workspace, node_id, code, session, timeout, hold)
    result = Execution(code=code, ran=True)
    workspace.write(f".flowmagic/{node_id}.py", code)
    had_git = workspace.has_git()
    started = time.monotonic()
    run = run_code(_program(code, node_id), workdir=str(workspace.root), timeout=timeout,
                   memory_mb=memory_mb, site_packages=True, file_limit_mb=_FILE_LIMIT_MB,
                   sandbox=sandbox,
                   readonly=workspace.readonly())
    dropped = workspace.drop_new_git(had_git)
    result.duration_s = round(time.monotonic() - started, 3)
    result.ok = run.ok
    result.stdout = _clip(run.stdout)
    result.stderr = _clip(_clean_traceback(run.stderr))
    if not run.ok:
        result.error = (_output_over(run.output_bytes)
                        or _one_line_error(result.stderr, run.timed_out, timeout))
        if _output_over(run.output_bytes):   # what it printed is noise: the line says it all
            result.stderr = result.error
    _listed(result, run.files, dropped)
    return result


def _listed(result: Execution, changed: list[str], note: str) -> None:
    """The files a run made or changed (every entry was checked: workdir_changes.settle), at most
    _FILES_KEPT named and the rest counted; flowmagic's hidden ones left out."""
    changed = [f for f in changed if not any(p.startswith((".", "__")) for p in f.split("/"))]
    result.files, result.more_files = changed[:_FILES_KEPT], max(0, len(changed) - _FILES_KEPT)
    result.figures = [f for f in result.files if f.lower().endswith(".png")]
    if note:
        result.notes.append(note)


def _run_in_session(workspace, node_id: str, code: str, session, timeout: float,
                    hold: bool) -> Execution:
    result = Execution(code=code, ran=True)
    workspace.write(f".flowmagic/{node_id}.py", code)   # the code as it ran, beside its files
    had_git = workspace.has_git()
    # the cell's files are read in its own turn (sandbox_process.SandboxProcess.lend), so no other's
    cell = session.run(code, name=node_id, timeout=timeout, hold=hold)
    dropped = workspace.drop_new_git(had_git)
    result.duration_s = round(float(cell.get("duration_s") or 0.0), 3)
    result.ok = bool(cell.get("ok"))
    result.stdout = _clip(str(cell.get("stdout") or ""))
    result.stderr = _clip(_clean_traceback(str(cell.get("stderr") or "")))
    result.timed_out = bool(cell.get("timed_out"))
    if not result.ok:   # the holder's own words (a timeout, a death), else the traceback's
        result.error = (_one_line_error("", True, timeout) if result.timed_out else
                        _output_over(cell.get("output_bytes"))
                        or str(cell.get("error") or "")[:300]
                        or _one_line_error(result.stderr, False, timeout))
        if _output_over(cell.get("output_bytes")):   # what it printed is noise
            result.stderr = result.error
    result.names = _names(cell.get("names"))
    result.defined = [n for n in cell.get("defined") or [] if isinstance(n, str)
                      and n.isidentifier()]
    line = cell.get("error_line")
    result.error_line = line if isinstance(line, dict) else None
    result.error_type = str(cell.get("error_type") or "")
    result.seq, result.kept = cell.get("seq"), bool(cell.get("kept"))
    _listed(result, [f for f in cell.get("files") or [] if isinstance(f, str)], dropped)
    return result


_NAME_FIELDS = {"type": str, "about": str, "value": str, "shape": list, "columns": list,
                "length": int}


def _names(given) -> list[dict]:
    """The session's list of names as data: an identifier each, known fields of known types,
    texts clipped (what the code left in its namespace reaches prompts and the record)."""
    out = []
    for item in given if isinstance(given, list) else []:
        if not (isinstance(item, dict) and isinstance(item.get("name"), str)
                and item["name"].isidentifier()):
            continue
        entry = {"name": item["name"][:100]}
        if isinstance(item.get("same_as"), str) and item["same_as"].isidentifier():
            entry["same_as"] = item["same_as"][:100]
        for key, kind in _NAME_FIELDS.items():
            value = item.get(key)
            if isinstance(value, kind) and not isinstance(value, bool):
                entry[key] = (value[:400] if isinstance(value, str) else
                              [v for v in value[:8] if isinstance(v, int)] if key == "shape"
                              else [str(v)[:100] for v in value[:60]] if key == "columns"
                              else value)
        out.append(entry)
    return out[:200]


def has_fence(answer: str) -> bool:
    """Whether an answer holds a code fence (``` or ~~~): without one it has no file to
    save and no code to run."""
    return isinstance(answer, str) and ("```" in answer or "~~~" in answer)


async def aexecute(workspace, node_id: str, answer: str, **kwargs) -> Execution:
    """`execute` in a worker thread: the event loop (and the UI) keeps running. An answer
    with no fence at all has no file to save and no code to run: that is known at once,
    without the thread hop (most answers of a text workflow)."""
    if not has_fence(answer):
        return Execution()
    return await asyncio.to_thread(execute, workspace, node_id, answer, **kwargs)


def _clip(text: str) -> str:
    return keep_ends(text, _OUT_CHARS, "\n[cut here: {n} characters of output not kept]\n")


def report(ex: dict | Execution | None) -> str:
    """What really happened, as text for the node's output and its children's prompts."""
    if ex is None:
        return ""
    ex = ex.to_dict() if isinstance(ex, Execution) else ex
    parts = []
    if ex.get("saved"):
        parts.append("Files saved from this answer: " + ", ".join(ex["saved"]))
    for asked, got in (ex.get("renamed") or {}).items():
        parts.append(f"{asked} is an input or a file that was already there, so it was saved "
                     f"as {got} instead")
    parts += [f"flowmagic: {note}" for note in ex.get("notes") or ()]
    if not ex.get("ran") and not ex.get("ok", True) and ex.get("error"):
        parts.append(f"Nothing of this answer ran: {ex['error']}")
    if ex.get("ran"):
        status = "ran without error" if ex.get("ok") else f"failed: {ex.get('error')}"
        if ex.get("starter"):
            parts.append("flowmagic's working start (its code, not the model's) was run in the "
                         f"sandbox and {status}:\n```python\n{ex.get('code', '').rstrip()}\n```")
        else:
            parts.append(f"The Python code above was run in the sandbox and {status}.")
        parts.append("Printed output:\n" + (ex.get("stdout") or "(nothing)").rstrip())
        if ex.get("stderr") and not ex.get("ok"):
            parts.append("Error output:\n" + ex["stderr"].rstrip())
        written = [f for f in ex.get("files", []) if f not in ex.get("figures", [])]
        if written:
            parts.append("Files it wrote: " + ", ".join(written)
                         + (f" and {ex['more_files']} more" if ex.get("more_files") else ""))
        if ex.get("figures"):
            parts.append("Figures it drew (PNG files): " + ", ".join(ex["figures"]))
    return "\n\n".join(parts)


_CODE_WORDS = re.compile(
    r"python|\bcode\b|script|program|\bcsv\b|data ?frame|pandas|numpy|matplotlib|\bplot|"
    r"chart|figure|dataset|\bdata\b|html|\bcss\b|latex|beamer|\.py\b|\.tex\b|\bfiles?\b|"
    r"comput|calculat|analy[sz]|statistic|\bgame\b|website|web page|slides", re.IGNORECASE)


# Each alternative of _CODE_WORDS holds one of these: an ASCII text with none of them in
# lower case cannot match, and they are found in C (the regex took ~20 us a node prompt).
_CODE_LITERALS = ("python", "code", "script", "program", "csv", "data", "pandas", "numpy",
                  "matplotlib", "plot", "chart", "figure", "html", "css", "latex", "beamer",
                  ".py", ".tex", "file", "comput", "calculat", "analy", "statistic", "game",
                  "web", "slides")


def about_files_or_code(*texts: str) -> bool:
    """Whether a task speaks of data, code or files: only then does a prompt explain how
    code runs and files are delivered (a small model writes code wherever it is invited to)."""
    for text in texts:   # (a loop, not any() of a generator: asked for every node's prompt)
        if _mentions_code(text or ""):
            return True
    return False


@functools.lru_cache(maxsize=256)   # a run asks about its one task text for every node
def _mentions_code(text: str) -> bool:
    if text.isascii():   # beyond ASCII, IGNORECASE matches more than lower() shows
        low = text.lower()
        for word in _CODE_LITERALS:
            if word in low:
                break
        else:
            return False
    return _CODE_WORDS.search(text) is not None


def made_files(ex: dict | None) -> list[str]:
    """The files a node left in the workspace: its deliverables, then what its code wrote."""
    ex = ex or {}
    saved = list(ex.get("saved", []))
    return saved + [f for f in ex.get("files", []) if f not in saved]


# After the working start's run (`report`) in the start every call of a flow shares.
RAN_FIRST = ("Those are real results on the input, computed before any subtask began. Use "
             "them; begin any code from the working start, keep its column names as written, "
             "and write more code only for what your subtask still needs.")


def instructions(inputs: str, files: list[str], example: str = "", ran: str = "") -> str:
    """What a node's prompt says about running code, delivering files and the inputs (what
    the session holds for one node's code is that node's own: session.session_text).
    `example`: the working start's code, to begin from; `ran`: instead, the report of its run
    (the code, what it printed), once it ran in the flow's session."""
    parts = ["How your answer is used: every ```python block without a file name is run "
             "for you, once, as the next cell of this flow's Python session (a sandboxed "
             "kernel, like a notebook's, whose working directory holds the input files). "
             "What it prints, the files it writes and the matplotlib figures it leaves open "
             "(saved as PNG for you) become your result; later subtasks see exactly that, and "
             "their code sees the names yours defines. "
             "Compute every number with code and print it; never invent a number. "
             "To deliver a file (a program, a web page, a document), write one fenced block "
             "per file with its name after the language, e.g. ```python game.py or "
             "```html index.html; it is saved under that name and not run."]
    if inputs:
        parts.append(inputs)
    if ran:
        parts.append(f"{ran}\n\n{RAN_FIRST}")
    elif example:
        parts.append("A working start: this code runs as it is in the session, prints real "
                     "numbers and draws a figure. Begin your code from it, keep its column "
                     f"names as written, and change it for your subtask:\n```python\n{example}```")
    if files:
        parts.append(files_line(files))
    return "\n\n".join(parts)


def files_line(files: list[str]) -> str:
    """What a node's prompt says about the files earlier subtasks left."""
    return ("Files that earlier subtasks left in the working directory: " + ", ".join(files[:60])
            + (f" and {len(files) - 60} more" if len(files) > 60 else ""))
