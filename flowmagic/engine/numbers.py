"""Numbers trace to code: every number an answer states must be one its code printed.

Small models write findings with invented numbers ("the mean body mass of Adelie is
4865.95 g"; pandas says 3700.66). This module finds the numbers a text states and traces
each to a line of an executed output (what code that ran printed), so an answer can be sent
back naming the numbers that trace nowhere, and what still does not trace is marked.

The rule (README "Numbers trace to code"; tests/test_numbers.py is its table):

- A *number* is a numeric literal standing on its own: an optional sign, digits (thousands
  may be grouped with commas: 1,234,567), an optional decimal part, an optional exponent
  (1.5e-3), an optional "%" or scale word ("thousand", "million", "billion"). Digits glued
  to letters or underscores ("Qwen2.5", "x1", "log10", "sha256", "3D") are part of a name,
  not a number, and so are digits inside a date or a time (2024-01-31, 10:30).
- A stated number *traces* to an output number when they are equal after rounding the
  output to the decimals the statement writes: |output - stated| <= half a unit of the
  statement's last written digit (4865.95 traces to 4865.9512; 3701 to 3700.66; 0.45 to
  0.4512). A percentage also traces to a fraction (45.2% to 0.4521), a scaled number to
  its value (1.2 million to 1203441), and a number traces regardless of sign ("fell by
  0.87" to -0.87). The source is the printed output (stdout) of the node's own code and of
  its ancestors' code, line by line; the first line holding it is where it came from.
- Not checked (they need no code): years (whole numbers 1900-2100), ordinals (1st, 2nd,
  3rd, 4th), list markers (a number opening a line, followed by "." or ")"), single digits
  0-9 written without decimals, numbers inside code (fenced blocks and inline `code`), and
  every number the task or the node's requirement writes (the user gave them).
"""

from __future__ import annotations

import decimal
import math
import re
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Mapping

__all__ = ["Stated", "Traced", "stated_numbers", "output_lines", "printed_lines", "trace",
           "untraced", "untraced_mark", "numbers_feedback", "strip_claims", "trace_text",
           "CLAIM_MARK", "UNTRACED", "result_trace", "result_untraced", "trace_rows",
           "SUMMARY_NUMBERS", "summary_feedback", "without_code", "NOT_RUN", "every_number",
           "WITHHELD", "WITHHELD_MARK", "withhold"]

_SCALES = {"thousand": 1e3, "million": 1e6, "billion": 1e9, "trillion": 1e12}
_NUMBER = re.compile(
    r"(?<![\w.,:/-])(?<!\d[.,])"                       # not glued to a name, a date or a number
    r"(?P<sign>[-+\u2212]?)"
    r"(?P<body>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)"
    r"(?P<exp>[eE][-+]?\d+)?"
    r"(?P<tail>%|(?:st|nd|rd|th)\b|\s?(?:thousand|million|billion|trillion)\b)?"
    r"(?![\w]|[.,]\d|:\d|-\d|/\d)",                    # nor followed by more of one
    re.IGNORECASE)
_DIGIT = re.compile(r"\d")
_MARKER = re.compile(r"^\s*(?:[-*]\s*)?\d{1,2}[.)]\s")
_FENCED = re.compile(r"^[ \t]*(`{3,}|~{3,})[^\n]*\n.*?^[ \t]*\1[`~]*[ \t]*$|`[^`\n]+`",
                     re.MULTILINE | re.DOTALL)


@dataclass(frozen=True)
class Stated:
    """A number as a text writes it: its text, its value, its last written digit's unit."""
    text: str
    value: float
    unit: float          # half of this is the rounding allowed
    percent: bool = False


@dataclass
class Traced:
    """One stated number and where it came from (node None: it traces nowhere)."""
    number: str
    value: float
    node: str | None
    line: str | None

    def to_dict(self) -> dict:
        return asdict(self)


