"""What a failed code run says to the model, in terms it can act on.

A traceback alone sent small models back to the same mistake (the same missing import three
times in a row). The retry instead names the line that failed, the error, and what the fix
needs to know: the names the session holds on a NameError, the real columns on a KeyError,
the libraries that exist on a ModuleNotFoundError, the files there are on a
FileNotFoundError, and that the error is the same as last time when it is.

Also here: whether a node failed on its code (a failure a code fix answers, not a rewritten
instruction nor another agent: engine/repairs.py asks `code_failure`).
"""

from __future__ import annotations

import difflib
import functools
import importlib.util
import re
from typing import Any, Iterable, Mapping

__all__ = ["CODE_FAILED", "code_feedback", "failing_line", "error_of", "code_failure",
           "available_libraries", "DATA_LIBRARIES", "hollow_result"]

CODE_FAILED = "The code failed"   # how a failed run's feedback begins (runner, repairs)
# The libraries a data scientist expects, as imported (module name, what to write).
DATA_LIBRARIES = (("numpy", "import numpy as np"), ("pandas", "import pandas as pd"),
                  ("matplotlib", "import matplotlib.pyplot as plt"), ("scipy", "import scipy"),
                  ("sklearn", "scikit-learn: import sklearn"),
                  ("statsmodels", "import statsmodels.api as sm"),
                  ("seaborn", "import seaborn as sns"), ("pyarrow", "import pyarrow"))
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+)')
_NAME_ERROR = re.compile(r"NameError: name '([^']+)' is not defined")
_KEY_ERROR = re.compile(r"KeyError: (.+)$")
_MODULE = re.compile(r"No module named '([^'.]+)")
_ATTRIBUTE = re.compile(r"AttributeError: '(DataFrame|Series|DataFrameGroupBy)' object has no "
                        r"attribute '([^']+)'")
_SCALAR_ATTRIBUTE = re.compile(r"AttributeError: '((?:numpy\.)?(?:float|int|str|bool)\w*)' "
                               r"object has no attribute '([^']+)'")
_UNPACK = re.compile(r"cannot unpack non-iterable (\S+) object")
_KEYWORD = re.compile(r"(\S+?)\(\) got an unexpected keyword argument '([^']+)'")
_ALL_MISSING = re.compile(r"Encountered all NA values|All-NaN (?:slice|axis) encountered")
_NOT_FOUND = re.compile(r"(?:FileNotFoundError|No such file or directory).*?'([^']+)'")
_LIST = 40   # names or columns listed at most
# The answer's form written as a line of code (`@bmi_distribution[normal]` under an if): the
# node of a task planned without a call is asked to print the form, and on dabench-dev q25
# and q300 the bench model wrote it as a statement instead, 4 of 52 code answers of two
# samples, q25 three times in a row (the error is a syntax or indentation error elsewhere).
_FORM_AS_CODE = re.compile(r"^\s*@(\w+)\[[^\]\n]*\]\s*$", re.MULTILINE)


@functools.lru_cache(maxsize=1)
def available_libraries() -> tuple[str, ...]:
    """The data libraries code in the sandbox can import (it runs this Python with its
    site-packages), as the line that imports each."""
    return tuple(how for module, how in DATA_LIBRARIES if importlib.util.find_spec(module))


def error_of(execution: Mapping) -> str:
    """The exception line of a failed run ('NameError: name 'df' is not defined')."""
    return " ".join(str(execution.get("error") or "").split())


