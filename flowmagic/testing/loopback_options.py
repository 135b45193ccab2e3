"""The loopback server's options: the fault kinds, the engines, and how its options make the
trip to a server in another process (`LoopbackServer.spawn`) and back (its command line)."""

from __future__ import annotations

import argparse
import json
from typing import Any, Callable

from ..errors import ConfigError

__all__ = ["FAULT_KINDS", "ENGINES", "parse_latency", "parse_faults", "cli_args", "parser"]

FAULT_KINDS = ("429", "500", "hang", "truncated", "garbage", "length", "401", "trickle", "echo",
               "stall")
ENGINES = ("threads", "asyncio")
# Options that survive a trip through the command line (callables cannot).
CLI_FLAGS = {"seed": "--seed", "fail_first": "--fail-first", "fail_kind": "--fail-kind",
              "retry_after": "--retry-after", "hang_s": "--hang-s", "trickle_s": "--trickle-s", "dims": "--dims", "model": "--model",
              "port": "--port", "engine": "--engine", "slots": "--slots", "stream_s": "--stream-s"}


def parse_latency(latency: Any) -> tuple[float, float] | Callable[[dict], float]:
    if callable(latency):
        return latency
    try:
        if isinstance(latency, str):
            parts = [float(x) for x in latency.split(":")]
            latency = parts[0] if len(parts) == 1 else parts
        lo, hi = (latency, latency) if isinstance(latency, (int, float)) else latency
        lo, hi = float(lo), float(hi)
    except (TypeError, ValueError):
        raise ConfigError(f"latency {latency!r} is not a number, a (lo, hi) pair or a callable") from None
    if not 0 <= lo <= hi:
        raise ConfigError(f"latency range ({lo}, {hi}) must satisfy 0 <= lo <= hi")
    return lo, hi


def parse_faults(faults: Any) -> dict[str, float]:
    if isinstance(faults, str):  # from the command line: JSON or "429=0.1,500=0.05"
        faults = json.loads(faults) if faults.lstrip().startswith("{") else dict(
            item.split("=", 1) for item in faults.split(",") if item.strip())
    rates = {str(k).strip(): float(v) for k, v in (faults or {}).items()}
    unknown = sorted(set(rates) - set(FAULT_KINDS))
    if unknown:
        raise ConfigError(f"unknown fault kinds {unknown}; use some of {list(FAULT_KINDS)}")
    if any(not 0 <= r <= 1 for r in rates.values()) or sum(rates.values()) > 1 + 1e-9:
        raise ConfigError(f"fault rates {rates} must each be in [0, 1] and sum to at most 1")
    return rates


def cli_args(options: dict) -> list[str]:
    options = dict(options)
    if callable(options.get("latency")) or options.pop("responder", None) is not None:
        raise ConfigError("spawn() cannot send a callable latency or responder to another process; "
                          "use an in-process LoopbackServer for those")
    lo, hi = parse_latency(options.pop("latency", 0.0))
    args = ["--latency", f"{lo!r}:{hi!r}", "--faults", json.dumps(parse_faults(options.pop("faults", None)))]
    if options.pop("reject_json_schema", False):
        args.append("--reject-json-schema")
    unknown = sorted(set(options) - set(CLI_FLAGS))
    if unknown:
        raise ConfigError(f"unknown loopback options {unknown}; known: {sorted(CLI_FLAGS)}")
    for name, value in options.items():
        args += [CLI_FLAGS[name], str(value)]
    return args


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m flowmagic.testing.loopback",
                                description="Serve a loopback OpenAI-compatible API on 127.0.0.1; "
                                            "prints the base URL as one line.")
    p.add_argument("--latency", default="0", help="seconds: a number or lo:hi (default 0)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--faults", default="",
                   help="JSON or 429=0.1,500=0.05 (kinds: " + ", ".join(FAULT_KINDS) + ")")
    p.add_argument("--fail-first", type=int, default=0, help="the first N attempts of each body get HTTP 500")
    p.add_argument("--fail-kind", default="500", choices=FAULT_KINDS, help="the fault fail-first gives")
    p.add_argument("--reject-json-schema", action="store_true",
                   help="HTTP 500 on json_schema, like llama-cpp-python")
    p.add_argument("--retry-after", type=float, default=0.05)
    p.add_argument("--hang-s", type=float, default=30.0)
    p.add_argument("--trickle-s", type=float, default=0.5, help="seconds between the pieces of a trickle")
    p.add_argument("--dims", type=int, default=64)
    p.add_argument("--model", default="loopback")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--engine", default="threads", choices=ENGINES,
                   help="threads: one per connection, every fault; asyncio: one event loop, for many "
                        "connections at once (no hang or trickle)")
    p.add_argument("--slots", type=int, default=None,
                   help="chat requests served at once; the others wait (default: no limit)")
    p.add_argument("--stream-s", type=float, default=0.0, help="seconds between a stream's events")
    p.add_argument("--lifetime", type=float, default=0,
                   help="exit after this many seconds (0: until signalled)")
    p.add_argument("--exit-on-stdin-eof", action="store_true", help="exit when stdin closes (used by spawn)")
    return p
