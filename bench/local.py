"""A busy but healthy local server (issue 34): today's client against the local path.

Eight calls at once, as a flow's eight parallel nodes make them, on a server that runs one
at a time: the embedded llama-cpp-python server (SmolLM2, one slot) and the
loopback with local latencies (one slot, a first token after 0.3 s, then 30 tokens a
second). Each is asked twice in one run, the two alternating: as a hosted endpoint (what
every endpoint got before issue 34: all eight sent at once, a whole-answer timeout, retries
after it) and as a local one (queued on our side to the server's slot, streamed, timed on
progress). Both get the same bound: three times one call's own duration, measured first
(the issue's user had 120 s for calls of ~40-60 s, eight of them at once).

Measured per run: calls that took more than one attempt, calls that failed, the makespan,
and the server's seconds spent on requests whose answer nobody read. The loopback counts
those itself (`stats()["abandoned_s"]`); on llama-cpp-python they are the generations in
its log beyond the answers delivered, at the mean time of a generation (a non-streamed
request runs to its end even when its client has left).

    .venv/bin/python bench/local.py            # writes its section of bench/RESULTS.md
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
BEGIN, END = "<!-- local-server:begin -->", "<!-- local-server:end -->"
CALLS, TOKENS = 8, 64
WORDS = " ".join(f"w{i}" for i in range(TOKENS))


def _prompts(tag: str) -> list[str]:
    return [f"({tag} {i}) Write {TOKENS} words about tea, one per line." for i in range(CALLS)]


async def _one_run(base_url: str, local: bool, bound: float, tag: str) -> dict:
    """Eight calls at once; attempts, failures and makespan from the client's own log."""
    import flowmagic
    from flowmagic.llm import LLM, queue

    flowmagic.configure(base_url=base_url, model="bench", self_hosted=local)
    queue.forget()
    llm = LLM(timeout=bound, first_token_s=bound, stall_s=bound, backoff_base=0.5)
    started = time.perf_counter()
    results = await asyncio.gather(*(llm.complete(p, max_tokens=TOKENS, cache=False,
                                                  run_id=tag) for p in _prompts(tag)),
                                   return_exceptions=True)
    makespan = time.perf_counter() - started
    await llm.aclose()
    attempts = []
    for row in llm.store.recent_calls(100, run_id=tag):
        said = re.search(r"failed (\d+) times", row["error"] or "")
        attempts.append(int(said.group(1)) if said else
                        int((row["response"] or {}).get("attempts") or 1))
    return {"makespan": makespan, "repeated": sum(a > 1 for a in attempts),
            "attempts": sum(attempts),
            "failed": sum(isinstance(r, BaseException) for r in results),
            "delivered": sum(not isinstance(r, BaseException) for r in results)}


def _one_call_s(base_url: str) -> float:
    """One call's duration on an idle server (the unit of the bound)."""
    import flowmagic
    from flowmagic.llm import LLM

    flowmagic.configure(base_url=base_url, model="bench", self_hosted=True)
    llm = LLM()

    async def one():
        started = time.perf_counter()
        await llm.complete("(warm) Write words about tea.", max_tokens=TOKENS, cache=False)
        took = time.perf_counter() - started
        await llm.aclose()
        return took
    return asyncio.run(one())


def loopback_case() -> list[dict]:
    from flowmagic.testing.loopback import LoopbackServer

    rows = []
    with LoopbackServer(slots=1, latency=0.3, stream_s=1 / 30,
                        responder=lambda body: WORDS) as server:
        bound = 3 * _one_call_s(server.base_url)
        for local in (False, True):
            server.reset()
            row = asyncio.run(_one_run(server.base_url, local, bound, f"loop-{local}"))
            time.sleep(bound)   # abandoned requests still running finish meanwhile
            stats = server.stats()
            rows.append({**row, "server": "loopback", "local": local, "bound": bound,
                         "abandoned_s": stats["abandoned_s"], "held": stats["max_in_flight"]})
    return rows


def embedded_case() -> list[dict]:
    from flowmagic.llm import local as embedded
    from flowmagic.store import home

    url = embedded.ensure_server()
    log = home() / "local-server.log"
    rows = []
    try:
        bound = 3 * _one_call_s(url)
        for local in (False, True):
            seen = log.stat().st_size
            row = asyncio.run(_one_run(url, local, bound, f"embedded-{local}"))
            time.sleep(bound)
            text = log.read_text(errors="replace")[seen:]
            times = [float(t) / 1000 for t in re.findall(
                r"llama_perf_context_print:\s+total time =\s+([\d.]+) ms", text)]
            extra = max(0, len(times) - row["delivered"])
            each = sum(times) / len(times) if times else 0.0
            rows.append({**row, "server": "embedded llama-cpp-python", "local": local,
                         "bound": bound, "abandoned_s": extra * each, "generations": len(times),
                         "held": None})
    finally:
        embedded.stop_server()
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| server | client | bound s | calls with > 1 attempt | attempts | failed | "
             "server s on abandoned requests | makespan s | makespan / today's |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    today = {r["server"]: r["makespan"] for r in rows if not r["local"]}
    for r in rows:
        lines.append(f"| {r['server']} | {'local path' if r['local'] else 'today (hosted path)'} "
                     f"| {r['bound']:.1f} | {r['repeated']} | {r['attempts']} | {r['failed']} | "
                     f"{r['abandoned_s']:.1f} | {r['makespan']:.1f} | "
                     f"{r['makespan'] / today[r['server']]:.2f} |")
    return "\n".join(lines)


def write(text: str) -> None:
    from report import write_section

    write_section(RESULTS, BEGIN, END, "A busy local server (issue 34)", text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="print here instead of RESULTS.md")
    parser.add_argument("--skip-embedded", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("FLOWMAGIC_HOME", tempfile.mkdtemp(prefix="fm-bench-local-"))
    os.environ["FLOWMAGIC_CHECK_MODELS"] = "0"
    load = os.getloadavg()[0]
    rows = loopback_case() + ([] if args.skip_embedded else embedded_case())
    text = (f"{time.strftime('%Y-%m-%d %H:%M')}, load {load:.1f} at the start; "
            f"{CALLS} calls at once of {TOKENS} tokens each, one run, `bench/local.py`.\n\n"
            + table(rows))
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    else:
        write(text)


if __name__ == "__main__":
    main()
