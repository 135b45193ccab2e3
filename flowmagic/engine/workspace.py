"""A run's workspace: the folder where its inputs, the files its agents write and its
figures live.

Each run gets one (`<home>/runs/<run id>/workspace`, or the `workdir=` the user gives).
Inputs are declared by the user: files (copied in, so the run never changes the
original), DataFrames and Series (saved as CSV, which every agent's pandas reads), and
other values (JSON when they can be, else their repr as text). `describe()` is what the
prompts show about them: name, kind, shape, columns with dtypes and a few rows. The
description is kept in `.flowmagic/inputs.json` inside the workspace, so a resumed run
(`flowmagic.load`) tells its agents the same. Files and folders starting with "." are
flowmagic's own (and matplotlib's caches) and are never listed as results.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from ..errors import ConfigError

__all__ = ["Workspace", "InputFile", "MANIFEST"]

MANIFEST = ".flowmagic/inputs.json"
_ROWS = 5                 # rows shown to the agents
_SCHEMA_ROWS = 2000       # rows read to find a CSV's dtypes
_MAX_VALUE_CHARS = 2000   # of a value's text shown in a prompt


@dataclass
class InputFile:
    """One declared input as the agents see it."""
    name: str                 # the variable or file name the user declared
    path: str                 # relative to the workspace
    kind: str                 # "table" (CSV), "file" or "value"
    summary: str = ""         # shape, columns and dtypes, a few rows (or the value's text)
    source: str | None = None  # where a copied file came from
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def _safe_name(name: str) -> str:
    keep = "".join(c if c.isalnum() or c in "-_." else "_" for c in str(name)).strip("._")
    return keep or "input"


def _table_summary(frame: Any, rows_total: int | None = None) -> str:
    """Shape, one line per column (dtype, missing values) and the first rows."""
    import pandas as pd

    rows = rows_total if rows_total is not None else len(frame)
    lines = [f"{rows} rows x {frame.shape[1]} columns"]
    for col in frame.columns:
        missing = int(frame[col].isna().sum())
        lines.append(f"  - {col!s}: {frame[col].dtype}" + (f", {missing} missing in the first "
                                                           f"{len(frame)} rows" if missing else ""))
    with pd.option_context("display.width", 120, "display.max_columns", 30):
        lines.append(f"first {min(_ROWS, len(frame))} rows:\n{frame.head(_ROWS).to_string()}")
    return "\n".join(lines)


def _count_lines(path: Path) -> int:
    with open(path, "rb") as fh:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 20), b""))


def _file_summary(path: Path) -> tuple[str, str]:
    """(kind, summary) of a file: tables get their schema, text files their first lines."""
    size = path.stat().st_size
    suffix = path.suffix.lower()
    if suffix in (".csv", ".tsv"):
        try:
            import pandas as pd

            frame = pd.read_csv(path, sep="\t" if suffix == ".tsv" else ",", nrows=_SCHEMA_ROWS)
            return "table", _table_summary(frame, max(0, _count_lines(path) - 1))
        except Exception as exc:  # noqa: BLE001 - a bad CSV is still an input; say why it has no schema
            return "file", f"{size} bytes; pandas could not read it ({type(exc).__name__}: {exc})"
    if suffix in (".parquet", ".pq"):
        return "table", f"{size} bytes (Parquet: read it with pandas.read_parquet)"
    try:
        with open(path, encoding="utf-8") as fh:
            head = fh.read(600)
        return "file", f"{size} bytes, text; it starts:\n{head}"
    except (UnicodeDecodeError, OSError):
        return "file", f"{size} bytes, binary"


class Workspace:
    """The folder of one run; see the module docstring."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root).expanduser().resolve()
        try:
            (self.root / ".flowmagic").mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"cannot make the workspace {self.root} ({exc}); "
                              "give workdir= a writable folder") from None
        self.inputs: list[InputFile] = []
        manifest = self.root / MANIFEST
        if manifest.exists():
            try:
                self.inputs = [InputFile(**d) for d in json.loads(manifest.read_text("utf-8"))]
            except (ValueError, TypeError):
                self.inputs = []

    @classmethod
    def for_run(cls, home: str | os.PathLike, run_id: str) -> "Workspace":
        return cls(Path(home) / "runs" / run_id / "workspace")

    def __repr__(self) -> str:
        return f"<Workspace {self.root}: {len(self.inputs)} input(s), {len(self.files())} file(s)>"

    # -- inputs ------------------------------------------------------------------------------
    def add(self, inputs: Any) -> list[InputFile]:
        """Declare inputs: a path, a list of paths, or a {name: value or path} mapping."""
        if inputs is None:
            return []
        if isinstance(inputs, (str, os.PathLike)):
            inputs = [inputs]
        added = []
        if isinstance(inputs, Mapping):
            for name, value in inputs.items():
                if isinstance(value, (str, os.PathLike)) and Path(value).is_file():
                    added.append(self.add_file(value, name=None))
                else:
                    added.append(self.add_value(str(name), value))
        elif isinstance(inputs, Iterable):
            for item in inputs:
                if isinstance(item, Mapping):
                    added += self.add(item)
                    continue
                if not isinstance(item, (str, os.PathLike)):
                    raise ConfigError(f"inputs=[...] takes file paths, not {type(item).__name__}; "
                                      "give values by name: inputs={'df': df}")
                added.append(self.add_file(item))
        else:
            raise ConfigError(f"inputs takes paths or a {{name: value}} dict, not {type(inputs).__name__}")
        self._save()
        return added

    def _replace(self, entry: InputFile) -> InputFile:
        self.inputs = [i for i in self.inputs if i.path != entry.path] + [entry]
        return entry

    def add_file(self, path: str | os.PathLike, name: str | None = None) -> InputFile:
        src = Path(path).expanduser()
        if not src.is_file():
            raise ConfigError(f"input file {src} does not exist; check the path "
                              "(it is read relative to the notebook's folder)")
        target = self.root / _safe_name(name or src.name)
        if src.resolve() != target.resolve():
            shutil.copy2(src, target)   # a copy: the run never changes the user's original
        kind, summary = _file_summary(target)
        return self._replace(InputFile(target.name, target.name, kind, summary, str(src.resolve())))

    def add_value(self, name: str, value: Any) -> InputFile:
        """A value from the user's namespace: DataFrames and Series as CSV, else JSON or text."""
        kind = type(value).__module__.split(".")[0] + "." + type(value).__name__
        if kind in ("pandas.DataFrame", "pandas.Series"):
            frame = value.to_frame() if kind == "pandas.Series" else value
            target = self.root / f"{_safe_name(name)}.csv"
            index = not _plain_index(frame)
            frame.to_csv(target, index=index)
            summary = (f"the DataFrame `{name}` from the notebook, saved as CSV"
                       + (" with its index as the first column" if index else "")
                       + f"; load it with pandas.read_csv({target.name!r})\n" + _table_summary(frame))
            return self._replace(InputFile(name, target.name, "table", summary))
        try:
            text = json.dumps(value, ensure_ascii=False, indent=1)
            target = self.root / f"{_safe_name(name)}.json"
        except (TypeError, ValueError):
            text = value if isinstance(value, str) else repr(value)
            target = self.root / f"{_safe_name(name)}.txt"
        target.write_text(text, encoding="utf-8")
        shown = text if len(text) <= _MAX_VALUE_CHARS else (
            text[:_MAX_VALUE_CHARS] + f"\n[cut here: {len(text) - _MAX_VALUE_CHARS} more characters in the file]")
        return self._replace(InputFile(name, target.name, "value",
                                       f"the value `{name}` ({type(value).__name__}):\n{shown}"))

    def _save(self) -> None:
        (self.root / MANIFEST).write_text(
            json.dumps([i.to_dict() for i in self.inputs], indent=1, ensure_ascii=False), "utf-8")

    def describe(self) -> str:
        """What the prompts say about the inputs ('' when there are none)."""
        if not self.inputs:
            return ""
        parts = [f"- {i.path} ({i.kind}): {i.summary}" for i in self.inputs]
        return ("Input files, in the working directory of any Python you write "
                "(read them by these names):\n" + "\n".join(parts))

    def example(self) -> str:
        """A short pandas + matplotlib program that works on the first table input: it reads
        the file by its name, prints its shape, describe() and (with a text column) the
        means per group, and draws a plot of its real columns. '' without a table input.

        Small models (the embedded SmolLM2-135M) write code that rarely runs; given a start
        that runs, they adapt it, and what they print and draw is still computed from the
        data in the sandbox. The names come from the file itself, never from a model."""
        table = next((i for i in self.inputs if i.kind == "table"
                      and i.path.lower().endswith((".csv", ".tsv"))), None)
        if table is None:
            return ""
        try:
            import pandas as pd

            sep = "\t" if table.path.lower().endswith(".tsv") else ","
            frame = pd.read_csv(self.root / table.path, sep=sep, nrows=_SCHEMA_ROWS)
        except Exception:  # noqa: BLE001 - no schema, no example; the description says why
            return ""
        return _starter(table.path, sep, frame)

    def columns(self) -> dict[str, list[str]]:
        """{file: its column names} of every table input, read from the file's header (what
        a retry names on a KeyError: the real columns, never a model's idea of them)."""
        out = {}
        for table in self.inputs:
            if table.kind != "table" or not table.path.lower().endswith((".csv", ".tsv")):
                continue
            try:
                import pandas as pd

                sep = "\t" if table.path.lower().endswith(".tsv") else ","
                out[table.path] = [str(c) for c in pd.read_csv(self.root / table.path, sep=sep,
                                                               nrows=0).columns]
            except Exception:  # noqa: BLE001 - an unreadable table has no columns to name
                continue
        return out

    # -- files -------------------------------------------------------------------------------
    def files(self) -> list[str]:
        """Every file in the workspace (relative paths, sorted), flowmagic's own hidden ones left out."""
        out = []
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "__")))
            rel = Path(dirpath).relative_to(self.root)
            out += [str(rel / f) if str(rel) != "." else f for f in filenames if not f.startswith(".")]
        return sorted(out)

    def snapshot(self) -> dict[str, tuple[int, int]]:
        out = {}
        for rel in self.files():
            st = (self.root / rel).stat()
            out[rel] = (st.st_size, st.st_mtime_ns)
        return out

    def changed_since(self, before: dict[str, tuple[int, int]]) -> list[str]:
        now = self.snapshot()
        return [rel for rel, sig in now.items() if before.get(rel) != sig]

    def write(self, rel: str, text: str) -> str:
        """Write a text file inside the workspace; a path that leaves it is refused."""
        target = (self.root / rel).resolve()
        if self.root not in target.parents:
            raise ConfigError(f"file name {rel!r} leaves the workspace")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        return str(target.relative_to(self.root))

    def copy_to(self, folder: str | os.PathLike) -> list[Path]:
        """Copy every listed file to `folder` (kept relative); returns the new paths."""
        folder = Path(folder)
        out = []
        for rel in self.files():
            dest = folder / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(self.root / rel, dest)
            out.append(dest)
        return out


