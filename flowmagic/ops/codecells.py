"""Code nodes in an exported notebook: `%%flow_code NAME NODE` cells.

A node whose answer held Python that ran (engine/answer_code) is exported as a code cell:
the code as the agent wrote it under a `%%flow_code` line, with the outputs that run
recorded (what it printed, its figures as image/png). Running the cell shows those
recorded outputs again and makes no model call; the code does *not* run in the kernel.
With `--execute` on the line, or `FLOWMAGIC_EXECUTE_CODE=1` in the kernel's environment
(`flowmagic export RUN OUT.ipynb --execute` sets it), the cell's body runs for real, in
the sandbox only, as the next cell of the flow's sandboxed session in the run's files
written next to the notebook (`<notebook>_files/`; see nbsession.py): the flow's first
code cell, `%%flow_code NAME --prelude`, is that session's prelude.

Why a magic and not a plain Python cell: the code was written by a model. A plain cell
would run it in the user's kernel, with the user's files, network and credentials;
flowmagic runs model-written code only inside the sandbox.

The outputs of a cell are made by `code_outputs` both when exporting and when replaying,
so a replay reproduces the exported outputs exactly.
"""

from __future__ import annotations

import base64
import os
import sys
from pathlib import Path
from typing import Any

from .celltext import magic_line
from .._internal import outputs
from ..engine.answer_code import WORKING_START
from ..errors import NodeError
from ..model import status as transition
from ..model.status import Status

__all__ = ["EXECUTE_ENV", "is_code_node", "code_run", "code_line", "code_outputs", "figure_data",
           "FigureBudget", "left_out", "code_cell", "prelude_cell", "files_dir_for"]

EXECUTE_ENV = "FLOWMAGIC_EXECUTE_CODE"
FIGURE_BYTES = 8 << 20          # of one figure embedded in a notebook or shown in the panel
NODE_FIGURES = 20               # figures of one node embedded or shown
NODE_FIGURE_BYTES = 24 << 20    # of one node's figures together
EXPORT_FIGURE_BYTES = 64 << 20  # of all the figures one notebook embeds


def code_run(node_or_record, *, start: bool = False) -> dict | None:
    """What the code of a node (or of its record) did: the run it finished with, or, for a
    node that failed, its last attempt's run. None when no code of it ran. With `start`,
    the run of flowmagic's working start that came before the model's own code ran (None
    when there was none, or when the start's run is the node's run itself)."""
    get = (node_or_record.get if isinstance(node_or_record, dict)
           else lambda key, default=None: getattr(node_or_record, key, default))
    ex = get("execution")
    if not ex and get("status") == Status.FAILED and get("attempts"):
        ex = get("attempts")[-1].get("execution")
    if start and ex:
        ex = ex.get(WORKING_START)
    return ex if ex and ex.get("ran") and ex.get("code") else None


def is_code_node(node) -> bool:
    return node.status in (Status.DONE, Status.FAILED) and code_run(node) is not None


def files_dir_for(notebook: str | Path) -> str:
    """The folder next to an exported notebook holding the run's files."""
    return f"{Path(notebook).stem}_files"


def code_line(flow, name: str, node_id: str) -> str:
    """The `%%flow_code` line: safe names only (`celltext.magic_word`), else one line why."""
    return magic_line("flow_code", (name, "the flow's name"), (node_id, "the node id"), options={
        "--after": (",".join(flow.workflow.parents(node_id)), f"the parents of {node_id}"),
        "--agent": (flow.workflow.nodes[node_id].agent, f"the agent of {node_id}")})


class FigureBudget:
    """The bytes of figures one notebook may still embed (EXPORT_FIGURE_BYTES at first)."""

    def __init__(self, total: int = EXPORT_FIGURE_BYTES):
        self.left = total


