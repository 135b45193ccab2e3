"""Notebooks as programs: parameters, templates and headless runs.

Parameters follow papermill: the cell tagged `parameters` holds the defaults as plain
assignments, and a run with new values gets a cell tagged `injected-parameters` right
after it (replaced, not stacked, on the next run). A template's `%%flow` cell uses the
parameters as `{{name}}`, which the magic fills from the notebook's variables.

Templates are the notebooks in `flowmagic/templates/` (shown at the top of the repository
as `templates/`); their metadata `flowmagic.template` gives a title and a description.
`execute` runs a notebook headless with nbclient in a kernel that inherits this process's
environment, so FLOWMAGIC_HOME and the endpoint settings are the same on both sides.
"""

from __future__ import annotations

import ast
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from ..errors import ConfigError, FlowError, write_error

__all__ = ["TEMPLATES", "templates", "template_path", "parameters_of", "parse_params",
           "fill", "new", "execute", "NOTICE", "sample_data"]

TEMPLATES = Path(__file__).resolve().parent.parent / "templates"
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
NOTICE = "flowmagic: using the embedded"   # local.py's one-time notice, not an error


def _read(path: str | Path):
    from .._internal.nbformat_import import nbformat

    try:
        return nbformat.read(str(path), as_version=4)
    except FileNotFoundError:
        raise ConfigError(f"no notebook at {path}") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path} is not a notebook nbformat can read ({exc})") from None


def _tagged(nb, tag: str) -> int | None:
    for i, cell in enumerate(nb.cells):
        if tag in cell.get("metadata", {}).get("tags", []):
            return i
    return None


def _assignments(source: str, what: str) -> dict[str, Any]:
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise ConfigError(f"the {what} cell is not Python ({exc.msg}, line {exc.lineno})") from None
    out: dict[str, Any] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 \
                and isinstance(stmt.targets[0], ast.Name):
            try:
                out[stmt.targets[0].id] = ast.literal_eval(stmt.value)
            except ValueError:
                out[stmt.targets[0].id] = None   # not a literal: any value will do
    return out


def parameters_of(nb) -> dict[str, Any]:
    """The defaults in the cell tagged `parameters` (assignments of Python literals)."""
    index = _tagged(nb, "parameters")
    return {} if index is None else _assignments(nb.cells[index].source, "parameters")


def _typed(key: str, text: str, default: Any) -> Any:
    """`text` as the type of the default (str stays str; bool, int, float converted)."""
    try:
        if isinstance(default, bool):
            low = text.strip().lower()
            if low not in _TRUE + _FALSE:
                raise ValueError(text)
            return low in _TRUE
        if isinstance(default, int):
            return int(text)
        if isinstance(default, float):
            return float(text)
        if isinstance(default, str):
            return text
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        if default is None:
            return text
        raise ConfigError(f"parameter {key}={text!r} should be a {type(default).__name__} "
                          f"like the default {default!r}") from None


def parse_params(pairs: list[str] | None, defaults: dict[str, Any]) -> dict[str, Any]:
    """`["key=value", ...]` typed by the defaults; unknown keys are an error."""
    out = {}
    for pair in pairs or []:
        key, sep, text = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"-p takes key=value, not {pair!r}")
        if key not in defaults:
            known = ", ".join(defaults) or "none (no cell is tagged 'parameters')"
            raise ConfigError(f"unknown parameter {key!r}; this notebook takes: {known}")
        out[key] = _typed(key, text, defaults[key])
    return out


def fill(nb, params: dict[str, Any]):
    """Put `params` in a cell tagged `injected-parameters` after the parameters cell (as
    papermill does; values injected by an earlier fill are kept unless given again)."""
    from .._internal.nbformat_import import v4

    if not params:
        return nb
    old = _tagged(nb, "injected-parameters")
    if old is not None:   # values injected before stay unless given again
        params = {**_assignments(nb.cells[old].source, "injected-parameters"), **params}
        del nb.cells[old]
    anchor = _tagged(nb, "parameters")
    where = 0 if anchor is None else anchor + 1
    source = "# Parameters\n" + "\n".join(f"{k} = {v!r}" for k, v in params.items())
    nb.cells.insert(where, v4.new_code_cell(source, metadata={"tags": ["injected-parameters"]}))
    return nb


# ----------------------------------------------------------------------------- templates
def templates() -> list[dict]:
    """Every packaged template: name, title, description, parameters and path."""
    out = []
    for path in sorted(TEMPLATES.glob("*.ipynb")):
        nb = _read(path)
        info = nb.metadata.get("flowmagic", {}).get("template", {})
        out.append({"name": path.stem, "title": info.get("title", path.stem),
                    "description": info.get("description", ""),
                    "parameters": parameters_of(nb), "path": path})
    return out


