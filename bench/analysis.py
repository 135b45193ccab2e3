"""Right answers on dabench-dev: flowmagic against the one-call baseline (issue 29).

`make bench-analysis`, or `.venv/bin/python bench/analysis.py [--limit N --seed S]
[--systems flow,baseline,flow-k1] [--resume] [--out FILE]`; never part of `make test`.

Runs dabench-dev questions (read in place from ../shared/datasets/dabench-dev) under each
system on one endpoint: the bench model (bench/benchmodel.py: downloaded and checked on
demand, served by llama-cpp-python on 127.0.0.1, one thread per core), or `--base-url URL
--model M`. The systems take turns question by question (the first one rotating), so the
machine's load falls on them alike; the load is recorded with every result. Each question
under each system runs in a process of its own with a FLOWMAGIC_HOME of its own and a time
limit (`--timeout`). Each result is appended to the JSONL file as it finishes, and
`--resume` skips what the file already holds, so a long sample runs in parts. The answers
are scored by dabench-dev's rule (bench/dabench.py); the table (bench/analysis_table.py)
is printed at the end, or from a results file with `--report FILE`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import analysis_table  # noqa: E402
import dabench  # noqa: E402
from analysis_worker import SYSTEMS  # noqa: E402

__all__ = ["main", "select", "run_one", "wait_while"]

WORKER = HERE / "analysis_worker.py"
DEFAULT_OUT = HERE / "analysis-results.jsonl"
_ENDPOINT_VARS = ("OPENAI_API_KEY", "OPENAI_BASE_URL", "FLOWMAGIC_BASE_URL", "FLOWMAGIC_MODEL",
                  "FLOWMAGIC_LOCAL_GGUF", "FLOWMAGIC_LOCAL_GGUF_SHA256")


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def select(questions: list, limit: int | None, seed: int) -> list:
    """A seeded sample of `limit` questions spread evenly over the levels (24: 8 per level),
    interleaved by level; all questions when `limit` is None."""
    if limit is None:
        return dabench.sample(questions, None, seed)
    return dabench.sample(questions, math.ceil(limit / len(dabench.LEVELS)), seed)[:limit]


def read_rows(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _append(path: Path, row: dict) -> None:
    """One row, in one write to a file opened for appending: shards running side by side
    into the same file never interleave their rows."""
    data = (json.dumps(row, default=str) + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _usage(home: Path) -> dict:
    """Model calls and tokens the system spent, from its own folder."""
    calls = prompt = completion = 0
    log_file = home / "calls.jsonl"
    if log_file.is_file():   # the baseline's
        for line in log_file.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            calls += 1
            prompt += row["prompt_tokens"]
            completion += row["completion_tokens"]
    db = home / "flowmagic.db"
    if db.is_file():         # a flow's store: calls answered by the endpoint
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
            c, p, o = con.execute("SELECT COUNT(*), COALESCE(SUM(input_tokens), 0), "
                                  "COALESCE(SUM(output_tokens), 0) FROM calls "
                                  "WHERE cached = 0 AND error IS NULL").fetchone()
        calls, prompt, completion = calls + c, prompt + p, completion + o
    return {"calls": calls, "prompt_tokens": prompt, "completion_tokens": completion}


def commit() -> str:
    """The commit of flowmagic the systems run (with "+changes" when the tree differs)."""
    def git(*argv):
        done = subprocess.run(["git", "-C", str(HERE.parent), *argv], capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""
    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + ("+changes" if git("status", "--porcelain", "--", "flowmagic") else "")


def _worker_env(home: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in _ENDPOINT_VARS}
    env.update(FLOWMAGIC_HOME=str(home), FLOWMAGIC_DISCOVER="0", PYTHONUNBUFFERED="1")
    return env


def _spawn(argv: list[str], env: dict, timeout: float) -> tuple[str, str, bool]:
    """(stdout, stderr, timed_out) of the worker; at the limit its whole process group is
    killed (the sandbox's processes die with it). A worker killed from outside stops the
    run: that is someone stopping the benchmark, not an answer, and is not recorded."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            stdin=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return out, err, True
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    if proc.returncode in (-signal.SIGKILL, -signal.SIGTERM, -signal.SIGINT):
        raise SystemExit(f"the worker was stopped by signal {-proc.returncode}; not recorded")
    return out, err, False


def run_one(q: dabench.Question, system: str, *, data: Path, base_url: str, model: str,
            homes: Path, timeout: float, sandbox: str, version: str = "") -> dict:
    """One question under one system: the scored row that goes into the results file."""
    home = homes / f"{q.id}-{system}"
    shutil.rmtree(home, ignore_errors=True)   # a fresh store: no answer from a cut-off try
    home.mkdir(parents=True)
    argv = [sys.executable, str(WORKER), system, str(q.id), "--data", str(data),
            "--base-url", base_url, "--model", model, "--sandbox", sandbox,
            "--call-timeout", str(timeout)]
    load_before = os.getloadavg()
    started = time.time()
    t0 = time.monotonic()
    out, err, timed_out = _spawn(argv, _worker_env(home), timeout)
    wall = time.monotonic() - t0
    (home / "worker.stderr").write_text(err or "", encoding="utf-8")
    result: dict = {}
    lines = [line for line in (out or "").splitlines() if line.startswith("{")]
    if lines:
        result = json.loads(lines[-1])
    error = result.get("error")
    if timed_out:
        error = f"stopped at the time limit of {timeout:g} s"
    elif not lines:
        tail = (err or "").strip().splitlines()
        error = "the worker failed: " + (tail[-1] if tail else "no output")
    scored = dabench.score(result.get("answer"), q.labels)
    in_outputs = dabench.score("\n".join(result.get("outputs") or []), q.labels)
    return {"id": q.id, "level": q.level, "system": system, "right": scored["right"],
            "subs_right": sum(scored["subs"].values()), "subs": len(scored["subs"]),
            "got": scored["got"], "labels": q.labels, "right_in_outputs": in_outputs["right"],
            "answer": (result.get("answer") or "")[:6000], "error": error,
            "timed_out": timed_out, "status": result.get("status"), "k": result.get("k"),
            "attempts": result.get("attempts"), "nodes": result.get("nodes"),
            "untraced": result.get("untraced") or [], "untraced_rule": result.get("untraced_rule"),
            "wall_s": round(wall, 1), **_usage(home),
            "load_before": [round(x, 2) for x in load_before],
            "load_after": [round(x, 2) for x in os.getloadavg()],
            "started": datetime.datetime.fromtimestamp(started).isoformat(timespec="seconds"),
            "flowmagic": version,
            "home": str(home)}


def _args(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, help="questions, spread evenly over the levels "
                    "(24: 8 per level); all 133 when left out")
    ap.add_argument("--seed", type=int, default=0, help="the sample's seed (default 0)")
    ap.add_argument("--systems", default="flow,baseline,flow-k1",
                    help=f"comma-separated, of {', '.join(SYSTEMS)}")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the JSONL results file")
    ap.add_argument("--resume", action="store_true", help="keep the results file's rows and "
                    "run only what it lacks")
    ap.add_argument("--timeout", type=float, default=1200.0,
                    help="seconds for one question under one system (default 1200)")
    ap.add_argument("--base-url", help="an OpenAI-compatible endpoint instead of the bench model")
    ap.add_argument("--model", help="the model name at --base-url")
    ap.add_argument("--n-ctx", type=int, default=16384, help="the bench model's context")
    ap.add_argument("--threads", type=int, help="the bench model's threads (default: one per "
                    "core on a machine with a 1-minute load below its core count, else one)")
    ap.add_argument("--sandbox", default="bwrap", choices=("bwrap", "none"))
    ap.add_argument("--data", type=Path, help="the dabench-dev folder (default: found)")
    ap.add_argument("--work", type=Path, help="where each run's FLOWMAGIC_HOME is kept "
                    "(default bench/.cache/analysis-homes/<results file's stem>)")
    ap.add_argument("--shard", metavar="K/N", help="only the sample's questions K, K+N, "
                    "K+2N ... (0 <= K < N): N harnesses, each with a server of its own, share a "
                    "sample and its --out file")
    ap.add_argument("--pause-file", type=Path, metavar="FILE",
                    help="before each question, wait while FILE exists (a shared machine's "
                         "quiet window for other measurements; no question is cut by it)")
    ap.add_argument("--report", type=Path, metavar="FILE",
                    help="print the table of a results file and run nothing")
    args = ap.parse_args(argv)
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in args.systems if s not in SYSTEMS]
    if unknown or not args.systems:
        ap.error(f"unknown systems {unknown}; choose from {', '.join(SYSTEMS)}")
    if bool(args.base_url) != bool(args.model):
        ap.error("--base-url and --model go together")
    if args.shard is not None:
        k, _, n = args.shard.partition("/")
        if not (k.isdigit() and n.isdigit() and 0 <= int(k) < int(n)):
            ap.error(f"--shard is K/N with 0 <= K < N, e.g. 0/2, not {args.shard!r}")
        args.shard = (int(k), int(n))
    return args