def failing_line(execution: Mapping, file_name: str | None = None) -> tuple[int, str] | None:
    """(line number, its text) of the node's own code where it failed, or None.

    The session's record may say it (`error_line`: {"line", "text"}, or a number); else the
    last traceback frame in the node's file (`file_name`, or any frame outside Python's
    own files) gives the number, and the code its text."""
    given = execution.get("error_line", execution.get("failing_line"))
    code_lines = str(execution.get("code") or "").splitlines()
    if isinstance(given, Mapping):
        number, text = given.get("line") or given.get("number"), given.get("text")
        if isinstance(number, int):
            return number, str(text if text is not None else _line(code_lines, number))
    if isinstance(given, int) and not isinstance(given, bool):
        return given, _line(code_lines, given)
    found = None
    for line in str(execution.get("stderr") or "").splitlines():
        m = _FRAME.match(line)
        if not m or m.group(1).startswith("<python>") or "/lib/python" in m.group(1):
            continue
        if file_name is None or m.group(1).endswith(file_name):
            found = int(m.group(2))
    if found is None or not 0 < found <= len(code_lines):
        return (0, given.strip()) if isinstance(given, str) and given.strip() else None
    return found, code_lines[found - 1]


def _line(lines: list[str], number: int) -> str:
    return lines[number - 1] if 0 < number <= len(lines) else ""


def _names(execution: Mapping) -> list[str]:
    """What the session held when the code ran, one 'name (type, shape)' a name."""
    held = execution.get("names") or execution.get("session_names") or []
    if isinstance(held, Mapping):
        return [f"{k} ({v})" if v else str(k) for k, v in held.items()]
    out = []
    for item in held:
        if isinstance(item, Mapping):
            desc = ": ".join(str(item[k]) for k in ("type", "about") if item.get(k))
            out.append(f"{item.get('name')} ({desc})" if desc else str(item.get("name")))
        else:
            out.append(str(item))
    return out


def session_columns(execution: Mapping) -> dict[str, list[str]]:
    """{name: columns} of the DataFrames the session holds (its record's `names`)."""
    held = execution.get("names") or []
    return {str(i["name"]): [str(c) for c in i["columns"]] for i in held
            if isinstance(i, Mapping) and i.get("name") and isinstance(i.get("columns"), list)}


def _bare(name: str) -> str:
    return name.split(" (", 1)[0]


def _listed(items: Iterable[str]) -> str:
    items = list(items)
    more = f" and {len(items) - _LIST} more" if len(items) > _LIST else ""
    return ", ".join(items[:_LIST]) + more


def _closest(word: str, options: Iterable[str]) -> str:
    """' (did you mean 'y'?)' for the option nearest `word`, case aside ('' if none is near)."""
    lowered = {}
    for option in options:
        lowered.setdefault(option.lower(), option)
    close = difflib.get_close_matches(word.lower(), list(lowered), n=1, cutoff=0.6)
    return f" (did you mean {lowered[close[0]]!r}?)" if close else ""


def _columns_hint(word: str, columns: Mapping[str, list[str]]) -> str:
    if not columns:
        return ""
    every = [c for cols in columns.values() for c in cols]
    tables = "; ".join(f"{t}: {_listed(cols)}" for t, cols in columns.items())
    if word in every:
        return ""
    return (f"{word!r} is not a column of the data. The real columns are ({tables})"
            f"{_closest(word, every)}; use those names exactly as written.")


def _key_hint(key: str, columns: Mapping[str, list[str]]) -> str:
    """A KeyError's hint: the real columns, and a number used where a column's name is
    text (or the other way round; q496 took the year 1974 for a column)."""
    word, quoted = key.strip("'\""), key[:1] in "'\""
    every = [c for cols in columns.values() for c in cols]
    if word in every and not quoted:
        return (f"The column is named by the text {word!r}, not the number {word}: write "
                f"df[{word!r}].")
    hint = _columns_hint(word, columns)
    if hint and word.lstrip("-").replace(".", "", 1).isdigit():
        hint += (f" {word} is a value, not a column: to pick rows where a column holds it, "
                 f"write df[df['column'] == {word}].")
    return hint