def _parse(m: re.Match) -> Stated | None:
    body, exp, tail = m.group("body"), m.group("exp") or "", (m.group("tail") or "").strip().lower()
    if tail in ("st", "nd", "rd", "th"):
        return None
    digits = body.replace(",", "")
    decimals = len(digits.split(".", 1)[1]) if "." in digits else 0
    try:
        value = float(digits + exp)
    except ValueError:
        return None
    unit = 10.0 ** (-decimals) * (10.0 ** int(exp[1:]) if exp else 1.0)
    scale = _SCALES.get(tail, 1.0)
    sign = -1.0 if m.group("sign") in ("-", "\u2212") else 1.0
    return Stated(m.group(0).strip(), sign * value * scale, unit * scale, tail == "%")


def _plain(text: str) -> str:
    """The text without code: fenced blocks and inline `code` hold no stated numbers."""
    return _FENCED.sub(" ", text or "")


def _all_numbers(text: str) -> list[Stated]:
    out = []
    for m in _NUMBER.finditer(text or ""):
        parsed = _parse(m)
        if parsed is not None:
            out.append(parsed)
    return out


def every_number(text: str) -> list[Stated]:
    """Every numeric literal of `text`, none left out: a value the task's answer form asks
    for must trace even when it is a single digit, a year or a number the task writes."""
    return _all_numbers(_plain(text))


def _given(texts: Iterable[str]) -> set[float]:
    return {abs(s.value) for t in texts for s in _all_numbers(t)}


def _exempt(s: Stated) -> bool:
    """A single digit or a year, written as a whole number: it needs no code."""
    whole = s.unit >= 1 and float(s.value).is_integer() and not s.percent
    return whole and (abs(s.value) < 10 or 1900 <= s.value <= 2100)


def stated_numbers(text: str, given: Iterable[str] = ()) -> list[Stated]:
    """The numbers `text` states that must trace (see the module's rule for what is left
    out); `given` are texts whose numbers need no tracing (the task, the requirement)."""
    if not _DIGIT.search(text or ""):
        return []   # (most answers of a text workflow: no pass over its lines or the task's)
    known = None
    out = []
    for line in _plain(text).splitlines():
        marker = _MARKER.match(line)
        for m in _NUMBER.finditer(line):
            if marker and m.start() < marker.end():
                continue   # "1. " opening a line is a list marker
            s = _parse(m)
            if s is None:
                continue
            if _exempt(s):
                continue   # a single digit, a year
            if known is None:
                known = _given(given)
            if abs(s.value) in known:
                continue
            out.append(s)
    return out


def output_lines(workflow, node_id: str) -> list[tuple[str, str]]:
    """(node, printed line) of every executed output the node may quote: its own code's
    and its ancestors' (done nodes'), the node's own first."""
    nodes = workflow.nodes
    order = [node_id] + [a for a in workflow.ancestors(node_id)]
    out = []
    for nid in order:
        node = nodes.get(nid)
        if node is None:
            continue
        for line in printed_lines(node.execution):
            out.append((nid, line))
    return out


def printed_lines(execution: Mapping | None) -> list[str]:
    """The lines holding a digit that a code run (and the working start before it) printed."""
    if not execution:
        return []
    runs = [execution]
    start = execution.get("working_start")
    if isinstance(start, Mapping):
        runs.append(start)
    return [line for run in runs if run.get("ran") and run.get("stdout")
            for line in str(run["stdout"]).splitlines() if any(c.isdigit() for c in line)]


def _matches(stated: Stated, value: float) -> bool:
    if not math.isfinite(value):
        return False
    half = stated.unit / 2 * (1 + 1e-9)
    target = abs(stated.value)
    if abs(abs(value) - target) <= half:
        return True
    return stated.percent and abs(abs(value) * 100 - target) <= half


def trace(stated: list[Stated], lines: list[tuple[str, str]]) -> list[Traced]:
    """Each stated number with the first (node, line) whose printed numbers hold it."""
    parsed = [(nid, line, [s.value for s in _all_numbers(line)]) for nid, line in lines]
    out = []
    for s in stated:
        hit = next(((nid, line) for nid, line, values in parsed
                    if any(_matches(s, v) for v in values)), (None, None))
        out.append(Traced(s.text, s.value, hit[0], hit[1]))
    return out


