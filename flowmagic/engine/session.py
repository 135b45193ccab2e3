"""One sandboxed Python session per flow, like a notebook's kernel.

A flow's code cells run one at a time in one long-lived interpreter under bubblewrap
(`sandbox_process.spawn("session_child.py")`, with the view and limits of `run_code`), in
the order they are recorded, while the model calls that write them run in parallel. The
first cell is the prelude: pandas as `pd`, numpy as `np`, matplotlib.pyplot as `plt` and every table input
loaded as a DataFrame (named after its file; the first one is `df` too). What a cell
defines, the later cells see, as in a notebook run top to bottom; the exported notebook keeps
the same order, so each of its cells sees what the node's code saw.

A cell runs in a fork of the interpreter that holds the names (session_child.py): a cell
that fails, dies or times out is discarded with everything it changed, and the session goes on
from the state before it; a timeout kills that cell only. A cell that ran well becomes the
session. With `hold=True` the caller decides afterwards (`settle(keep)`) whether it does: a
node whose answer a validator rejects leaves nothing behind either.

`Session.run` returns the cell's record (`seq`, `kept`, `names`, `error_line`, ...). A
session whose interpreter stopped answering is killed; the next `run` starts a new one and
replays the prelude and the kept cells of the record (`history`) in their order first, which
is also how a flow loaded in a new kernel (`flowmagic.load`) rebuilds its session.

Every session is killed with its flow (`close`, or when the flow is collected), at exit, and
with the kernel (bwrap's --die-with-parent, bound to a thread that lives as long as the
process); one left idle for `idle_s` seconds (15 minutes) ends itself.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import functools
import importlib.util
import json
import keyword
import os
import re
import struct
import threading
import time
import weakref
from typing import Callable, Iterable

from ..errors import SandboxError
from ..llm.endpoints import scrub
from .._internal.waiting import readable
from . import sandbox_process as _sandbox   # (its spawn and SandboxProcess)
from .workspace import read_spaced

__all__ = ["Session", "prelude", "libraries", "table_names", "recorded_cells", "kept_cells",
           "names_for",
           "session_text", "LIBRARIES"]

# (import name, what a user installs, how the prelude imports it or None)
LIBRARIES = (("numpy", "numpy", "import numpy as np"), ("pandas", "pandas", "import pandas as pd"),
             ("matplotlib", "matplotlib", "import matplotlib.pyplot as plt"),
             ("scipy", "scipy", None), ("sklearn", "scikit-learn", None),
             ("statsmodels", "statsmodels", None), ("seaborn", "seaborn", None),
             ("pyarrow", "pyarrow", None))
_GRACE_S = 15.0          # beyond a cell's timeout before the session counts as lost
# an interpreter left idle this long ends itself (its memory back); the next cell starts a
# new one, which runs the recorded cells again first
IDLE_S = 900.0
_START_S = 60.0          # for the interpreter to answer its first cell (the prelude)
_REPLY_MAX = 32 << 20
_live: "weakref.WeakSet[Session]" = weakref.WeakSet()
_spawner: concurrent.futures.ThreadPoolExecutor | None = None
_spawner_lock = threading.Lock()


@functools.lru_cache(maxsize=1)   # the site-packages do not change under a running kernel
def libraries() -> tuple[str, ...]:
    """The data libraries the sandbox can import (it sees this interpreter's site-packages),
    by the names users install them under."""
    return tuple(pip for name, pip, _ in LIBRARIES if importlib.util.find_spec(name) is not None)


def _identifier(stem: str) -> str:
    name = re.sub(r"\W+", "_", stem.strip()).strip("_").lower() or "table"
    if name[0].isdigit() or keyword.iskeyword(name) or name in ("pd", "np", "plt"):
        name = f"data_{name}"
    return name


def table_names(workspace) -> list[tuple[str, str, str]]:
    """(variable, file, reader) of each table input the prelude loads, in order."""
    out, used = [], set()
    for entry in getattr(workspace, "inputs", []) if workspace is not None else []:
        path = str(entry.path)
        low = path.lower()
        if entry.kind != "table" or not low.endswith((".csv", ".tsv", ".parquet", ".pq")):
            continue
        reader = ("read_parquet" if low.endswith((".parquet", ".pq")) else "read_csv")
        declared = str(entry.name or path)   # a DataFrame's own name, or the file's
        stem = declared if entry.kind == "table" and "." not in declared else (
            os.path.splitext(os.path.basename(path))[0])
        name = _identifier(stem)
        while name in used:
            name += "_"
        used.add(name)
        out.append((name, path, reader))
    return out


def prelude(workspace, available: Iterable[str] | None = None) -> str:
    """The session's first cell: the imports, and each table input read into a DataFrame."""
    have = set(libraries() if available is None else available)
    lines = [line for _, pip, line in LIBRARIES if line and pip in have]
    tables = table_names(workspace) if "pandas" in have else []
    spaced = {i.path for i in getattr(workspace, "inputs", []) if read_spaced(i)}
    for name, path, reader in tables:
        sep = ", sep='\\t'" if path.lower().endswith(".tsv") else ""
        if path in spaced and reader == "read_csv":   # `a, b, c`: columns named as written
            sep += ", skipinitialspace=True"
        lines.append(f"{name} = pd.{reader}({path!r}{sep})")
    if tables and tables[0][0] != "df":   # the first table is df too (the working start's)
        lines.append(f"df = {tables[0][0]}")
    return "\n".join(lines) + "\n" if lines else ""


def kept_cells(items: Iterable[tuple]) -> list[dict]:
    """The code runs a session kept, from (node id, execution, attempts) records, in their
    order: each an execution record with its `node`."""
    from .answer_code import WORKING_START

    found: dict[int, dict] = {}
    for node_id, execution, attempts in items:
        runs = [execution] + [a.get("execution") for a in attempts or [] if isinstance(a, dict)]
        for ex in list(runs):
            if isinstance(ex, dict) and isinstance(ex.get(WORKING_START), dict):
                runs.append(ex[WORKING_START])
        for ex in runs:
            if isinstance(ex, dict) and ex.get("kept") and isinstance(ex.get("seq"), int):
                found.setdefault(ex["seq"], {**ex, "node": node_id})
    return [found[k] for k in sorted(found)]


def recorded_cells(workflow) -> list[dict]:
    """The code runs the session kept, from every node's record, in their order."""
    return kept_cells((n.id, n.execution, n.attempts) for n in workflow.nodes.values())


def _spawn_thread() -> concurrent.futures.ThreadPoolExecutor:
    """One thread that starts every session and lives as long as the process: bwrap's
    --die-with-parent follows the thread that started it, not the process."""
    global _spawner
    with _spawner_lock:
        if _spawner is None:
            _spawner = concurrent.futures.ThreadPoolExecutor(1, "flowmagic-session")
        return _spawner


class SessionLost(Exception):
    """The interpreter stopped answering or died (internal: the run says so, one line)."""


class Session:
    """The sandboxed interpreter of one flow; see the module docstring."""

    def __init__(self, workspace, *, sandbox: str = "bwrap", memory_mb: int = 2048,
                 history: Callable[[], list[dict]] | None = None, output_limit: int = 20_000,
                 prelude: str | None = None, idle_s: float = IDLE_S):
        self.workspace, self.idle_s = workspace, float(idle_s)
        self._prelude = prelude   # None: made from the workspace's inputs at each start
        self.sandbox, self.memory_mb, self.output_limit = sandbox, int(memory_mb), output_limit
        self.history = history or (lambda: [])
        self.seq = 1                 # the number of the next cell (0 is the prelude)
        self.starts = 0              # interpreters started (1 + restarts)
        self.prelude = ""
        self.replayed: list[int] = []   # seqs of recorded cells run again at the last start
        self._process: _sandbox.SandboxProcess | None = None
        self._turn = threading.Lock()    # one cell at a time (a held cell keeps it)
        self._state = threading.Lock()   # the process handle, for close()
        self._held = False
        _live.add(self)

    # -- life ---------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.alive

    @property
    def pid(self) -> int | None:
        """bwrap's process id on this machine (None when no interpreter runs)."""
        return self._process.pid if self._process is not None else None

    def close(self) -> None:
        """Kill the interpreter and every process it started."""
        with self._state:
            process, self._process = self._process, None
        if process is not None:
            process.kill()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - nothing to report to at collection time
            pass

    def _start(self) -> None:
        """A new interpreter: the prelude, then the recorded cells again, in their order."""
        root = str(self.workspace.root)
        process = _spawn_thread().submit(
            _sandbox.spawn, "session_child.py", workdir=root, memory_mb=self.memory_mb,
            output_limit=self.output_limit, site_packages=True, sandbox=self.sandbox,
            readonly=self.workspace.readonly()).result()
        self._process, self.starts = process, self.starts + 1
        self.prelude = self._prelude if self._prelude is not None else prelude(self.workspace)
        cells = self.history()
        self.seq = max([self.seq] + [c["seq"] + 1 for c in cells])
        try:
            with process.lend():
                first = self._call({"op": "run", "code": self.prelude, "file": "prelude.py",
                                    "timeout": _START_S}, _START_S)
                if not first.get("ok"):
                    raise SandboxError(f"the session's prelude failed ({one_error(first)}); "
                                       "check that pandas reads the inputs (pip install "
                                       "'flowmagic[data]')")
                self.replayed = [self._replay(cell) for cell in cells]
        except SessionLost as exc:
            self.close()
            raise SandboxError(f"the flow's Python session could not start: {exc}") from None
        except BaseException:
            self.close()
            raise

    def start(self) -> None:
        """Start the interpreter now (the prelude, then the recorded cells), if it is not running."""
        with self._turn:
            if not self.alive:
                self._process = None
                self._start()

    def _replay(self, cell: dict) -> int:
        """Run a recorded cell again; its seq, negative when it no longer runs well."""
        node = str(cell.get("node") or "cell")
        done = self._call({"op": "run", "code": cell.get("code") or "", "file": f"{node}.py",
                           "figures": f"{node}_figure", "timeout": 600.0}, 600.0 + _GRACE_S)
        return cell["seq"] if done.get("ok") else -cell["seq"]

    # -- the channel ---------------------------------------------------------------------
    def _call(self, request: dict, seconds: float) -> dict:
        process = self._process
        if process is None or not process.alive:
            raise SessionLost("the session's interpreter is not running")
        body = json.dumps({**request, "idle": self.idle_s}).encode("utf-8")
        try:
            process.stdin.write(struct.pack(">I", len(body)) + body)
            process.stdin.flush()
        except (OSError, ValueError):
            raise SessionLost(self._why("stopped reading")) from None
        head = self._read(4, seconds)
        size = struct.unpack(">I", head)[0]
        if size > _REPLY_MAX:
            raise SessionLost("the session answered with more than 32 MB")
        try:
            reply = json.loads(self._read(size, seconds).decode("utf-8", "replace"))
        except ValueError:
            raise SessionLost("the session's answer was not JSON") from None
        if not isinstance(reply, dict):
            raise SessionLost("the session's answer was not a record")
        return reply

    def _read(self, size: int, seconds: float) -> bytes:
        fd, data = self._process.stdout.fileno(), bytearray()
        deadline = time.monotonic() + seconds
        while len(data) < size:
            left = deadline - time.monotonic()
            if left <= 0:
                raise SessionLost(f"the session did not answer within {seconds:.0f} s")
            if not readable(fd, min(left, 1.0)):
                continue
            chunk = os.read(fd, size - len(data))
            if not chunk:
                raise SessionLost(self._why("ended"))
            data.extend(chunk)
        return bytes(data)

    def _why(self, what: str) -> str:
        process = self._process
        tail = process.errors() if process is not None else ""
        return f"the session's interpreter {what}" + (f": {tail.splitlines()[-1]}" if tail else "")

    # -- cells ---------------------------------------------------------------------------
    def run(self, code: str, *, name: str = "cell", timeout: float = 60.0,
            hold: bool = False) -> dict:
        """Run one cell; its record (see the module docstring), whose `files` are the files
        it made or changed in the workdir (read in its own turn, so no other cell's).
        With `hold`, a cell that ran well waits for `settle(keep)` and the session runs
        nothing else meanwhile."""
        self._turn.acquire()
        try:
            if self._held:
                raise SandboxError("a held cell waits for settle(); settle it first")
            if not self.alive:
                self._process = None
                self._start()
            seq, self.seq = self.seq, self.seq + 1
            request = {"op": "run", "code": code, "file": f"{name}.py",
                       "figures": f"{name}_figure", "timeout": float(timeout), "hold": hold}
            process = self._process
            try:
                with process.lend():
                    reply = self._call(request, float(timeout) + _GRACE_S)
            except SessionLost as exc:
                self.close()
                reply = {"ok": False, "error": f"{exc}; the next cell starts a new session "
                         "and runs the recorded cells again", "names": [], "kept": False}
            reply.update(seq=seq, files=list(process.changed))
            for key in ("stdout", "stderr", "error"):
                if isinstance(reply.get(key), str):
                    reply[key] = scrub(reply[key])
            self._held = bool(hold and reply.get("ok"))
            return reply
        finally:
            if not self._held:
                self._turn.release()

    def settle(self, keep: bool) -> dict:
        """Keep or discard the held cell; {"kept": bool, "names"?: [...]}."""
        if not self._held:
            raise SandboxError("no cell is held")
        try:
            reply = self._call({"op": "keep" if keep else "drop"}, _GRACE_S)
        except SessionLost as exc:
            self.close()
            reply = {"ok": False, "kept": False, "error": str(exc)}
        finally:
            self._held = False
            self._turn.release()
        return reply


def one_error(reply: dict) -> str:
    """The last line of a cell's error output, or its error."""
    lines = [ln for ln in str(reply.get("stderr") or "").strip().splitlines() if ln.strip()]
    return (reply.get("error") or (lines[-1].strip() if lines else "") or "no error output")[:300]


@atexit.register
def _close_all() -> None:
    for session in list(_live):
        session.close()


# ------------------------------------------------------------------------- for prompts
def _prelude_names(workspace, have: list[str]) -> list[dict]:
    """The names the prelude defines, as the prompts list them before any cell has run."""
    out = [{"name": line.split()[-1], "type": "module", "about": line.split()[1]}
           for _, pip, line in LIBRARIES if line and pip in have]
    if "pandas" not in have:
        return out
    tables = table_names(workspace)
    entries = {str(i.path): i for i in getattr(workspace, "inputs", [])}
    for name, path, _ in tables:
        summary = str(getattr(entries.get(path), "summary", "") or "")
        first = summary.splitlines()[0] if summary else ""
        shape = re.match(r"(\d+) rows x (\d+) columns", first)
        columns = [line.strip()[2:].rsplit(":", 1)[0] for line in summary.splitlines()[1:]
                   if line.startswith("  - ")]
        about = (f"{shape.group(0)}: " if shape else "") + ", ".join(columns[:60])
        out.append({"name": name, "type": "DataFrame", "about": about or f"read from {path}",
                    "columns": columns[:60]})
    if tables and tables[0][0] != "df":
        out.append({**out[len(out) - len(tables)], "name": "df", "same_as": tables[0][0]})
    return out


def names_for(workflow, node_id: str, workspace, have: list[str] | None = None) -> list[dict]:
    """The names a node's code finds in the session that the prelude or its ancestors' code
    defined (or last changed), as the latest kept cell recorded them, each with `by`: the
    node whose code defined it, or "prelude"."""
    have = libraries() if have is None else list(have)
    current = {n["name"]: {**n, "by": "prelude"} for n in _prelude_names(workspace, have)}
    owner = {name: "prelude" for name in current}
    for cell in recorded_cells(workflow):
        for name in cell.get("defined") or []:
            owner[name] = cell["node"]
        names = [n for n in cell.get("names") or [] if isinstance(n, dict)]
        if names:   # the session's names after this cell, as it described them
            current = {n["name"]: n for n in names if isinstance(n.get("name"), str)}
    allowed = {"prelude", *workflow.ancestors(node_id)}
    return [{**info, "by": owner.get(name)} for name, info in current.items()
            if owner.get(name) in allowed]


_NAMES_SHOWN = 40

# numpy's std/var divide by n, pandas' (and a statistics question's usual meaning) by n - 1:
# the bench model reached for np.std on dabench-dev q666 and q619 and missed the label's
# sample standard deviation, which the one-call baseline (pandas .std()) got. The line names
# no keyword: worded "pass ddof=1 to them", it had the bench model pass ddof=1 to skew(),
# .corr() and np.corrcoef, which take none (5 of issue 29's seventh sample's first 20 flows,
# none of the 48 flows of the two samples before it; replayed first node prompts: 2 of 5 such
# answers with the old line, 0 of 6 with this one, q666 using pandas .std() with both).
SAMPLE_STD = ("A standard deviation or variance is the sample one (divided by n - 1) unless the "
              "task says population: use pandas' .std() and .var(); numpy's np.std and np.var "
              "give the population one.")


def _name_line(info: dict) -> str:
    name, kind, about = info.get("name"), info.get("type"), str(info.get("about") or "")
    if info.get("same_as"):   # its columns are listed once, under the first name
        text = f"- {name}: {kind}, the same object as {info['same_as']}"
    elif kind == "module":
        text = f"- {name}: {about}"
    elif kind in ("function", "class"):
        text = f"- {name}: a {kind}"
    else:
        text = f"- {name}: {kind}" + (f", {about}" if about and about != kind else "")
    by = info.get("by")
    return text[:300] + (f" (from {by})" if by and by != "prelude" else "")


def session_text(names: list[dict], have: Iterable[str] | None = None) -> str:
    """What a node's prompt says about the session its code runs in: the names it holds
    (from `names_for`) and the libraries that can be imported."""
    have = list(libraries() if have is None else have)
    shown = {n.get("name") for n in names[:_NAMES_SHOWN]}
    lines = [_name_line(n if n.get("same_as") in shown else {**n, "same_as": None})
             for n in names[:_NAMES_SHOWN]]
    if len(names) > _NAMES_SHOWN:
        lines.append(f"- and {len(names) - _NAMES_SHOWN} more")
    parts = []
    if lines:
        parts.append("Already defined in the session (use them as they are; do not import or "
                     "read the inputs again):\n" + "\n".join(lines))
    parts.append("Libraries you can import: " + (", ".join(have) or "the standard library only")
                 + ". Nothing else is installed, and nothing can be installed.")
    if "pandas" in have:
        parts.append(SAMPLE_STD)
    return "\n".join(parts)
