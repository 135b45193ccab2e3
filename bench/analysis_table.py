"""The Markdown tables of a dabench-dev results file (bench/analysis.py writes it).

Every system is compared on the same questions: those every system in the file answered.
"""

from __future__ import annotations

import statistics

from dabench import LEVELS, equal

__all__ = ["markdown", "summary"]

_ORDER = ("flow", "baseline", "flow-k1")


def _systems(rows: list[dict]) -> list[str]:
    seen = {r["system"] for r in rows}
    return [s for s in _ORDER if s in seen] + sorted(seen - set(_ORDER))


def _common(rows: list[dict], systems: list[str]) -> list[int]:
    ids: dict[int, set] = {}
    for r in rows:
        ids.setdefault(r["id"], set()).add(r["system"])
    return [i for i in dict.fromkeys(r["id"] for r in rows) if ids[i] >= set(systems)]


def _pct(right: int, n: int) -> str:
    return f"{right}/{n} ({100 * right / n:.0f}%)" if n else "-"


def summary(rows: list[dict], system: str) -> dict:
    """The figures of one system over `rows` (already cut to the common questions)."""
    mine = [r for r in rows if r["system"] == system]
    n = len(mine)
    walls = [r["wall_s"] for r in mine]
    out = {"n": n, "right": sum(r["right"] for r in mine),
           "subs_right": sum(r["subs_right"] for r in mine), "subs": sum(r["subs"] for r in mine),
           "median_s": statistics.median(walls) if walls else None,
           "mean_s": statistics.fmean(walls) if walls else None,
           "calls": sum(r["calls"] for r in mine),
           "prompt_tokens": sum(r["prompt_tokens"] for r in mine),
           "completion_tokens": sum(r["completion_tokens"] for r in mine),
           "untraced": sum(len(r["untraced"]) for r in mine),
           "untraced_answers": sum(bool(r["untraced"]) for r in mine),
           "rules": sorted({r.get("untraced_rule") or "-" for r in mine}),
           "timeouts": sum(bool(r["timed_out"]) for r in mine),
           "errors": sum(bool(r["error"]) and not r["timed_out"] for r in mine),
           "right_in_outputs": sum(bool(r.get("right_in_outputs")) for r in mine)}
    for level in LEVELS:
        at = [r for r in mine if r["level"] == level]
        out[level] = (sum(r["right"] for r in at), len(at))
    return out


def _why(loser: dict) -> str:
    if loser["timed_out"]:
        return loser["error"]
    if not loser["got"]:
        return "no @name[value] pair in the answer" + (f" ({loser['error']})" if loser["error"] else "")
    wrong = {k: v for k, v in loser["labels"].items() if not equal(loser["got"].get(k), v)}
    shown = ", ".join(f"{k}: {loser['got'].get(k)!r} for {v!r}" for k, v in list(wrong.items())[:3])
    return f"wrong or missing {shown}"


def _wins(rows: list[dict], systems: list[str]) -> list[str]:
    """The questions the baseline got right and a flow system got wrong, with the flow's failure."""
    if "baseline" not in systems:
        return []
    by = {(r["id"], r["system"]): r for r in rows}
    lines = []
    for qid in dict.fromkeys(r["id"] for r in rows):
        base = by.get((qid, "baseline"))
        if not base or not base["right"]:
            continue
        for system in systems:
            other = by.get((qid, system))
            if system != "baseline" and other and not other["right"]:
                lines.append(f"| {qid} | {base['level']} | {system} | {_why(other)} |")
    return lines


def markdown(rows: list[dict]) -> str:
    """The comparison table, the load, and where the baseline won."""
    if not rows:
        return "(no results yet)"
    systems = _systems(rows)
    common = set(_common(rows, systems))
    cut = [r for r in rows if r["id"] in common]
    head = ("| system | questions | right (ABQ) | sub-questions | " + " | ".join(LEVELS)
            + " | median s | mean s | calls / q | prompt tok / q | completion tok / q "
            "| untraced numbers (answers) | timeouts | errors | right in code outputs |")
    lines = [head, "|" + " --- |" * (head.count("|") - 1)]
    for system in systems:
        s = summary(cut, system)
        n = s["n"] or 1
        levels = " | ".join(_pct(*s[level]) for level in LEVELS)
        lines.append(
            f"| {system} | {s['n']} | {_pct(s['right'], s['n'])} | {_pct(s['subs_right'], s['subs'])} "
            f"| {levels} | {s['median_s']:.0f} | {s['mean_s']:.0f} | {s['calls'] / n:.1f} "
            f"| {s['prompt_tokens'] / n:.0f} | {s['completion_tokens'] / n:.0f} "
            f"| {s['untraced']} ({s['untraced_answers']}) | {s['timeouts']} | {s['errors']} "
            f"| {_pct(s['right_in_outputs'], s['n'])} |")
    loads = [r["load_before"][0] for r in cut]
    ids = sorted(common)
    rules = sorted({r.get("untraced_rule") or "-" for r in cut if r["system"] != "baseline"})
    lines += ["", f"Questions ({len(ids)}, all systems): {', '.join(map(str, ids))}.",
              f"Load (1-minute average before each run): min {min(loads):.1f}, median "
              f"{statistics.median(loads):.1f}, max {max(loads):.1f}.",
              f"Untraced numbers counted by: {', '.join(rules) or '-'}.",
              "flowmagic at: " + ", ".join(sorted({r.get("flowmagic") or "?" for r in cut})) + "."]
    wins = _wins(cut, systems)
    if wins:
        lines += ["", "Where the baseline was right and a flow was not:", "",
                  "| question | level | system | the flow's answer |", "| --- | --- | --- | --- |",
                  *wins]
    return "\n".join(lines)