def trace_text(text: str, workflow, node_id: str | None, given: Iterable[str] = ()) -> list[Traced]:
    """`trace` of what `text` states against the outputs `node_id` may quote (None: every
    node's, as the final result may)."""
    if node_id is None:
        lines = [(nid, line) for nid, node in workflow.nodes.items()
                 for line in printed_lines(node.execution)]
    else:
        lines = output_lines(workflow, node_id)
    return trace(stated_numbers(text, given), lines)


def result_trace(workflow, text: str) -> list[Traced]:
    """Each number the final result states, traced to every done node's printed output
    (the task's and the requirements' numbers need none)."""
    given = [workflow.task or ""] + [n.requirement for n in workflow.nodes.values()]
    text = _MARK.sub("", text or "")   # the mark of a check made already states nothing
    return trace_text(strip_claims(text), workflow, None, given)


def result_untraced(workflow, text: str, has_inputs: bool = False) -> list[str]:
    """The result's numbers that trace nowhere; [] when no code ran and the run has no
    inputs (a text-only flow has nothing to trace to)."""
    if not has_inputs and not any((n.execution or {}).get("ran") for n in workflow.nodes.values()):
        return []
    return untraced(result_trace(workflow, text))


def trace_rows(traced: list[Traced]) -> Any:
    """`flow.trace_numbers()`'s table: a DataFrame (number, value, node, line) when pandas
    is installed, else the rows as dicts."""
    rows = [t.to_dict() for t in traced]
    try:
        import pandas as pd
    except ImportError:
        return rows
    # object columns keep None as None (a plain frame would turn "traces nowhere" into NaN)
    return pd.DataFrame({"number": pd.Series([r["number"] for r in rows], dtype=object),
                         "value": pd.Series([r["value"] for r in rows], dtype=float),
                         "node": pd.Series([r["node"] for r in rows], dtype=object),
                         "line": pd.Series([r["line"] for r in rows], dtype=object)})


def untraced(traced: list[Traced]) -> list[str]:
    """The texts of the numbers that trace nowhere, each once, in order."""
    return list(dict.fromkeys(t.number for t in traced if t.node is None))


UNTRACED = "numbers that trace to no executed output"
_MARK = re.compile(r"\[" + UNTRACED + r": [^\]\n]*\]")


WITHHELD = "[?]"
WITHHELD_MARK = ("[?] (? in the answer's form) stands for a number the summary wrote that no "
                 "executed output holds: it was sent back once and still traced nowhere, so it "
                 "is left out of the result.")
_SLOT = re.compile(r"@\w+\[[^\]\n]*\]")


def withhold(text: str, numbers: Iterable[str]) -> str:
    """`text` with each number it states whose text is one of `numbers` (`untraced`'s)
    replaced by WITHHELD ("?" inside an `@name[...]` slot): the final result never states a
    number nothing computed. Code is left as it is; outside an `@name[...]` slot a single
    digit or a year is too (the rule never asks them to trace there, so they are not the
    ones found)."""
    drop = set(numbers)
    if not drop or not text:
        return text
    code = [m.span() for m in _FENCED.finditer(text)]
    slots = [m.span() for m in _SLOT.finditer(text)]

    def fix(m: re.Match) -> str:
        s = _parse(m)
        if s is None or s.text not in drop or any(a <= m.start() < b for a, b in code):
            return m.group(0)
        if any(a <= m.start() < b for a, b in slots):
            return "?"   # (brackets in @name[...] would break the pair)
        return m.group(0) if _exempt(s) else WITHHELD

    return _NUMBER.sub(fix, text)


def untraced_mark(numbers: list[str]) -> str:
    """The mark left where an answer is read (its output, the result, the export)."""
    return f"[{UNTRACED}: {', '.join(numbers)}]"


SUMMARY_NUMBERS = ("State the numbers the task asks for, copied from the printed outputs "
                   "above exactly as they are printed (rounding is fine); never compute, "
                   "estimate or invent a number, and leave out any number no output holds.")


_DECIMAL = re.compile(r"-?\d+\.\d+")


