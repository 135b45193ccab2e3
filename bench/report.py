"""bench/RESULTS.md: the machine, every measurement beside its target, and the notes."""

from __future__ import annotations

import importlib.metadata as md
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["machine", "write_results", "write_section", "verdict"]


def _version(package: str) -> str:
    try:
        return md.version(package)
    except md.PackageNotFoundError:
        return "not installed"


def _first(path: str, prefix: str) -> str:
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(prefix):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def _git(*args: str) -> str:
    root = Path(__file__).resolve().parent.parent
    try:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def machine() -> dict:
    import flowmagic

    mem = _first("/proc/meminfo", "MemTotal")
    dirty = _git("status", "--porcelain", "--", "flowmagic")
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "cpu": _first("/proc/cpuinfo", "model name"),
        "cores": os.cpu_count(),
        "memory": f"{int(mem.split()[0]) / 2**20:.1f} GiB" if mem[:1].isdigit() else mem,
        "os": platform.platform(),
        "python": sys.version.split()[0],
        "flowmagic": f"{flowmagic.__version__} (commit {_git('rev-parse', '--short', 'HEAD') or '?'}"
                     f"{', flowmagic/ modified' if dirty else ''})",
        "langgraph": _version("langgraph"),
        "networkx": _version("networkx"),
        "openai": _version("openai"),
        "graphviz dot": (subprocess.run(["dot", "-V"], capture_output=True, text=True).stderr.strip()
                         if _have("dot") else "not installed"),
        "load": "%.2f %.2f %.2f" % os.getloadavg(),
    }


def _have(program: str) -> bool:
    from shutil import which
    return which(program) is not None


def verdict(ok: bool | None) -> str:
    return "—" if ok is None else ("met" if ok else "**missed**")


def _f(x: float | None, digits: int = 3) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return out


def _retries(r) -> str:
    """Requests beyond one per node (a retry after a dropped connection), if any."""
    extra = {k: v.extra.get("requests", 0) - len(v.spans) for k, v in r.results.items()}
    extra = {k: v for k, v in extra.items() if v > 0}
    return "; extra requests: " + ", ".join(f"{k} +{v}" for k, v in extra.items()) if extra else ""


def _ms(x) -> str:
    return "—" if x is None else f"{x:.1f}"


def _makespan_rows(cases: list) -> list[list[str]]:
    rows = []
    for r in cases:
        fm = r.results["flowmagic"]
        rows.append([r.case.name, len(fm.spans), r.edges, r.depth, _f(r.server_bound, 2),
                     _f(fm.makespan, 2), _f(r.vs_server("flowmagic")), _f(r.vs_server("floor")),
                     _f(r.ratio("sdk-loop")), _f(r.ratio("langgraph")), _f(r.ratio("level-sync")),
                     _f(fm.makespan / fm.bound),
                     " / ".join(_ms(r.results[k].extra.get("client_ms"))
                                for k in ("flowmagic", "sdk-loop", "floor")),
                     _ms(fm.extra.get("head_ms")), _f(r.barrier_starts, 2),
                     ("yes" if r.same_latency else f"**no** (max diff {r.latency_spread:.3f} s)")
                     + _retries(r)])
    return rows


def _parts(parts: list[dict]) -> list[str]:
    if not parts:
        return []
    return ["", "## Parts of this run", "",
            "Each part's seconds, and the 1-minute load average of the machine (2 cores) when "
            "it began and when it ended.", ""] + _table(
        ["part", "seconds", "load before", "load after"],
        [[p["part"], f"{p['seconds']:.0f}", f"{p['load_before']:.2f}", f"{p['load_after']:.2f}"]
         for p in parts])


def write_results(path: Path, info: dict, summary: list[dict], sections: dict,
                  notes: list[str], settings: dict, elapsed: float,
                  parts: list[dict] | None = None) -> None:
    lines = ["# flowmagic benchmark results", "",
             "Written by `make bench` (`bench/run.py`): everything down to the Notes, and the "
             "blocks the later sections mark as written by `make bench`, is regenerated on every "
             "run; the rest of those sections (measured apart) is kept as it stands.",
             f"Run on {info['date']}, {elapsed:.0f} s in all. Settings: {settings}.", "",
             "## Machine", ""]
    lines += _table(["what", "value"], [[k, v] for k, v in info.items()])
    lines += ["", "The machine is shared (other developers run tests on the same 2 cores), so "
              "absolute times are noisy; the ratios compare runs made minutes apart in the "
              "same process against the same server, and are the numbers to read.", "",
              "## Summary against the targets", ""]
    lines += _table(["measurement", "measured", "target", "result"],
                    [[s["what"], s["measured"], s["target"], verdict(s["ok"])] for s in summary])
    lines += _parts(parts or [])
    lines += ["", "## Makespans: flowmagic, the bare SDK loop, the floor, LangGraph, "
              "level-synchronous", "", sections["makespan_intro"], ""]
    lines += _table(["case", "nodes", "edges", "levels", "server-latency bound s", "flowmagic s",
                     "flowmagic / server bound", "floor / server bound",
                     "bare SDK loop / flowmagic", "LangGraph / flowmagic", "level-sync / flowmagic",
                     "flowmagic / recorded-duration bound",
                     "client ms per call (flowmagic / SDK loop / floor)", "flowmagic head ms",
                     "LangGraph barrier share", "same latency per node"],
                    _makespan_rows(sections["cases"]))
    lines += ["", sections["makespan_legend"], ""]
    for title in ("profile", "overhead", "node_profile", "replay", "drawing", "memory", "faults"):
        block = sections.get(title)
        if block:
            lines += [f"## {block['title']}", ""]
            if block.get("intro"):
                lines += [block["intro"], ""]
            lines += _table(block["header"], block["rows"]) + [""]
    lines += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    # From the Dask section on, the file is kept: its marker blocks are rewritten after this
    # (bench/speed.py), the sections measured apart are kept as they stand.
    old = path.read_text() if path.exists() else ""
    if "<!-- dask-map:begin -->" in old:
        lines += [old[old.index("## Distributed map"):].rstrip(), ""]
    path.write_text("\n".join(lines))


def write_section(path: Path, begin: str, end: str, heading: str, text: str) -> None:
    """Put `text` between the markers `begin` and `end` of `path` (a section measured apart
    from `make bench`, which keeps it); the first time, at the end under `heading`."""
    body = path.read_text()
    block = f"{begin}\n{text}\n{end}"
    if begin in body:
        body = body[:body.index(begin)] + block + body[body.index(end) + len(end):]
    else:
        body = body.rstrip() + f"\n\n## {heading}\n\n" + block + "\n"
    path.write_text(body)