def _hint(error: str, execution: Mapping, columns: Mapping[str, list[str]],
          files: list[str], where: tuple[int, str] | None = None) -> str:
    """What the fix needs to know about this kind of error ('' when nothing more)."""
    names = _names(execution)
    if m := _NAME_ERROR.search(error):
        missing = m.group(1)
        held = (f"Names that exist in the session: {_listed(names)}{_closest(missing, map(_bare, names))}."
                if names else "No name from earlier code exists in this run.")
        return (f"{held} Define {missing!r} in your code before using it, or use one of "
                "those names.")
    if m := _MODULE.search(error):
        libs = available_libraries()
        return (f"There is no module {m.group(1)!r} here, and nothing can be installed. "
                f"Libraries that exist: {'; '.join(libs) or 'the standard library only'}. "
                "Do it with those.")
    if (m := _KEY_ERROR.search(error)) and columns:
        return _key_hint(m.group(1).strip(), columns)
    if (m := _ATTRIBUTE.search(error)) and columns:
        return _columns_hint(m.group(2), columns) + " Write df['name'] for a column."
    if m := _SCALAR_ATTRIBUTE.search(error):
        kind, attribute = m.groups()
        return (f"The expression before .{attribute} on that line is one {kind} value, not a "
                f"Series, and has no .{attribute}"
                + (": round one number with round(value, 2)." if attribute == "round" else "."))
    if m := _UNPACK.search(error):
        return _unpack_hint(m.group(1), where)
    if m := _KEYWORD.search(error):
        function, keyword = m.groups()
        said = f"{function}() takes no argument {keyword!r}: leave it out of that call."
        if keyword == "ddof":   # the node prompt's line on sample standard deviations
            said += (" Only the standard deviation and variance take ddof (.std(), .var(), "
                     "np.std, np.var); a skewness, correlation or mean does not.")
        return said
    if _ALL_MISSING.search(error):
        return ("The values that line works on are all missing (NaN): a column assigned from a "
                "result whose index does not match the rows is NaN in every row. Print them "
                "(e.g. .head()) to see why, and compute them from the rows themselves.")
    if (m := _NOT_FOUND.search(error)) and files:
        return (f"Files in the working directory: {_listed(files)}"
                f"{_closest(m.group(1), files)}.")
    return ""


# A correlation unpacked into r and a p-value: pandas' .corr gives r alone. On dabench-dev
# q11 (issue 29's seventh sample) the bench model wrote `r, p_value = df[a].corr(df[b])`,
# was told to assign the value to one name, and tried the same line twice more (once with
# ddof=1): it wanted the p-value, which .corr does not compute.
_CORR_CALL = re.compile(r"\.corr(?:with)?\(")


def _unpack_hint(kind: str, where: tuple[int, str] | None) -> str:
    """What to say when a line unpacks several names from a call that returns one value."""
    said = f"The call on that line returns one {kind} value, not several: assign it to one name."
    if where is not None and _CORR_CALL.search(where[1]):
        said += (" pandas' .corr gives the correlation r alone; for r and its p-value write "
                 "`from scipy import stats` and `r, p = stats.pearsonr(x, y)` (spearmanr and "
                 "kendalltau alike), x and y without missing values.")
    return said


def code_feedback(execution: Mapping, *, node_id: str | None = None,
                  columns: Mapping[str, list[str]] | None = None, files: Iterable[str] = (),
                  earlier: Iterable[Mapping] = (), traceback_chars: int = 1200) -> str:
    """The feedback of a failed code run: first line `The code failed: <error>`, then the
    failing line, what the fix needs to know (see `_hint`), whether an earlier attempt
    failed the same way, and the end of the traceback."""
    error = error_of(execution) or "the code failed with no error output"
    parts = [f"{CODE_FAILED}: {error}"]
    where = failing_line(execution, f"{node_id}.py" if node_id else None)
    if where is not None:
        number, text = where
        at = f"at line {number}" if number else "at this line"
        parts.append(f"It failed {at}:\n    {text.strip()}")
    columns = {**session_columns(execution), **(columns or {})}
    hint = _hint(error, execution, columns, list(files), where)
    if hint:
        parts.append(hint)
    if m := _FORM_AS_CODE.search(str(execution.get("code") or "")):
        line = m.group(0).strip()
        parts.append(f"A line of your code is the answer's form written as Python ({line}), "
                     f"which is not a statement: write that line as print({line!r}), and a "
                     f"computed value as print(f\"@{m.group(1)}[{{value}}]\").")
    same = _repeated(error, earlier, node_id)
    if same:
        parts.append(same)
    tail = str(execution.get("stderr") or "").strip()
    if tail and where is None:   # the failing line and the error say it when they are known
        tail = tail[-traceback_chars:]
        parts.append(f"The end of the traceback:\n{tail}")
    parts.append("Send the whole corrected code in one ```python block; do not write what it "
                 "prints (it is run and its real output is kept).")
    return "\n".join(parts)


