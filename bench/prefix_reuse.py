"""Prompt prefix reuse and end-to-end time on the embedded model (issue 31): whole flows run
as a user runs them (`flowmagic run`), each in a process of its own with a FLOWMAGIC_HOME of
its own (nothing answered from another run's cache) that starts its own embedded server.
What each run cost is read from its store: seconds, model calls, prompt tokens sent, the
prompt tokens the server reused (its own report, `prompt_tokens_details.cached_tokens`), so
evaluated / sent = 1 - reused / sent, and completion tokens.

Three jobs: the csv_eda template end to end (plan, run, figure, export, replay), under an
older source ("before") and this one ("after") taking turns; a few dabench-dev questions (one
per level, seeded) as flows on this source; and as many questions about one table as cells
of one notebook (one kernel, one server: `same_table`). `make bench` runs them
(bench/run.py); alone:
    .venv/bin/python bench/prefix_reuse.py --before-ref 99292a4 --rounds 1
    .venv/bin/python bench/prefix_reuse.py --before /tmp/before --arms before,cache,after
Arms: `before` (the older source, the server's prompt cache off), `cache` (the older source,
the cache on), `after` (this source with its defaults). The older source must have the
embedded server's usage report (from 99292a4 on), or its reuse reads as zero.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

__all__ = ["one", "usage", "ratio", "csv_eda", "csv_eda_seeds", "dabench_sample", "table",
           "main"]

RESULTS = HERE / "RESULTS.md"
BEGIN, END = "<!-- prefix-reuse:begin -->", "<!-- prefix-reuse:end -->"
# the older source's env: "before" is that source as it was before issue 31's server cache
ARMS = {"before": ("before", {"FLOWMAGIC_LOCAL_CACHE_MB": "0"}),
        "cache": ("before", {}),
        "after": (str(ROOT), {})}
_ENDPOINT_VARS = ("OPENAI_API_KEY", "OPENAI_BASE_URL", "FLOWMAGIC_BASE_URL", "FLOWMAGIC_MODEL",
                  "FLOWMAGIC_LOCAL_GGUF", "FLOWMAGIC_LOCAL_GGUF_SHA256")


def usage(home: str | Path) -> dict:
    """Calls and tokens of the model calls a run made (not those its response cache answered),
    from the store in `home`; zeros when the run left no store."""
    db_path = Path(home) / "flowmagic.db"
    if not db_path.is_file():
        return {"calls": 0, "prompt_sent": 0, "prompt_reused": 0, "completion": 0}
    db = sqlite3.connect(db_path)
    try:
        return _sums(db)
    finally:
        db.close()


# The calls that reached the server: not answered by the response cache, not failed.
_REACHED = "FROM calls WHERE cached = 0 AND error IS NULL"


def _sums(db: sqlite3.Connection, run_id: str | None = None) -> dict:
    """Calls and tokens of the calls that reached the server, of one run or of all."""
    where, args = (" AND run_id = ?", (run_id,)) if run_id is not None else ("", ())
    calls, sent, reused, out = db.execute(
        "SELECT COUNT(*), COALESCE(SUM(input_tokens), 0), COALESCE(SUM(cached_tokens), 0),"
        f" COALESCE(SUM(output_tokens), 0) {_REACHED}{where}", args).fetchone()
    return {"calls": calls, "prompt_sent": sent, "prompt_reused": reused, "completion": out}


def ratio(rows: list[dict]) -> float | None:
    """Prompt tokens evaluated / sent over `rows` together (None when nothing was sent)."""
    sent = sum(r["prompt_sent"] for r in rows)
    return round(1 - sum(r["prompt_reused"] for r in rows) / sent, 3) if sent else None


def _run(argv: list[str], env: dict, cwd: str, timeout: float) -> tuple[int | str, str]:
    """Run one flow; on its time limit stop its whole process group (the embedded server it
    started with it) and say "timeout"."""
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return "timeout", out


SETTLED, SETTLE_S = 0.5, 120


def settle(limit: float = SETTLE_S) -> float:
    """Wait, up to `limit` seconds, for the 1-minute load to fall to SETTLED, so that a flow
    does not start under the tail of the run before it (csv_eda "after" started at load 1.0
    right after "before" and took 63.6 s; alone, at 0.2, 54.4 s); the seconds waited."""
    started = time.monotonic()
    while os.getloadavg()[0] > SETTLED and time.monotonic() - started < limit:
        time.sleep(2)
    return round(time.monotonic() - started, 1)


def one(arm: str, job: list[str], timeout: float, before: str | None, label: str) -> dict:
    """`flowmagic run JOB...` under `arm` (see ARMS), with what it cost, on a settled
    machine (`settle`)."""
    waited = settle()
    home = tempfile.mkdtemp(prefix=f"bench-reuse-{arm}-")
    src, extra = ARMS[arm]
    env = {**{k: v for k, v in os.environ.items() if k not in _ENDPOINT_VARS}, **extra,
           "FLOWMAGIC_HOME": home, "FLOWMAGIC_DISCOVER": "0",
           "PYTHONPATH": before if src == "before" else src}
    load = os.getloadavg()[0]
    started = time.perf_counter()
    rc, out = _run([sys.executable, "-m", "flowmagic.cli", "run", *job, "--out",
                    os.path.join(home, "out")], env, home, timeout)
    seconds = time.perf_counter() - started
    row = {"arm": arm, "job": label, "rc": rc, "seconds": round(seconds, 1), **usage(home),
           "load_before": round(load, 1), "load_after": round(os.getloadavg()[0], 1),
           "settled_s": waited, "home": home,
           "tail": out.strip().splitlines()[-3:] if rc else []}
    row["evaluated_over_sent"] = ratio([row])
    return row


def csv_eda_seeds(seeds: list[int], timeout: float, log=print) -> list:
    """The csv_eda template on this source with other seeds of its model calls (its `seed`
    parameter): the same code on other paths through SmolLM2's sampled answers, which decide
    how many calls and tokens a flow takes (46-128 s over seeds 1-4 in one session)."""
    rows = []
    for seed in seeds:
        log(f"csv_eda on the embedded model, after, seed {seed}")
        rows.append({**one("after", ["csv_eda", "-p", f"seed={seed}"], timeout, None,
                           f"csv_eda seed {seed}"), "seed": seed})
        log(f"    {_line(rows[-1])}")
    return rows


def csv_eda(arms: list[str], rounds: int, timeout: float, before: str | None, log=print) -> list:
    """The csv_eda template under each arm, the arms taking turns (the first rotating)."""
    rows = []
    for n in range(rounds):
        for arm in arms[n % len(arms):] + arms[:n % len(arms)]:
            log(f"csv_eda on the embedded model, {arm}")
            rows.append(one(arm, ["csv_eda"], timeout, before, "csv_eda"))
            log(f"    {_line(rows[-1])}")
    return rows


def questions(n: int, seed: int) -> list:
    """`n` dabench-dev questions spread over the levels (dabench.sample's order)."""
    import dabench

    return dabench.sample(dabench.load(), -(-n // len(dabench.LEVELS)), seed)[:n]


def dabench_sample(n: int, seed: int, timeout: float, log=print) -> list:
    """`n` dabench-dev questions as flows on this source (`%%flow`'s defaults, the CSV as the
    input, the task as bench/analysis_worker.py words it)."""
    from analysis_worker import task_of

    rows = []
    for q in questions(n, seed):
        log(f"dabench-dev q{q.id} ({q.level}) as a flow on the embedded model")
        rows.append(one("after", [task_of(q), "--inputs", str(q.table)], timeout, None,
                        f"dabench q{q.id} ({q.level})"))
        log(f"    {_line(rows[-1])}")
    return rows


def table_questions(n: int, seed: int) -> list:
    """`n` dabench-dev questions about one table (seeded: the table among those with at least
    `n` questions, then its questions), in id order."""
    import random

    import dabench

    by_file: dict = {}
    for q in dabench.load():
        by_file.setdefault(q.file_name, []).append(q)
    rng = random.Random(seed)
    name = rng.choice(sorted(f for f, qs in by_file.items() if len(qs) >= n))
    return sorted(rng.sample(by_file[name], n), key=lambda q: q.id)


def per_run(home: str | Path) -> list[dict]:
    """What each run of a store cost, in the order the runs began: its name, seconds from its
    first model call or event to its last, calls and tokens as `usage` counts them, and what
    its first call sent and the server reused of it."""
    db = sqlite3.connect(Path(home) / "flowmagic.db")
    try:
        runs = db.execute("SELECT id, name FROM runs ORDER BY created").fetchall()
        out = []
        for run_id, name in runs:
            began, ended = db.execute(
                "SELECT MIN(t0), MAX(t1) FROM (SELECT ts - COALESCE(latency_s, 0) AS t0, ts AS t1"
                " FROM calls WHERE run_id = ?1 UNION ALL SELECT ts, ts FROM events"
                " WHERE run_id = ?1)", (run_id,)).fetchone()
            seconds = (ended - began) if began is not None else 0.0
            first = db.execute(f"SELECT input_tokens, cached_tokens {_REACHED} AND run_id = ?"
                               " ORDER BY id LIMIT 1", (run_id,)).fetchone() or (0, 0)
            out.append({"name": name, "seconds": round(seconds, 1), **_sums(db, run_id),
                        "first_sent": first[0] or 0, "first_reused": first[1] or 0})
        return out
    finally:
        db.close()


def same_table(n: int, seed: int, timeout: float, log=print) -> list:
    """`n` dabench-dev questions about one table as `%%flow` cells of one notebook, run by
    `flowmagic run NOTEBOOK` (one kernel, one embedded server: a user asking several questions
    about the same data): one row per flow, read from the store by its run, the first flow
    first. The first call of a flow after the first finds on the server what its prompt
    shares with the calls before it: today the house rules alone, since each prompt names its
    own task before the table's description (prompt_start)."""
    import shlex

    import nbformat
    from analysis_worker import task_of

    qs = table_questions(n, seed)
    table_name = qs[0].file_name
    folder = Path(tempfile.mkdtemp(prefix="bench-table-"))
    cells = [nbformat.v4.new_code_cell("%load_ext flowmagic")]
    for q in qs:
        cells += [nbformat.v4.new_code_cell(f"%%flow q{q.id} --run --inputs "
                                            f"{shlex.quote(str(q.table))}\n{task_of(q)}"),
                  nbformat.v4.new_code_cell(f"await q{q.id}.wait()")]
    notebook = folder / "questions.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=cells), str(notebook))
    names = ", ".join(f"q{q.id}" for q in qs)
    log(f"dabench-dev {names} (all on {table_name}) as cells of one notebook")
    whole = one("after", [str(notebook)], timeout * n, None, f"{names} in one kernel")
    levels = {f"q{q.id}": q.level for q in qs}
    rows = []
    for k, r in enumerate(per_run(whole.pop("home"))):
        row = {**whole, **r, "table": table_name, "reached": True,
               "job": f"dabench {r['name']} ({levels.get(r['name'], '?')}), "
                      f"flow {k + 1} of {len(qs)} in one kernel on {table_name}"}
        row["evaluated_over_sent"] = ratio([row])
        rows.append(row)
        log(f"    {_line(row)}")
    for q in qs[len(rows):]:   # a flow the notebook did not reach (its rc says why)
        rows.append({**whole, "job": f"dabench q{q.id} ({q.level}): not reached in one kernel",
                     "name": f"q{q.id}", "table": table_name, "reached": False, "calls": 0,
                     "prompt_sent": 0, "prompt_reused": 0, "completion": 0, "first_sent": 0,
                     "first_reused": 0, "evaluated_over_sent": None})
    return rows


def _line(r: dict) -> str:
    return (f"rc {r['rc']}, {r['seconds']} s, {r['calls']} calls, {r['prompt_sent']} prompt "
            f"tokens sent, {r['prompt_reused']} reused, evaluated / sent "
            f"{r['evaluated_over_sent']}, load {r['load_before']}-{r['load_after']}")


def table(rows: list[dict]) -> str:
    lines = ["| run | arm | rc | s | calls | prompt tokens sent | reused by the server | "
             "evaluated / sent | completion tokens | load before-after | waited to settle (s) |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |"]
    for r in rows:
        lines.append(f"| {r.get('job', 'csv_eda')} | {r['arm']} | {r['rc']} | {r['seconds']} | "
                     f"{r['calls']} | {r['prompt_sent']} | {r['prompt_reused']} | "
                     f"{r['evaluated_over_sent']} | {r['completion']} | "
                     f"{r['load_before']}-{r['load_after']} | {r.get('settled_s', '—')} |")
    return "\n".join(lines)


def _source(args) -> str | None:
    import before as older

    if args.before:
        path, what = older.given(args.before)
    else:
        path, what = older.prepare(args.before_ref, ROOT,
                                   Path(tempfile.mkdtemp(prefix="bench-before-")))
    print(what, file=sys.stderr)
    return str(path) if path else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arms", default="before,after")
    parser.add_argument("--before", help="a folder holding an older flowmagic/")
    parser.add_argument("--before-ref", default="99292a4",
                        help="else the commit whose flowmagic/ is the older source")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--questions", type=int, default=3,
                        help="dabench-dev questions (0: none)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=1800)
    args = parser.parse_args()
    arms = args.arms.split(",")
    source = _source(args) if any(ARMS[a][0] == "before" for a in arms) else None
    if source is None:
        arms = [a for a in arms if ARMS[a][0] != "before"]
    rows = csv_eda(arms, args.rounds, args.timeout, source)
    if args.questions:
        rows += dabench_sample(args.questions, args.seed, args.timeout)
        rows += same_table(args.questions, args.seed, args.timeout)
    for row in rows:
        print(json.dumps(row))
    print(table(rows))


if __name__ == "__main__":
    main()
