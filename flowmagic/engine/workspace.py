"""A run's workspace: the folder where its inputs, the files its agents write and its
figures live.

Each run gets one (`<home>/runs/<run id>/workspace`, or the `workdir=` the user gives).
Inputs are declared by the user: files (copied in, so the run never changes the
original), DataFrames and Series (saved as CSV, which every agent's pandas reads), and
other values (JSON when they can be, else their repr as text). `describe()` is what the
prompts show about them: name, kind, shape, columns with dtypes and a few rows.

Model-written code can write in the workspace, so flowmagic trusts nothing it finds there:
every host-side read and write goes through `engine.confined` (no symlink followed, regular
files only, bounded reads, every entry walked), and the record of the inputs
(`record`, `<home>/runs/<run id>/inputs.json`) is kept outside the folder the code can
write. A record found inside the workspace (`.flowmagic/inputs.json`, from an older
flowmagic) is used only for entries that name a regular file in it, and their
descriptions are made again from the files. An input, or a file the user already had, is
never replaced by flowmagic: a deliverable or an input of the same name gets a new one.
Files and folders starting with "." are flowmagic's own (and matplotlib's caches) and are
never listed as results.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import stat
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Iterable, Mapping

from ..errors import ConfigError, WorkspaceError
from . import confined

__all__ = ["Workspace", "InputFile", "MANIFEST", "RECORD", "RUNS"]

MANIFEST = ".flowmagic/inputs.json"   # where an older flowmagic kept the record (untrusted)
RECORD = "inputs.json"                # the record, beside the workspace of a run
RUNS = "flowmagic-runs"               # the run folders inside a workdir
# Rows shown to the agents: the first rows are the costliest part of every flow's first prompt
# (pandas pads each column to its widest cell). Over dabench-dev's 26 tables five rows took 390
# tokens on average (648 for a 15-column one), three 246: on a local 1.5B model reading ~40
# tokens/s that is ~4 s of every plan call; the column lines above them keep every dtype.
_ROWS = 3
_SCHEMA_ROWS = 2000       # rows read to find a CSV's dtypes
_HEAD_BYTES = 4 << 20     # of a table read to find its schema (never the whole file)
_COLUMNS = 60             # columns a description lists (the rest are counted)
# A shown cell's width: five rows of a table of news articles (a whole article per cell) made
# a 32 KB description, 8,500 tokens in every call of a flow (the bench model took 160-180 s
# per call to read them); 40 characters of each cell show what a column holds.
_CELL_CHARS = 40
_NAMED_COLUMNS = 1000     # column names `columns()` gives of one table
_MAX_VALUE_CHARS = 2000   # of a value's text shown in a prompt
_RECORD_BYTES = 8 << 20   # a record larger than this is not one flowmagic wrote
_KINDS = ("table", "file", "value")


@dataclass
class InputFile:
    """One declared input as the agents see it."""
    name: str                 # the variable or file name the user declared
    path: str                 # relative to the workspace
    kind: str                 # "table" (CSV), "file" or "value"
    summary: str = ""         # shape, columns and dtypes, a few rows (or the value's text)
    source: str | None = None  # where a copied file came from
    extra: dict = field(default_factory=dict)   # "example": the working start of a table

    def to_dict(self) -> dict:
        return asdict(self)


def _safe_name(name: str) -> str:
    keep = "".join(c if c.isalnum() or c in "-_." else "_" for c in str(name)).strip("._")
    return keep[:200] or "input"


def _table_summary(frame: Any, rows_total: int | None = None, columns_total: int | None = None) -> str:
    """Shape, one line per column (dtype, missing values; at most `_COLUMNS`), the first rows."""
    import pandas as pd

    rows = rows_total if rows_total is not None else len(frame)
    width = columns_total if columns_total is not None else frame.shape[1]
    lines = [f"{rows} rows x {width} columns"]
    for col in list(frame.columns)[:_COLUMNS]:
        missing = int(frame[col].isna().sum())
        lines.append(f"  - {col!s}: {frame[col].dtype}" + (f", {missing} missing in the first "
                                                           f"{len(frame)} rows" if missing else ""))
    if width > _COLUMNS:
        lines.append(f"  ... and {width - _COLUMNS} more columns (not listed)")
    with pd.option_context("display.width", 120, "display.max_columns", 30):
        shown = frame.iloc[:_ROWS, :_COLUMNS]
        lines.append(f"first {min(_ROWS, len(frame))} rows:\n"
                     f"{shown.to_string(max_colwidth=_CELL_CHARS)}")
    return "\n".join(lines)


# A line ends with \n, \r\n or a lone \r: 2 of dabench-dev's 26 tables end their lines with \r
# alone (old Mac, Excel on a Mac), which pandas reads and a split on \n made one line of.
_LINE_END = re.compile(rb"\r\n|\n|\r")


def _first_line(head: bytes) -> bytes:
    return _LINE_END.split(head, 1)[0]


def _count_lines(root: Path, rel: str) -> int:
    newlines = returns = 0
    with confined.opened(root, rel) as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            newlines += chunk.count(b"\n")
            returns += chunk.count(b"\r")
    return newlines or returns   # \r alone ends the lines of a file with no \n


def spaced_header(fields: list[str]) -> bool:
    """Whether every separator of a CSV's header (its fields as csv.reader splits them) is
    followed by a space (`a, b, c`, as some tools write them). pandas reads such a column as
    ' b', and code that says df['b'] (what a person or a model writes from the header) dies on
    a KeyError: on dabench-dev's baro_2015.csv the one-call baseline and the flow both failed
    every question that way. Such a table is read with skipinitialspace=True, in the
    description and in the prelude alike."""
    return len(fields) > 1 and all(f.startswith(" ") and f.strip() for f in fields[1:])


def _head_frame(root: Path, rel: str, sep: str) -> tuple[Any, int, int | None, bool]:
    """(the first rows of a table, its number of columns, its number of rows when the head
    is the whole file, else None, whether it is read with skipinitialspace), from at most
    `_HEAD_BYTES` of it and at most `_COLUMNS` + 1 of its columns: a table 300,000 columns
    wide or a file that is not a table costs the same as a small one (its header is split
    once). The rows are pandas' own count: a quoted value holding line breaks is one
    row of many lines (q209's news table: 691 lines, 166 rows, told as 691 rows beside a
    DataFrame of 166)."""
    import pandas as pd

    head, size = confined.read_head(root, rel, _HEAD_BYTES)
    whole = size <= len(head)
    if not whole:   # only whole lines
        head = head[: max(head.rfind(b"\n"), head.rfind(b"\r")) + 1]
    first = _first_line(head).decode("utf-8", "replace")
    if not first.strip():
        raise ValueError("no header line in the first 4 MB")
    header = next(csv.reader([first], delimiter=sep))
    width, spaced = len(header), spaced_header(header)
    frame = pd.read_csv(io.BytesIO(head), sep=sep, nrows=_SCHEMA_ROWS, skipinitialspace=spaced,
                        usecols=range(min(width, _COLUMNS + 1)) if width > _COLUMNS else None)
    rows = None
    if whole:
        rows = (len(frame) if len(frame) < _SCHEMA_ROWS
                else len(pd.read_csv(io.BytesIO(head), sep=sep, usecols=[0],
                                     skipinitialspace=spaced)))
    return frame, width, rows, spaced


def _file_summary(root: Path, rel: str) -> tuple[str, str, dict]:
    """(kind, summary, extra) of a file of the workspace: tables get their schema, text
    files their first lines; a table's extra holds its working start ("example") and, when
    its header is spaced, "spaced": True (how the prelude reads it)."""
    size = confined.file_stat(root, rel).st_size
    suffix = PurePosixPath(rel).suffix.lower()
    if suffix in (".csv", ".tsv"):
        sep = "\t" if suffix == ".tsv" else ","
        try:
            frame, width, rows, spaced = _head_frame(root, rel, sep)
            if rows is None:   # a file past the head: its lines (a row may span several)
                rows = max(0, _count_lines(root, rel) - 1)
            summary = _table_summary(frame, rows, width)
            example = _starter("df", frame)
            extra = {"example": example} if example else {}
            if spaced:
                extra["spaced"] = True
            return "table", summary, extra
        except Exception as exc:  # noqa: BLE001 - a bad CSV is still an input; say why it has no schema
            why = " ".join(str(exc).split())[:200]
            return "file", f"{size} bytes; pandas could not read it ({type(exc).__name__}: {why})", {}
    if suffix in (".parquet", ".pq"):
        return "table", f"{size} bytes (Parquet: read it with pandas.read_parquet)", {}
    head, _ = confined.read_head(root, rel, 600)
    try:
        return "file", f"{size} bytes, text; it starts:\n{head.decode('utf-8')}", {}
    except UnicodeDecodeError:
        return "file", f"{size} bytes, binary", {}


def read_spaced(entry: InputFile) -> bool:
    """Whether the prelude reads this table with skipinitialspace (`spaced_header` when it was
    added; a record written before, or one that says anything else, reads it as it did)."""
    return isinstance(entry.extra, dict) and entry.extra.get("spaced") is True


def _hidden(name: str) -> bool:
    return name.startswith((".", "__"))


class Workspace:
    """The folder of one run; see the module docstring. `record` is the file (outside the
    folder) where the inputs are recorded; None keeps them in memory only."""

    def __init__(self, root: str | os.PathLike, *, record: str | os.PathLike | None = None):
        self.root = Path(root).expanduser().resolve()
        self.record = Path(record) if record is not None else None
        try:
            (self.root / ".flowmagic").mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"cannot make the workspace {self.root} ({exc}); "
                              "give workdir= a writable folder") from None
        self.inputs: list[InputFile] = self._load()
        self.user_files: set[str] = set()   # files the user had here before the run
        self.shared = False   # the user's own folder (workdir_writes="all"), not a run's
        self._example: str | None = None

    @classmethod
    def for_run(cls, home: str | os.PathLike, run_id: str,
                workdir: str | os.PathLike | None = None, writes: str = "run") -> "Workspace":
        """The workspace of a run: `<home>/runs/<run>/workspace`; with a `workdir`, its run
        folder `<workdir>/flowmagic-runs/<run>`, or (`writes="all"`) the workdir itself, where
        the files the user had are never replaced by flowmagic."""
        run = Path(home) / "runs" / run_id
        if workdir is None:
            return cls(run / "workspace", record=run / RECORD)
        if writes == "run":
            return cls(Path(workdir).expanduser() / RUNS / run_id, record=run / RECORD)
        ws = cls(workdir, record=run / RECORD)
        ws.shared = True
        ws.user_files = set(ws.files()) - set(ws.inputs_paths())
        return ws

    def __repr__(self) -> str:
        return f"<Workspace {self.root}: {len(self.inputs)} input(s)>"

    # -- the record of the inputs --------------------------------------------------------------
    def _load(self) -> list[InputFile]:
        if self.record is not None and self.record.is_file():
            try:
                with open(self.record, "rb") as fh:
                    return self._checked(json.loads(fh.read(_RECORD_BYTES)), trusted=True)
            except (OSError, ValueError):
                return []
        try:   # an older flowmagic's record, inside the folder the code could write
            data = json.loads(confined.read_bytes(self.root, MANIFEST, limit=_RECORD_BYTES))
        except (WorkspaceError, ValueError):
            return []
        return self._checked(data, trusted=False)

    def _checked(self, data: Any, *, trusted: bool) -> list[InputFile]:
        """The entries that name a regular file of the workspace; an untrusted record's
        descriptions are made again from the files."""
        out = []
        for d in data if isinstance(data, list) else []:
            try:
                entry = InputFile(**d)
                confined.parts(entry.path)
            except (TypeError, WorkspaceError):
                continue
            if entry.kind not in _KINDS or confined.file_stat(self.root, entry.path) is None:
                continue
            if not trusted:
                kind, summary, extra = _file_summary(self.root, entry.path)
                entry = InputFile(str(entry.name)[:200], entry.path, kind, summary, None, extra)
            out.append(entry)
        return out

    def _save(self) -> None:
        if self.record is None:
            return
        self.record.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.record.with_suffix(".tmp")
        tmp.write_text(json.dumps([i.to_dict() for i in self.inputs], indent=1,
                                  ensure_ascii=False), "utf-8")
        os.replace(tmp, self.record)

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
        self._example = None
        return added

    def _target(self, wanted: str, source: str | None = None) -> str:
        """A new name for an input: `wanted`, unless something else is there already (an
        input of another source, a deliverable, a file of the user's): then a free variant,
        and one line says so."""
        same = next((i for i in self.inputs if i.path == wanted), None)
        if same is not None and (source is None or same.source == source):
            return wanted   # the same input declared again
        if not confined.exists(self.root, wanted):
            return wanted
        new = self.free_name(wanted)
        print(f"flowmagic: {wanted} is already in the workspace; this input is {new}",
              file=sys.stderr)
        return new

    def _replace(self, entry: InputFile) -> InputFile:
        self.inputs = [i for i in self.inputs if i.path != entry.path] + [entry]
        return entry

    def add_file(self, path: str | os.PathLike, name: str | None = None) -> InputFile:
        src = Path(path).expanduser()
        if not src.is_file():
            raise ConfigError(f"input file {src} does not exist; check the path "
                              "(it is read relative to the notebook's folder)")
        source = str(src.resolve())
        rel = self._target(_safe_name(name or src.name), source)
        if source != str(self.root / rel):
            try:   # a copy: the run never changes the user's original
                with open(src, "rb") as fh:
                    confined.write_stream(self.root, rel, fh)
            except OSError as exc:
                raise ConfigError(f"cannot copy the input {src} ({exc.strerror})") from None
        kind, summary, extra = _file_summary(self.root, rel)
        return self._replace(InputFile(rel, rel, kind, summary, source, extra))

    def add_value(self, name: str, value: Any) -> InputFile:
        """A value from the user's namespace: DataFrames and Series as CSV, else JSON or text."""
        kind = type(value).__module__.split(".")[0] + "." + type(value).__name__
        if kind in ("pandas.DataFrame", "pandas.Series"):
            frame = value.to_frame() if kind == "pandas.Series" else value
            rel = self._target(f"{_safe_name(name)}.csv")
            index = not _plain_index(frame)
            confined.write_bytes(self.root, rel, frame.to_csv(index=index).encode("utf-8"))
            summary = (f"the DataFrame `{name}` from the notebook, saved as CSV"
                       + (" with its index as the first column" if index else "")
                       + f"; load it with pandas.read_csv({rel!r})\n" + _table_summary(frame))
            example = _starter("df", _head_frame(self.root, rel, ",")[0])
            return self._replace(InputFile(name, rel, "table", summary, None, {"example": example}))
        try:
            text = json.dumps(value, ensure_ascii=False, indent=1)
            rel = f"{_safe_name(name)}.json"
        except (TypeError, ValueError):
            text = value if isinstance(value, str) else repr(value)
            rel = f"{_safe_name(name)}.txt"
        rel = self._target(rel)
        confined.write_bytes(self.root, rel, text.encode("utf-8"))
        shown = text if len(text) <= _MAX_VALUE_CHARS else (
            text[:_MAX_VALUE_CHARS] + f"\n[cut here: {len(text) - _MAX_VALUE_CHARS} more characters in the file]")
        return self._replace(InputFile(name, rel, "value",
                                       f"the value `{name}` ({type(value).__name__}):\n{shown}"))

    def describe(self) -> str:
        """What the prompts say about the inputs ('' when there are none)."""
        if not self.inputs:
            return ""
        parts = [f"- {i.path} ({i.kind}): {i.summary}" for i in self.inputs]
        return ("Input files, in the working directory of any Python you write "
                "(read them by these names):\n" + "\n".join(parts))

    def example(self) -> str:
        """A short pandas + matplotlib cell that works on the first table input in the flow's
        Python session (flowmagic.engine.session), where the prelude has imported pd, np and
        plt and read the table: it prints the table's shape, describe() and (with a text
        column) the means and the correlation of two numeric columns per group, and draws a
        plot of its real columns. '' without a
        table input.

        Small models (the embedded SmolLM2-135M) write code that rarely runs; given a start
        that runs, they adapt it, and what they print and draw is still computed from the
        data in the sandbox. The names come from the file itself, never from a model. It is
        made when the input is added (a prompt never reads the file again)."""
        if self._example is None:
            table = next((i for i in self.inputs if i.kind == "table"
                          and i.path.lower().endswith((".csv", ".tsv"))), None)
            self._example = (table.extra or {}).get("example", "") if table else ""
        return self._example

    def columns(self) -> dict[str, list[str]]:
        """{file: its column names} of every table input, read from the file's header (what
        a retry names on a KeyError: the real columns, never a model's idea of them); at
        most `_HEAD_BYTES` of each file are read, through the door, and `_NAMED_COLUMNS`
        names kept."""
        out = {}
        for table in self.inputs:
            if table.kind != "table" or not table.path.lower().endswith((".csv", ".tsv")):
                continue
            try:
                sep = "\t" if table.path.lower().endswith(".tsv") else ","
                head, _ = confined.read_head(self.root, table.path, _HEAD_BYTES)
                first = _first_line(head).decode("utf-8-sig", "replace")
                # csv, not pandas: pandas took 41 s over a header of 300,000 columns
                out[table.path] = next(csv.reader([first], delimiter=sep, skipinitialspace=(
                    read_spaced(table))))[:_NAMED_COLUMNS]
            except Exception:  # noqa: BLE001 - an unreadable table has no columns to name
                continue
        return out

    # -- files -------------------------------------------------------------------------------
    def inputs_paths(self) -> list[str]:
        return [i.path for i in self.inputs]

    def readonly(self) -> list[str]:
        """What the sandbox binds read-only over itself (absolute paths): every input, and in
        the user's own folder its `.git` (so no hook or config is planted there). Each is
        checked to be what it should (a regular file, a folder), never a link."""
        out = [str(self.root / i.path) for i in self.inputs
               if confined.file_stat(self.root, i.path) is not None]
        if self.shared:
            try:
                if stat.S_ISDIR(os.lstat(self.root / ".git").st_mode):
                    out.append(str(self.root / ".git"))
            except OSError:
                pass
        return out

    def has_git(self) -> bool:
        return self.shared and confined.exists(self.root, ".git")

    def drop_new_git(self, had: bool) -> str:
        """In the user's own folder, a `.git` the code made (`had`: one was there before) is
        deleted, so no hook of it runs when git is used there; returns the line saying so."""
        if not self.shared or had or not confined.exists(self.root, ".git"):
            return ""
        path = self.root / ".git"
        if os.path.islink(path) or not os.path.isdir(path):
            os.unlink(path)
        else:
            confined.remove_tree(path)
        return "the .git the code made in the workdir was deleted (git would run its hooks)"

    def files(self) -> list[str]:
        """Every regular file in the workspace (relative paths, sorted), flowmagic's own hidden
        ones left out; symlinks, FIFOs and the like are never listed."""
        return sorted(self.snapshot())

    def snapshot(self) -> dict[str, tuple[int, int, int]]:
        """{relative path: (size, mtime, inode)} of every listed file, every folder walked."""
        return {e.rel: (e.stat.st_size, e.stat.st_mtime_ns, e.stat.st_ino)
                for e in confined.walk(self.root, prune=_hidden)
                if e.stat.st_mode & 0o170000 == 0o100000
                and not any(_hidden(p) for p in e.rel.split("/"))}

    def changed_since(self, before: dict[str, tuple[int, int, int]]) -> list[str]:
        """The listed files made or changed since `before` (a `snapshot`), sorted."""
        return [rel for rel, sig in sorted(self.snapshot().items()) if before.get(rel) != sig]

    def write(self, rel: str, text: str | bytes) -> str:
        """Write a file of flowmagic's own (replacing one of that name) inside the workspace;
        a name that leaves it, or a way through a symlink, is WorkspaceError (one line)."""
        data = text.encode("utf-8") if isinstance(text, str) else text
        confined.write_bytes(self.root, rel, data)
        return "/".join(confined.parts(rel))

    def save(self, rel: str, text: str) -> str:
        """Save a deliverable; returns the name it got. An input, a file the user had in the
        folder (`user_files`) or anything there that is not a regular file is never replaced:
        the deliverable gets a free variant of the name (the caller says so). A file of this
        run (an earlier deliverable, what code wrote) is replaced."""
        rel = "/".join(confined.parts(rel))
        if (rel in self.inputs_paths() or rel in self.user_files
                or (confined.exists(self.root, rel) and confined.file_stat(self.root, rel) is None)):
            rel = self.free_name(rel)
        self.write(rel, text)
        return rel

    def free_name(self, rel: str) -> str:
        """`rel`, or `stem-2.ext`, `stem-3.ext`, ...: the first that names nothing yet."""
        path = PurePosixPath(rel)
        n = 2
        while (rel in self.inputs_paths() or rel in self.user_files
               or confined.exists(self.root, rel)):
            rel = str(path.with_name(f"{path.stem}-{n}{path.suffix}"))
            n += 1
        return rel

    def read_bytes(self, rel: str, limit: int) -> bytes:
        """The bytes of a regular file of the workspace (WorkspaceError: a link, a FIFO, a
        folder, over `limit` bytes, a name that leaves the workspace)."""
        return confined.read_bytes(self.root, rel, limit=limit)

    def read_text(self, rel: str, limit: int) -> str:
        return self.read_bytes(rel, limit).decode("utf-8", "replace")

    def copy_to(self, folder: str | os.PathLike) -> list[Path]:
        """Copy every listed file to `folder` (kept relative; no executable bit, no link
        followed on either side); returns the new paths."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        out = []
        for rel in self.files():
            try:
                with confined.opened(self.root, rel) as fh:
                    confined.write_stream(folder, rel, fh)
            except WorkspaceError:   # changed into something else since it was listed
                continue
            out.append(folder / rel)
        return out


def _starter(name: str, frame: Any) -> str:
    """The example cell of `Workspace.example` for one table, read by the prelude into
    `name` (column names quoted)."""
    from pandas.api import types

    numeric = [c for c in frame.columns if types.is_numeric_dtype(frame[c])
               and not types.is_bool_dtype(frame[c])]
    text = [c for c in frame.columns if (types.is_string_dtype(frame[c])
                                         or types.is_object_dtype(frame[c]))
            and 1 < frame[c].nunique() <= 20]
    lines = [f"print({name}.shape)", f"print({name}.describe())"]
    if text and numeric:
        lines.append(f"print({name}.groupby({str(text[0])!r})[{[str(c) for c in numeric[:3]]!r}].mean())")
    if text and len(numeric) >= 2:   # what a relationship per group is: its correlation
        pair = [str(numeric[0]), str(numeric[1])]
        lines.append(f"print({name}.groupby({str(text[0])!r})[{pair!r}].corr())")
    if len(numeric) >= 2:
        x, y = str(numeric[0]), str(numeric[1])
        lines += [f"{name}.plot.scatter(x={x!r}, y={y!r})", f"plt.title({f'{y} against {x}'!r})"]
    elif numeric:
        lines += [f"{name}[{str(numeric[0])!r}].plot.hist()", f"plt.title({str(numeric[0])!r})"]
    elif len(frame.columns):
        first = str(frame.columns[0])
        lines += [f"{name}[{first!r}].value_counts().head(10).plot.bar()", f"plt.title({first!r})"]
    return "\n".join(lines) + "\n"


def _plain_index(frame: Any) -> bool:
    """A 0..n-1 RangeIndex carries nothing worth a CSV column."""
    import pandas as pd

    index = frame.index
    return (isinstance(index, pd.RangeIndex) and index.start == 0 and index.step == 1
            and index.name is None)