def figure_data(folder: Path | None, names: list[str],
                budget: FigureBudget | None = None) -> dict[str, str]:
    """{figure name: base64 PNG} for the figures found in `folder`: regular files reached
    without following a link (engine.confined), at most NODE_FIGURES of them, each at most
    FIGURE_BYTES, NODE_FIGURE_BYTES together and what `budget` has left; any other is left
    out (`left_out` says so)."""
    from ..engine import confined
    from ..errors import WorkspaceError

    out: dict[str, str] = {}
    used = 0
    for fig in list(names)[:NODE_FIGURES] if folder is not None else ():
        room = min(FIGURE_BYTES, NODE_FIGURE_BYTES - used,
                   budget.left if budget is not None else FIGURE_BYTES)
        found = confined.file_stat(folder, str(fig))
        if found is None or found.st_size > room:
            continue
        try:
            data = confined.read_bytes(folder, str(fig), limit=room)
        except WorkspaceError:
            continue
        used += len(data)
        if budget is not None:
            budget.left -= len(data)
        out[fig] = base64.b64encode(data).decode("ascii")
    return out


def left_out(names: list[str], figures: dict[str, str]) -> str:
    """The one line naming the figures `figure_data` left out ('' when none was)."""
    missing = [f for f in names if f not in figures]
    if not missing:
        return ""
    shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
    return (f"flowmagic: {len(missing)} figure(s) not shown here ({shown}): a node shows at "
            f"most {NODE_FIGURES} figures of up to {FIGURE_BYTES >> 20} MB each, "
            f"{NODE_FIGURE_BYTES >> 20} MB together, and a notebook embeds at most "
            f"{EXPORT_FIGURE_BYTES >> 20} MB of figures; the files are in the run's workspace")


def code_outputs(run_id: str, node_id: str, execution: dict, figures: dict[str, str]) -> list[tuple]:
    """The cell's outputs: ("stream", name, text) and ("display", data, metadata) in order."""
    out: list[tuple] = []
    if execution.get("stdout"):
        out.append(("stream", "stdout", execution["stdout"]))
    if not execution.get("ok", True):
        out.append(("stream", "stderr", (execution.get("stderr") or execution.get("error") or "")
                    + ("\n" if not (execution.get("stderr") or "").endswith("\n") else "")))
    names = list(execution.get("figures", []))
    for fig in names[:NODE_FIGURES]:
        data: dict[str, Any] = {"text/plain": f"<figure {fig}>"}
        if fig in figures:
            data["image/png"] = figures[fig]
        out.append(("display", data, {"flowmagic": {"run": run_id, "node": node_id,
                                                    "figure": fig}}))
    line = left_out(names, figures)
    if line:
        out.append(("display", {"text/plain": line},
                    {"flowmagic": {"run": run_id, "node": node_id, "left_out": True}}))
    return out


def _show(items: list[tuple]) -> None:
    for item in items:
        if item[0] == "stream":
            print(item[2], end="", file=sys.stdout if item[1] == "stdout" else sys.stderr)
            (sys.stdout if item[1] == "stdout" else sys.stderr).flush()
        else:
            outputs.show(item[1], item[2])


def _run_of(rec: dict | None, seq: int | None, start: bool) -> dict | None:
    """The recorded run a cell shows: the node's own, its working start's, or (`--seq`) an
    earlier run the session kept (an attempt sent back after its code ran well)."""
    if rec is None:
        return None
    if seq is None:
        return code_run(rec, start=start)
    runs = [rec.get("execution")] + [a.get("execution") for a in rec.get("attempts") or []]
    runs += [r.get(WORKING_START) for r in list(runs) if isinstance(r, dict)]
    return next((r for r in runs if isinstance(r, dict) and r.get("seq") == seq
                 and r.get("ran") and r.get("code")), None)