def _starter(path: str, sep: str, frame: Any) -> str:
    """The example program of `Workspace.example` for one table (column names quoted)."""
    from pandas.api import types

    numeric = [c for c in frame.columns if types.is_numeric_dtype(frame[c])
               and not types.is_bool_dtype(frame[c])]
    text = [c for c in frame.columns if (types.is_string_dtype(frame[c])
                                         or types.is_object_dtype(frame[c]))
            and 1 < frame[c].nunique() <= 20]
    read = f"pd.read_csv({path!r}" + (", sep='\\t')" if sep != "," else ")")
    lines = ["import pandas as pd", "import matplotlib.pyplot as plt", "",
             f"df = {read}", "print(df.shape)", "print(df.describe())"]
    if text and numeric:
        lines.append(f"print(df.groupby({str(text[0])!r})[{[str(c) for c in numeric[:3]]!r}].mean())")
    if len(numeric) >= 2:
        x, y = str(numeric[0]), str(numeric[1])
        lines += [f"df.plot.scatter(x={x!r}, y={y!r})", f"plt.title({f'{y} against {x}'!r})"]
    elif numeric:
        lines += [f"df[{str(numeric[0])!r}].plot.hist()", f"plt.title({str(numeric[0])!r})"]
    elif len(frame.columns):
        first = str(frame.columns[0])
        lines += [f"df[{first!r}].value_counts().head(10).plot.bar()", f"plt.title({first!r})"]
    return "\n".join(lines) + "\n"


def _plain_index(frame: Any) -> bool:
    """A 0..n-1 RangeIndex carries nothing worth a CSV column."""
    import pandas as pd

    index = frame.index
    return (isinstance(index, pd.RangeIndex) and index.start == 0 and index.step == 1
            and index.name is None)
