"""Numbers in an answer that no executed output holds: the benchmark's own rule.

Used for a flow whose `Flow` has no `trace_numbers()` yet (issue 29 item 3 adds it; the
harness prefers it and says which rule counted). The rule: every number written in the
answer (not part of a word such as `class1` or `month_12`) must appear in what some node's
code printed, rounding allowed (an output's 0.21403 traces 0.21 and 0.214); whole numbers
from 0 to 10 (list marks, "three findings") and years from 1900 to 2100 are not counted.
"""

from __future__ import annotations

import re

__all__ = ["numbers", "untraced"]

_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:,\d{3})*(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w])")


def numbers(text: str | None) -> list[str]:
    """The numbers written in `text`, as written (thousands separators dropped)."""
    return [m.group(0).replace(",", "") for m in _NUMBER.finditer(text or "")]


def _decimals(written: str) -> int | None:
    mantissa = re.split(r"[eE]", written)[0]
    return len(mantissa.split(".")[1]) if "." in mantissa else 0


def _exempt(value: float, written: str) -> bool:
    whole = "." not in written and "e" not in written.lower()
    return whole and (0 <= value <= 10 or 1900 <= value <= 2100)


def untraced(answer: str | None, outputs: list[str]) -> list[str]:
    """The numbers of `answer` that trace to none of `outputs` (see the module's rule)."""
    sources = [float(n) for text in outputs for n in numbers(text)]
    out = []
    for written in numbers(answer):
        value = float(written)
        if _exempt(value, written):
            continue
        places = _decimals(written)
        if "e" in written.lower():
            hit = any(abs(s - value) <= abs(value) * 1e-6 for s in sources)
        else:
            hit = any(abs(round(s, places) - value) < 10 ** -(places + 3) for s in sources)
        if not hit:
            out.append(written)
    return out