def _threads() -> int:
    """One per core on a quiet machine, else one: at a load of ~13 on 2 cores two threads
    generated 0.45 tokens/s and one 3.6 (llama.cpp's threads wait on each other)."""
    cores = os.cpu_count() or 1
    return cores if os.getloadavg()[0] < cores else 1


def _endpoint(args, cache_log: Path):
    """(base_url, model, server or None)."""
    if args.base_url:
        return args.base_url, args.model, None
    import benchmodel

    gguf = benchmodel.ensure_gguf(log=log)
    threads = args.threads or _threads()
    server = benchmodel.serve(gguf, n_ctx=args.n_ctx, threads=threads, log_path=cache_log)
    log(f"bench model served at {server.base_url}: n_ctx {args.n_ctx}, {threads} thread(s)")
    return server.base_url, benchmodel.MODEL_NAME, server


def wait_while(pause: Path | None, every: float = 10.0) -> float:
    """Wait while `pause` exists (looked at every `every` s), saying so; the seconds waited."""
    if pause is None or not pause.exists():
        return 0.0
    log(f"paused while {pause} exists")
    t0 = time.monotonic()
    while pause.exists():
        time.sleep(every)
    log("going on")
    return time.monotonic() - t0


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    if args.report:
        print(analysis_table.markdown(read_rows(args.report)))
        return 0
    data = args.data or dabench.locate()
    questions = select(dabench.load(data), args.limit, args.seed)
    if args.shard is not None:
        questions = questions[args.shard[0]::args.shard[1]]
    rows = read_rows(args.out)
    if rows and not args.resume:
        raise SystemExit(f"{args.out} already holds {len(rows)} results: pass --resume to go "
                         "on from them, or --out another file")
    done = {(r["id"], r["system"]) for r in rows}
    homes = args.work or HERE / ".cache" / "analysis-homes" / args.out.stem
    homes.mkdir(parents=True, exist_ok=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    base_url, model, server = _endpoint(args, homes / "server.log")
    log(f"{len(questions)} questions (seed {args.seed}), systems {', '.join(args.systems)}, "
        f"{len(done)} results already in {args.out}")
    try:
        for i, q in enumerate(questions):
            turn = args.systems[i % len(args.systems):] + args.systems[:i % len(args.systems)]
            for system in turn:
                if (q.id, system) in done:
                    continue
                wait_while(args.pause_file)
                row = run_one(q, system, data=data, base_url=base_url, model=model,
                              homes=homes, timeout=args.timeout, sandbox=args.sandbox,
                              version=commit())
                _append(args.out, row)
                log(f"q{q.id} ({q.level}) {system}: {'right' if row['right'] else 'wrong'} "
                    f"{row['subs_right']}/{row['subs']}, {row['wall_s']} s, {row['calls']} calls, "
                    f"load {row['load_before'][0]}" + (f"; {row['error']}" if row['error'] else ""))
                if row["timed_out"] and server is not None:
                    server.restart()   # it may still be answering the killed worker
    finally:
        if server is not None:
            server.stop()
    print(analysis_table.markdown(read_rows(args.out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