def cut_short(number: str, lines: Iterable[str]) -> tuple[str, str] | None:
    """(the printed number, it rounded) when `number` is a printed number's digits cut after
    its decimals instead of rounded (0.9165 of 0.9165830498668011: rounded, 0.9166), so it
    traces nowhere; None when it is not. On dabench-dev q684 the bench model wrote the
    Shapiro-Wilk p-value cut short twice, told only that 0.9165 was printed nowhere."""
    number = number.strip()
    if not _DECIMAL.fullmatch(number):
        return None
    places = len(number.split(".", 1)[1])
    for line in lines:
        for printed in _DECIMAL.findall(line):
            if len(printed.split(".", 1)[1]) <= places or not printed.startswith(number):
                continue
            rounded = _half_up(printed, places)
            if rounded != number:
                return printed, rounded
    return None


def to_places(number: str, places: int, lines: Iterable[str]) -> str | None:
    """`number` written again to `places` decimals from the printed number it rounds, when it
    has fewer (dabench-dev q685: the summary wrote a p-value 0.10 where the code printed
    0.10233... and the form asks four places, 0.1023); None when it has enough, or no printed
    number or several different ones round to it."""
    number = number.strip()
    if not _DECIMAL.fullmatch(number) or len(number.split(".", 1)[1]) >= places:
        return None
    own = len(number.split(".", 1)[1])
    found = set()
    for line in lines:
        for printed in _DECIMAL.findall(line):
            if len(printed.split(".", 1)[1]) < places:
                continue
            if _half_up(printed, own) == number:
                found.add(_half_up(printed, places))
    return found.pop() if len(found) == 1 else None


def _half_up(printed: str, places: int) -> str:
    """A printed decimal rounded half up to `places`, as written ("0.91658", 4 -> "0.9166")."""
    return str(decimal.Decimal(printed).quantize(decimal.Decimal(1).scaleb(-places),
                                                 rounding=decimal.ROUND_HALF_UP))


def summary_feedback(numbers: list[str], lines: Iterable[str] = ()) -> str:
    """Why a final summary goes back once for its numbers; a number that is a printed one cut
    short (`cut_short`) is said to be, with it rounded."""
    lines = list(lines)
    said = (f"These numbers in your summary appear in no printed output above: "
            f"{', '.join(numbers)}. Write the summary again; copy every number from the "
            "printed outputs (rounding is fine) or leave it out.")
    for number in numbers:
        cut = cut_short(number, lines)
        if cut:
            said += (f" {number} is {cut[0]} cut short, not rounded: rounded to "
                     f"{len(number.split('.', 1)[1])} decimals it is {cut[1]}.")
    return said


def numbers_feedback(numbers: list[str], code_ran: bool = True) -> str:
    """Why an answer goes back once for its numbers, and what to write instead (with no
    code of its own run, the answer must compute them with code)."""
    head = (f"These numbers in your answer appear in no output of code that ran: "
            f"{', '.join(numbers)}. Every number you state must be copied from a printed "
            "output (")
    if code_ran:
        return head + ("your code's is shown below, earlier subtasks' are in their results; "
                       "rounding is fine), never computed in your head or guessed. Write your "
                       "answer again without code (your code ran and its output is kept): "
                       "state only numbers those outputs hold, or leave the number out.")
    return head + ("earlier subtasks' are in their results; rounding is fine), never computed "
                   "in your head or guessed. Write Python code in a ```python block that "
                   "computes and prints each number you need; its printed output is what "
                   "counts.")


# -------------------------------------------------------------------- the model's own claims
CLAIM_MARK = "[the model's guess at what its code prints was left out: only output that ran counts]"
_CLAIM_WORDS = (
    r"^\s*(?:[#>*_]+\s*)*(?:the\s+)?(?:(?:expected|example|sample|predicted|possible|"
    r"approximate|likely)\s+)?(?:output|result|results|console output|prints?|this prints|"
    r"this will print|it prints|which prints|would print|running (?:this|it) (?:gives|prints))"
    r"(?:\s+(?:would be|will be|is|looks like|should be))?")
# a heading line ("Output:", "The output will be:"): what follows it is the claim
_CLAIM_HEAD = re.compile(_CLAIM_WORDS + r"\s*[:\-]?\s*(?:[*_]+)?\s*:?\s*$", re.IGNORECASE)
# the claim on the heading's own line ("The output will be: 417")
_CLAIM_LINE = re.compile(_CLAIM_WORDS + r"\s*(?:[*_]+)?\s*:\s*(?:[*_]+)?\s*[^\s*_]",
                         re.IGNORECASE)
