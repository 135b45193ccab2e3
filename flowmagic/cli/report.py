"""A flow for the terminal: its plan, its drawings, what its code printed, the model's
result and the closing summary line."""

from __future__ import annotations

import re
from pathlib import Path

from .options import write_text
from ..errors import write_error
from .._internal.text import one_line
from ..model.status import Status

__all__ = ["describe", "drawings", "summary", "printed", "shown"]

# Control characters but tab and newline: a terminal would obey an escape sequence in model text.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def describe(flow) -> str:
    from ..view.display import node_lines

    def line(node_id, node, parents):
        after = one_line(", ".join(parents), 200)
        return (f"  {node_id} [{node.agent}]{' after ' + after if after else ''}: "
                f"{one_line(node.requirement, 90)}")

    return "\n".join(node_lines(flow.workflow, flow.workflow.order(), line))


def drawings(flow, folder: Path, name: str) -> list[Path]:
    from ..view import render

    written = [folder / f"{name}.svg"]
    write_text(written[0], render.svg(flow))
    if render.have_dot():
        written.append(folder / f"{name}.png")
        try:
            written[-1].write_bytes(render.png(flow))
        except OSError as exc:
            raise write_error(written[-1], exc) from None
    return written


def summary(flow, seconds: float) -> str:
    counts = flow.counts()
    total = flow.cost_data()["total"]
    failed = f", {counts[Status.FAILED]} failed" if counts.get(Status.FAILED) else ""
    started = [i for i, n in flow.workflow.nodes.items() if n.status == Status.DONE
               and n.attempts and n.attempts[-1].get("fallback") == "starter"]
    if started:   # done on flowmagic's code, not the model's: said where the count is
        failed += (f" ({', '.join(started)}: the working start's output, the model's answers "
                   "were not usable)")
    return (f"{flow.name}: {flow.status}; {counts.get(Status.DONE, 0)}/{flow.total()} nodes done{failed}; "
            f"{seconds:.1f} s; {total['calls'] - total['cached']} model calls "
            f"(+{total['cached']} from the cache); tokens {total['input_tokens']:,} in"
            f"{_prompt_cached(total)}, "
            f"{total['output_tokens']:,} out; ${total['cost_usd']:.4f}")


def printed(flow, lines_each: int = 30) -> str:
    """What the nodes' code printed in the sandbox, node by node (clipped), and the figures it
    drew: the numbers a data flow shows come from here, not from the model's words."""
    from ..engine.answer_code import WORKING_START

    parts = []
    for node_id in flow.workflow.order():
        ran = flow.workflow.nodes[node_id].execution or {}
        for record in (ran.get(WORKING_START), ran):
            if isinstance(record, dict) and record.get("ran"):
                parts.append(_printed_by(node_id, record, lines_each))
    return "\n".join(parts)


def _printed_by(node_id: str, ran: dict, lines_each: int) -> str:
    whose = "flowmagic's working start" if ran.get("starter") else "the model's code"
    text = (ran.get("stdout") or "").rstrip().splitlines()
    more = f"\n    … {len(text) - lines_each} more line(s)" if len(text) > lines_each else ""
    shown = "\n".join("    " + _CONTROL.sub("", line)[:160]   # printed by model code
                      for line in text[:lines_each]) or "    (nothing)"
    figures = f"; figures: {', '.join(ran['figures'])}" if ran.get("figures") else ""
    state = "ran" if ran.get("ok") else f"failed: {one_line(ran.get('error') or '', 120)}"
    return f"  {node_id} ({whose}, {state}{figures}) printed:\n{shown}{more}"


def shown(text: str, lines: int = 40) -> str:
    """Model text for a terminal: no control characters (an escape sequence could rewrite
    what the terminal shows), indented, at most `lines` lines."""
    rows = _CONTROL.sub("", text).rstrip().splitlines()
    more = f"\n    … {len(rows) - lines} more line(s)" if len(rows) > lines else ""
    return "\n".join("    " + row[:300] for row in rows[:lines]) + more


def _prompt_cached(total: dict) -> str:
    n = total.get("cached_tokens") or 0
    return f" ({n:,} from the endpoint's prompt cache)" if n else ""