def sample_data(name: str = "anscombe.csv") -> Path:
    """A data file shipped with the templates (the csv_eda template's default input)."""
    path = TEMPLATES / "data" / name
    if not path.is_file():
        known = ", ".join(sorted(p.name for p in (TEMPLATES / "data").iterdir()))
        raise ConfigError(f"no sample data {name!r}; shipped: {known}")
    return path


def template_path(name: str) -> Path:
    path = TEMPLATES / f"{Path(name).stem}.ipynb"
    if not path.is_file():
        known = ", ".join(t["name"] for t in templates())
        raise ConfigError(f"no template {name!r}; templates: {known} (see `flowmagic templates`)")
    return path


def new(template: str, out: str | Path, params: list[str] | dict | None = None, *,
        force: bool = False) -> Path:
    """A notebook made from a template, with the given parameters filled in."""
    from .._internal.nbformat_import import nbformat

    out = Path(out)
    if out.suffix != ".ipynb":
        raise ConfigError(f"{out} should end in .ipynb")
    if out.exists() and not force:
        raise ConfigError(f"{out} exists; pick another name or pass --force")
    nb = _read(template_path(template))
    defaults = parameters_of(nb)
    given = params if isinstance(params, dict) else parse_params(params, defaults)
    fill(nb, given)
    nb.metadata.setdefault("flowmagic", {}).setdefault("template", {})["parameters"] = \
        {**defaults, **given}
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, str(out))
    except OSError as exc:
        raise write_error(out, exc) from None
    return out


# ----------------------------------------------------------------------------- headless runs
def _label(cell) -> str:
    first = (cell.source.strip().splitlines() or [""])[0]
    return first if len(first) <= 60 else first[:59] + "…"


def _flow_errors(nb) -> list[str]:
    """The one-line errors flowmagic's magics printed (they never raise into the kernel)."""
    found = []
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream" and out.get("name") == "stderr":
                found += [f"cell {i}: {line}" for line in out.get("text", "").splitlines()
                          if line.startswith("flowmagic: ") and not line.startswith(NOTICE)]
    return found


def execute(path: str | Path, out: str | Path | None = None, *, params: list[str] | None = None,
            timeout: float = 1800, progress: Callable[[str], None] | None = None) -> dict:
    """Run a notebook top to bottom; write it (with outputs) to `out` (default: in place).

    Returns {"path", "cells", "seconds", "calls", "cached", "errors"}: the model calls
    made while it ran (the kernel shares this process's FLOWMAGIC_HOME).
    """
    from .._internal.nbformat_import import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, DeadKernelError

    from ..store import get_store

    path = Path(path)
    out = Path(out) if out else path
    nb = _read(path)
    fill(nb, parse_params(params, parameters_of(nb)))
    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    say = progress or (lambda line: None)
    started = time.perf_counter()
    clock = {"cell": started}

    def on_start(cell, cell_index, **_):
        clock["cell"] = time.perf_counter()

    def on_done(cell, cell_index, **_):
        n = code.index(cell_index) + 1 if cell_index in code else cell_index
        say(f"cell {n}/{len(code)} {time.perf_counter() - clock['cell']:5.1f}s  {_label(cell)}")

    store = get_store()
    first, cached0 = store.count_calls(cached=False), store.count_calls(cached=True)
    kernel = nb.metadata.get("kernelspec", {}).get("name") or "python3"
    client = NotebookClient(nb, timeout=timeout, kernel_name=kernel,
                            resources={"metadata": {"path": str(path.resolve().parent)}},
                            on_cell_start=on_start, on_cell_executed=on_done)
    out.parent.mkdir(parents=True, exist_ok=True)
    # The kernel's own log (start-up notices) would land on our stderr, or inside the cell
    # that runs us; it is kept aside and shown only when the kernel dies.
    with tempfile.TemporaryFile("w+") as log:
        try:
            client.execute(stderr=log)
        except CellExecutionError as exc:
            nbformat.write(nb, str(out))
            what = f"{getattr(exc, 'ename', 'Error')}: {getattr(exc, 'evalue', '')}".strip()
            raise FlowError(f"a cell of {path.name} failed ({what}); the notebook with its "
                            f"outputs so far is in {out}") from None
        except DeadKernelError:
            log.seek(0)
            tail = " | ".join(log.read().strip().splitlines()[-3:])
            raise FlowError(f"the kernel running {path.name} died ({tail or 'no message'}); "
                            "check that ipykernel is installed in this environment") from None
    nbformat.write(nb, str(out))
    return {"path": out, "cells": len(code), "seconds": time.perf_counter() - started,
            "calls": store.count_calls(cached=False) - first,
            "cached": store.count_calls(cached=True) - cached0, "errors": _flow_errors(nb)}
