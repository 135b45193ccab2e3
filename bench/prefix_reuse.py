"""The csv_eda template end to end on the embedded model (plan, run, figure, export:
`flowmagic run csv_eda`), under several server settings taking turns, in one run: seconds,
model calls, prompt tokens sent and the prompt tokens the server reused (its own report,
`prompt_tokens_details.cached_tokens`), so evaluated / sent = 1 - reused / sent.

Not part of `make bench` (minutes per run on 2 cores):
    git archive <older commit> flowmagic | tar -x -C /tmp/before
    .venv/bin/python bench/prefix_reuse.py --before /tmp/before --rounds 1
Arms: `before` (the older source, the server's prompt cache off), `cache` (the older source,
the cache on), `after` (this source, cache on): each saving on its own. The older source must
have the embedded server's usage report (it counts the reused prefix). Each run has a
FLOWMAGIC_HOME of its own (nothing answered from another run's cache), runs in it (so the
source on PYTHONPATH is the one imported, by the kernel too) and starts its own embedded
server. Prints one JSON line per run and a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "RESULTS.md"
BEGIN, END = "<!-- prefix-reuse:begin -->", "<!-- prefix-reuse:end -->"
ARMS = {"before": ("before", {"FLOWMAGIC_LOCAL_CACHE_MB": "0"}),   # the server's KV prefix only
        "cache": ("before", {}),                                    # with its prompt cache
        "after": (str(ROOT), {})}                                   # and this prompt layout


def one(arm: str, template: str, timeout: float, before: str) -> dict:
    home = tempfile.mkdtemp(prefix=f"bench-reuse-{arm}-")
    src, extra = ARMS[arm]
    env = {**os.environ, **extra, "FLOWMAGIC_HOME": home,
           "PYTHONPATH": before if src == "before" else src}
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "FLOWMAGIC_BASE_URL", "FLOWMAGIC_MODEL"):
        env.pop(name, None)
    load = os.getloadavg()[0]
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "flowmagic.cli", "run", template, "--out",
                           os.path.join(home, "out")], env=env, cwd=home, timeout=timeout,
                          capture_output=True, text=True)
    seconds = time.perf_counter() - started
    db = sqlite3.connect(os.path.join(home, "flowmagic.db"))
    calls, sent, reused, out = db.execute(
        "SELECT COUNT(*), COALESCE(SUM(input_tokens), 0), COALESCE(SUM(cached_tokens), 0),"
        " COALESCE(SUM(output_tokens), 0) FROM calls WHERE cached = 0 AND error IS NULL").fetchone()
    source = subprocess.run([sys.executable, "-c", "import flowmagic; print(flowmagic.__file__)"],
                            env=env, cwd=home, capture_output=True, text=True).stdout.strip()
    return {"arm": arm, "source": source, "template": template, "rc": done.returncode, "seconds": round(seconds, 1),
            "calls": calls, "prompt_sent": sent, "prompt_reused": reused,
            "completion": out, "evaluated_over_sent": round(1 - reused / sent, 3) if sent else None,
            "load_before": round(load, 1), "load_after": round(os.getloadavg()[0], 1),
            "tail": done.stdout.strip().splitlines()[-3:] if done.returncode else []}


def table(rows: list[dict]) -> str:
    lines = ["| arm | rc | s | calls | prompt tokens sent | reused by the server | "
             "evaluated / sent | completion tokens | load before-after |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        lines.append(f"| {r['arm']} | {r['rc']} | {r['seconds']} | {r['calls']} | "
                     f"{r['prompt_sent']} | {r['prompt_reused']} | {r['evaluated_over_sent']} | "
                     f"{r['completion']} | {r['load_before']}-{r['load_after']} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arms", default="before,cache,after")
    parser.add_argument("--before", help="a folder holding an older flowmagic/")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--template", default="csv_eda")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--write", nargs="*", metavar="JSONL",
                        help="only write RESULTS.md's section from these runs' JSON lines")
    args = parser.parse_args()
    if args.write is not None:
        rows = [json.loads(line) for f in args.write for line in Path(f).read_text().splitlines()
                if line.startswith("{")]
        text = table(rows)
        from report import write_section
        write_section(RESULTS, BEGIN, END, "Prompt prefix reuse on the embedded model (issue 31)",
                      text)
        print(text)
        return
    arms, rows = args.arms.split(","), []
    for n in range(args.rounds):   # the arms take turns, the first rotating
        for arm in arms[n % len(arms):] + arms[:n % len(arms)]:
            rows.append(one(arm, args.template, args.timeout, args.before))
            print(json.dumps(rows[-1]), flush=True)
    print(table(rows))


if __name__ == "__main__":
    main()