# a Python fence with no file name: the code that runs (a named one is a deliverable, kept whole)
_PY_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})[ \t]*(python|py|python3)[ \t]*$",
                       re.IGNORECASE | re.MULTILINE)
_BARE_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})[ \t]*$", re.MULTILINE)
_COMMENT_NUMBER = re.compile(r"(?:^|\s+)#[^\n'\"]*\d[^\n'\"]*$")


def _fence_end(lines: list[str], i: int, fence: str) -> int:
    j = i + 1
    while j < len(lines):
        stripped = lines[j].strip()
        if stripped and set(stripped) == {fence[0]} and len(stripped) >= len(fence):
            return j + 1
        j += 1
    return j


NOT_RUN = "[code sent again was not run: the earlier run of this answer's code stands]"
_ANY_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})[ \t]*([^\s`]*)(.*)$")
_OUTPUT_LANGS = ("output", "stdout", "console", "text", "plaintext", "txt")


def _fence_kind(m: re.Match) -> str:
    """'code' (a Python block that runs), 'bare' (no label), 'output' (a printout written
    by hand) or 'other' (another language, or a named file: a deliverable)."""
    lang, rest = m.group(2).lower(), m.group(3).strip()
    if rest:
        return "other"
    if lang in ("python", "py", "python3"):
        return "code"
    return "bare" if not lang else "output" if lang in _OUTPUT_LANGS else "other"


def _has_code(text: Any) -> bool:
    return isinstance(text, str) and bool(_PY_FENCE.search(text) or _BARE_FENCE.search(text))


def without_code(text: str) -> str:
    """The text with its runnable blocks (Python, unlabelled) replaced by NOT_RUN: an answer
    sent back for its numbers keeps its first code run, since running new code on the
    session's state a second time would make it differ from the exported notebook's."""
    if not _has_code(text):
        return text
    lines, out, i = text.splitlines(), [], 0
    while i < len(lines):
        m = _ANY_FENCE.match(lines[i])
        if m:
            end = _fence_end(lines, i, m.group(1))
            out.extend([NOT_RUN] if _fence_kind(m) in ("code", "bare") else lines[i:end])
            i = end
            continue
        out.append(lines[i])
        i += 1
    return "\n".join(out)


def _claim_end(lines: list[str], i: int) -> int | None:
    """Where what an "Output:" heading at line i introduces ends: the printout fence or the
    plain lines after it; None when a code block follows (code, not a claim)."""
    j = i + 1
    while j < len(lines) and not lines[j].strip():
        j += 1
    m = _ANY_FENCE.match(lines[j]) if j < len(lines) else None
    if m:
        return _fence_end(lines, j, m.group(1)) if _fence_kind(m) in ("bare", "output") else None
    while j < len(lines) and lines[j].strip():
        j += 1
    return j


def strip_claims(text: str) -> str:
    """The text with what the model wrote as the output of its own code left out (an
    "Output:" heading and the block or lines after it, or what follows it on its line, a
    fence labelled output/console,
    number-bearing comments in Python blocks that run), each replaced by CLAIM_MARK. Only
    for an answer that holds code: without code there is no output to predict."""
    if not _has_code(text):
        return text
    lines, out, i = text.splitlines(), [], 0
    while i < len(lines):
        line = lines[i]
        end = _claim_end(lines, i) if line.strip() and _CLAIM_HEAD.match(line) else None
        if end is None and _CLAIM_LINE.match(line):
            end = i + 1
        if end is not None:
            out.append(CLAIM_MARK)
            i = end
            continue
        m = _ANY_FENCE.match(line)
        if m:
            end, kind = _fence_end(lines, i, m.group(1)), _fence_kind(m)
            if kind == "output":   # ```output / ```console: a printout written by hand
                out.append(CLAIM_MARK)
            elif kind == "code":
                out.append(line)
                out.extend(_COMMENT_NUMBER.sub("", body) for body in lines[i + 1:end])
            else:
                out.extend(lines[i:end])
            i = end
            continue
        out.append(line)
        i += 1
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")