def _repeated(error: str, earlier: Iterable[Mapping], node_id: str | None) -> str:
    """What to say when earlier attempts failed with this same error: which ones, and the
    lines they failed at (what was tried), so the fix is not the same line again."""
    if not error:
        return ""
    same = [(i, a.get("execution") or {}) for i, a in enumerate(earlier, 1)
            if error_of(a.get("execution") or {}) == error]
    if not same:
        return ""
    which = ", ".join(str(i) for i, _ in same)
    lines = []
    for i, ran in same:
        where = failing_line(ran, f"{node_id}.py" if node_id else None)
        if where is not None and where[1].strip() not in lines:
            lines.append(where[1].strip())
    tried = "".join(f"\n    {line}" for line in lines)
    return (f"This is the same error as attempt{'s' if len(same) > 1 else ''} {which}: the change "
            "since then did not fix it." + (f" Failing line(s) tried so far:{tried}" if tried else "")
            + "\nDo not write that line the same way again: change the failing line itself, or "
            "compute its value another way.")


# A printed line that holds no result: an empty pandas object, its footer, or a value that is
# missing (q308's filter matched no row and printed "Series([], Name: Fare, ...)"; q716's mean
# printed nan; both were taken as results and the summary filled the form with a guess).
_HOLLOW = re.compile(r"^(?:Series\(\[\],.*\)|Empty (?:DataFrame|Series)|Columns: \[.*\]|"
                     r"Index: \[\]|\[\]|\{\}|set\(\)|\(\)|None|"
                     r"(?:Name: .*, )?dtype: \w+|"
                     r"(?:.*[\s:=,(\[{'\"])?(?:nan|NaN|<NA>|NaT)[\s)\]},'\"]*)$")


def hollow_result(execution: Mapping, last: bool = False) -> str:
    """The feedback for code that ran and printed only empty or missing values, or (`last`:
    no later subtask uses the names it defines) printed nothing and made no file; "" when it
    printed a result. Such a printout is a bug to fix, not a result: on dabench-dev q114 the
    one subtask's code found the countries with the highest score, printed nothing, and the
    summary answered "none"."""
    if not execution.get("ran") or not execution.get("ok"):
        return ""
    lines = [line.strip() for line in str(execution.get("stdout") or "").splitlines()
             if line.strip()]
    if not lines and last and not execution.get("files") and not execution.get("saved"):
        return (f"{CODE_FAILED} to produce a result: it ran without error but printed nothing, "
                "and what it prints is this subtask's result (no later subtask reads its "
                "names). Print the values the subtask asks for, each with its name, and send "
                "the whole code in one ```python block.")
    if not lines or not all(_HOLLOW.match(line) for line in lines):
        return ""
    shown = "\n".join(lines[:6])
    return (f"{CODE_FAILED} to produce a result: it ran, but all it printed is empty or "
            f"missing values:\n{shown}\nAn empty Series or DataFrame means a filter or a lookup "
            "matched no row; NaN means the values it used were missing or did not match. Print "
            "the values it works on (e.g. df[col].unique()[:10]) to see why, fix the code, and "
            "send the whole corrected code in one ```python block.")


def code_failure(attempts: Iterable[Any]) -> bool:
    """Whether the last attempt failed because its code raised (or did not finish): the
    failure of code, which a code fix answers."""
    last = None
    for last in attempts or []:
        pass
    if not isinstance(last, Mapping) or last.get("passed"):
        return False
    ran = last.get("execution") or {}
    if ran.get("ran") and not ran.get("ok"):
        return True
    return str(last.get("feedback") or "").startswith((CODE_FAILED, "The code crashed",
                                                       "The code did not finish"))
