"""An exported notebook's code cells run again: one sandboxed session per flow, and the check
that they print what they printed in the run.

An exported notebook's `%%flow_code` cells show their recorded runs. With `--execute` on a
cell's line, or FLOWMAGIC_EXECUTE_CODE=1 in the kernel's environment (`flowmagic export RUN
OUT.ipynb --execute`), their code runs again, in the sandbox only, as cells of one session
per flow (flowmagic.engine.session) in the run's files next to the notebook
(`<notebook>_files/`): the prelude first (the notebook's first code cell of the flow, as the
run's session ran it), then each cell in the order the run's session ran them, which is the
order of the notebook. A cell run again after earlier ones were only shown runs those
earlier ones first (their recorded code, quietly), so it finds what it found in the run.

`mismatches(recorded, executed)` compares two versions of a notebook cell by cell as nbval
does: each code cell's printed text, after the sanitizing regexes of flowmagic/nbval.cfg,
and the number of its figures; one line per cell that differs.
"""

from __future__ import annotations

import configparser
import re
import weakref
from pathlib import Path
from typing import Any

from .._internal.text import short_repr
from ..engine.answer_code import run_python
from ..engine.session import Session, kept_cells
from ..engine.workspace import Workspace
from ..errors import ConfigError

__all__ = ["python", "run_cell", "recorded_cells", "mismatches", "SANITIZE"]

SANITIZE = Path(__file__).resolve().parent.parent / "nbval.cfg"


class _Python:
    """The notebook's session of one flow, and which recorded cells it has run."""

    def __init__(self, folder: Path, prelude: str, sandbox: str):
        self.folder = folder
        self.session = Session(Workspace(folder), sandbox=sandbox, prelude=prelude)
        self.ran: set[int] = set()


_PYTHONS: "weakref.WeakKeyDictionary[Any, _Python]" = weakref.WeakKeyDictionary()


def _folder(flow, record: dict) -> Path:
    where = record.get("files_dir") or f"{flow.name}_files"
    # the record is notebook text anyone can edit: its folder must be one next to the notebook
    if (not isinstance(where, str) or where in (".", "..")
            or any(c in where for c in "/\\\0") or Path(where).is_absolute()):
        raise ConfigError(f"the record's files folder {short_repr(where, 60)} is not a folder "
                          "name next to the notebook; export the flow again")
    folder = Path.cwd() / where
    if not folder.is_dir():
        raise ConfigError(f"the run's files are not next to the notebook ({folder} is missing); "
                          "export the flow again, or copy that folder back")
    return folder


def python(flow, record: dict, prelude: str | None = None) -> _Python:
    """The flow's session in this kernel (started with the record's prelude, or `prelude`:
    the prelude cell's own text, when that cell runs)."""
    found = _PYTHONS.get(flow)
    if found is None:
        found = _Python(_folder(flow, record), record.get("prelude") if prelude is None
                        else prelude, flow.settings.sandbox or "bwrap")
        weakref.finalize(flow, found.session.close)
        _PYTHONS[flow] = found
    return found


def recorded_cells(record: dict) -> list[dict]:
    """The code runs the run's session kept, from the record, in their order."""
    nodes = record.get("nodes") or {}
    return kept_cells((node_id, rec.get("execution"), rec.get("attempts") or [])
                      for node_id, rec in nodes.items() if isinstance(rec, dict))


def run_cell(flow, record: dict, node_id: str, code: str, seq: int | None) -> dict:
    """Run a code cell again in the flow's session; its new execution record. `seq`: the
    cell's place in the run's session (None: after every recorded cell)."""
    py = python(flow, record)
    timeout = float(flow.settings.code_timeout or 60.0)
    for cell in recorded_cells(record):
        if (seq is None or cell["seq"] < seq) and cell["seq"] not in py.ran:
            py.session.run(cell.get("code") or "", name=cell["node"], timeout=timeout)
            py.ran.add(cell["seq"])
    ex = run_python(py.session.workspace, node_id, code, timeout=timeout,
                    session=py.session).to_dict()
    if seq is not None and ex.get("kept"):
        py.ran.add(seq)
    return ex


# ------------------------------------------------------------------------- the check
def _rules() -> list[tuple[re.Pattern, str]]:
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(SANITIZE)
    return [(re.compile(parser[s]["regex"]), parser[s]["replace"]) for s in parser.sections()]


def _printed(cell, rules) -> tuple[str, int]:
    text = "".join(o.get("text", "") for o in cell.get("outputs", [])
                   if o.get("output_type") == "stream" and o.get("name") == "stdout")
    for pattern, replace in rules:
        text = pattern.sub(replace, text)
    figures = sum(1 for o in cell.get("outputs", []) if "image/png" in (o.get("data") or {}))
    return text, figures


def _first_difference(a: str, b: str) -> str:
    left, right = a.splitlines(), b.splitlines()
    for i, (x, y) in enumerate(zip(left, right), 1):
        if x != y:
            return f"line {i}: recorded {x[:80]!r}, now {y[:80]!r}"
    if len(left) != len(right):
        return f"recorded {len(left)} lines, now {len(right)}"
    return "white space differs"


def mismatches(recorded, executed) -> list[str]:
    """One line per `%%flow_code` cell whose printed output (or count of figures) differs
    between two versions of a notebook (the cells in the same places)."""
    rules = _rules()
    out, number = [], 0
    for before, after in zip(recorded.cells, executed.cells):
        if before.cell_type != "code":
            continue
        number += 1
        if not before.source.startswith("%%flow_code"):
            continue
        (text_a, figs_a), (text_b, figs_b) = _printed(before, rules), _printed(after, rules)
        meta = before.get("metadata", {}).get("flowmagic", {})
        where = f"Cell {number} (" + (f"node {meta['node']}" if meta.get("node") else "prelude") + ")"
        if text_a != text_b:
            out.append(f"{where}: the printed output differs, {_first_difference(text_a, text_b)}")
        elif figs_a != figs_b:
            out.append(f"{where}: {figs_a} figure(s) recorded, {figs_b} now")
    return out