def code_cell(flow, node_id: str, cell: str | None, *, execute: bool = False,
              start: bool = False, seq: int | None = None) -> None:
    """A `%%flow_code NAME NODE [--execute]` cell: the recorded run of a code node, or a new
    run of its body in the flow's sandboxed session; never a model call, never the code in
    this kernel. `start`: the working start's cell; `seq`: an earlier run the session kept."""
    from .replay import apply_record, fingerprint, session, settle

    node = flow.workflow.node(node_id)
    state = session(flow)
    rec = state.record.get("nodes", {}).get(node_id)
    ran = _run_of(rec, seq, start)
    if ran is None:
        what = "working start" if start else "code run"
        raise NodeError(f"the record has no {what} of {node_id!r}; export the flow again")
    waiting = [p for p in flow.workflow.parents(node_id)
               if flow.workflow.nodes[p].status != Status.DONE]
    if waiting:
        raise NodeError(f"node {node_id!r} waits for {', '.join(waiting)}; run their cells first")
    code = (cell or "").strip("\n") + "\n"
    own = not start and (seq is None or ran is code_run(rec))
    if own:   # an earlier run's cell only shows (or runs again); the node's own cell settles it
        stale = _stale_because(flow, node_id, rec, state.executed, fingerprint)
        apply_record(flow, node_id, rec)
        state.replayed.add(node_id)
        settle(flow)
        if stale:   # the record was made from other inputs: never shown as if it were current
            print(f"{node_id}: {stale} in this session, so the recorded outputs are stale; "
                  "running this code again in the sandbox", file=sys.stderr)
            ex = _execute(flow, node_id, code, state.record, ran.get("seq"))
            _adopt(flow, node_id, ex)
            state.replayed.discard(node_id)
            state.executed.add(node_id)
            return
    if execute or os.environ.get(EXECUTE_ENV) == "1":
        _execute(flow, node_id, code, state.record, ran.get("seq"))
        return
    if own and code.strip() != (ran.get("code") or "").strip():
        print(f"{node_id}: the code differs from the recorded run; add --execute to the "
              "line to run it in the sandbox (the recorded outputs follow)", file=sys.stderr)
    _show(code_outputs(flow.run_id, node.id, ran, rec.get("figures_png") or {}))


def prelude_cell(flow, cell: str | None, *, execute: bool = False) -> None:
    """`%%flow_code NAME --prelude [--execute]`: what the session ran first; run, it starts
    the flow's session in this kernel with this text (nothing to show otherwise)."""
    from .replay import session

    if execute or os.environ.get(EXECUTE_ENV) == "1":
        from .nbsession import python

        python(flow, session(flow).record, prelude=(cell or "").strip("\n") + "\n").session.start()


def _stale_because(flow, node_id: str, rec: dict, executed: set, fingerprint) -> str:
    """Why the record of a code node no longer holds ('' when it does): an ancestor ran
    again in this session, or its inputs differ from the ones it was recorded with."""
    again = [a for a in flow.workflow.ancestors(node_id) if a in executed]
    if again:
        return f"{', '.join(again)} ran again"
    if rec.get("fingerprint") and fingerprint(flow, node_id) != rec["fingerprint"]:
        return "its inputs changed"
    return ""


def _adopt(flow, node_id: str, ex: dict) -> None:
    """The node becomes what its new run did, so the cells after it see the new outputs."""
    from ..engine.answer_code import report

    node = flow.workflow.nodes[node_id]
    answer = next((a.get("output") for a in reversed(node.attempts) if a.get("output")), "")
    output = f"{(answer or '').rstrip()}\n\n{report(ex)}".strip()
    if ex.get("ok"):
        transition.finish(node, output, ex)
    else:
        node.output, node.execution = output, ex
        transition.fail(node, ex.get("error"))


def _execute(flow, node_id: str, code: str, record: dict, seq: int | None = None) -> dict:
    from .nbsession import python, run_cell

    ex = run_cell(flow, record, node_id, code, seq)
    folder = python(flow, record).folder
    _show(code_outputs(flow.run_id, node_id, ex, figure_data(folder, ex["figures"])))
    return ex
