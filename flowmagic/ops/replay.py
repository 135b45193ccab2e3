"""Replaying an exported notebook: what its `%%flow_plan`, `%%flow_record` and `%%flow_node`
cells do (their magics, which read the lines, are in `flowmagic.jupyter.replay_magics`).

A node's *fingerprint* is a hash of everything that decides its model call: the prompt
it would get now (task, requirement, agent role, its parents' outputs, its children's
requirements), the model as named (not the endpoint's URL, so another machine replays
too), the seed, temperature, token limit and validation settings.

A `%%flow_node` cell whose fingerprint equals the one in the `%%flow_record` cell takes
the recorded output: no model call, not even a cache lookup. The record is signed: a hash
over everything it holds, checked when its cell runs. A record that does not match (edited
outputs, result, status or cost) fails its cell in one line and is not used. A node cell
that would call its model says so first; with no trusted record (the cell was edited,
deleted or not run) it refuses unless allowed with `--allow-calls` (on the node cell, or on
`%%flow_plan NAME` / `%%flow_record NAME` for every node). The hash finds edits and
damage; it is no defence against someone who recomputes it. Otherwise the node runs
(through the cache, so a call made before on this machine is still free); its finished
descendants and the result are marked stale, and their cells, if shown in this kernel
session, change to "stale — re-run this cell to update". Running a cell again with
nothing changed shows the same output again. The record is a cell, and not only
notebook metadata, because a kernel never sees the notebook's metadata.

The output of a node cell is a pure function of the node (its output, or why it has
none), so a replay is byte-for-byte the exported output; where the output came from
(run, node, model, seeds, cache keys, replayed or not) is in the output's metadata under
"flowmagic", which nbval ignores.
"""

from __future__ import annotations

import hashlib
import json
import weakref
from typing import Any, Callable

from ..errors import ConfigError, NodeError, PlanError
from .._internal import outputs
from .._internal.aio import run_blocking
from ..model import status as transition
from ..model.status import STATUSES, RunState, Status

__all__ = ["fingerprint", "record_signature", "plan_parts", "use_record", "replay_node",
           "show_result", "node_bundle", "result_bundle", "attach_record", "apply_record",
           "plan_summary", "settle", "setting_value", "tables", "session", "json_body"]

class _Replay:
    """What one notebook session knows about a Flow: its record and what ran how."""

    def __init__(self) -> None:
        self.record: dict = {}
        self.seen: dict[str, str] = {}   # node -> fingerprint it was last shown with
        self.replayed: set[str] = set()
        self.executed: set[str] = set()
        self.shown: dict[str, str] = {}  # node (or "result") -> id of its latest display
        self.count = 0
        self.allow_calls = False         # --allow-calls on the plan or record cell
        self.rejected: str | None = None  # why the record cell's record was not used


_STATES: "weakref.WeakKeyDictionary[Any, _Replay]" = weakref.WeakKeyDictionary()


def session(flow) -> _Replay:
    """What this notebook session knows about `flow` (made on first use)."""
    if flow not in _STATES:
        _STATES[flow] = _Replay()
    return _STATES[flow]


def record_signature(record: dict) -> str:
    """The hash over everything a record holds but its signature (see the module docstring)."""
    body = {k: v for k, v in record.items() if k != "signature"}
    blob = json.dumps(body, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()


def setting_value(value: Any) -> Any:
    """A setting as JSON: a function (a validator) by its name, "function:NAME"."""
    if callable(value):
        return f"function:{getattr(value, '__qualname__', None) or type(value).__name__}"
    return value


def fingerprint(flow, node_id: str) -> str:
    """The hash of what decides a node's model call (see the module docstring)."""
    from ..engine.node_runner import node_messages

    node = flow.workflow.nodes[node_id]
    # the prompt's parts in a fixed order (not the layout sent), so exports stay valid
    facts = {"messages": node_messages(flow.context(), node_id, workspace=False, facts=True),
             "model": node.model or flow.settings.model,
             **{k: setting_value(v) for k, v in flow.settings.deciding_calls().items()}}
    blob = json.dumps(facts, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def _block(flow, make: Callable[[], Any]) -> Any:
    """Await `make()` to its end, also from inside a running loop (a notebook cell runs in
    the kernel's loop): then in a worker thread with its own loop, so the cell's output
    appears in the cell that asked for it. Ctrl-C stops the flow cleanly."""
    return run_blocking(make, close=flow.llm.aclose, on_interrupt=flow.stop, name="flowmagic-node")


# ----------------------------------------------------------------------------- displays
def _model_of(flow, node) -> str:
    for attempt in reversed(node.attempts):
        if attempt.get("model"):
            return str(attempt["model"])
    return node.model or flow.settings.model or "default"


def node_bundle(flow, node_id: str, *, replayed: bool | None = None) -> tuple[dict, dict]:
    """(data, metadata) of a `%%flow_node` cell's output; the data depends only on the node."""
    wf = flow.workflow
    node = wf.nodes[node_id]
    if node.status == Status.DONE:
        text = node.output or ""
        if node.stale:
            text = f"*⚠ stale — an input changed; re-run this cell to update.*\n\n{text}"
    elif node.status == Status.FAILED:
        text = f"**failed**: {node.error or 'no output'}"
    else:
        waiting = [p for p in wf.parents(node_id) if wf.nodes[p].status != Status.DONE]
        text = (f"*not run: waits for {', '.join(waiting)}*" if waiting else "*not run yet*")
    attempts = node.attempts
    meta = {"run": flow.run_id, "node": node_id, "agent": node.agent, "status": node.status,
            "model": _model_of(flow, node), "replayed": replayed, "stale": node.stale,
            "seeds": [a.get("seed") for a in attempts if a.get("seed") is not None],
            "cache_keys": [a.get("cache_key") for a in attempts if a.get("cache_key")],
            "source_run": session(flow).record.get("run")}
    from ..view.safe import model_bundle   # model text: sanitized HTML, never raw Markdown
    return model_bundle(text), {"flowmagic": meta}


def _cost_rows(flow) -> tuple[list[list[str]], dict]:
    wf = flow.workflow
    rows, total = [], {"tokens_in": 0, "tokens_out": 0, "cost_usd": 0.0}
    for node_id in wf.order():
        node = wf.nodes[node_id]
        if node.start is None and not node.attempts:
            continue
        seconds = f"{node.duration:.1f}" if node.duration is not None else ""
        rows.append([node_id, node.agent, _model_of(flow, node), str(node.tokens_in),
                     str(node.tokens_out), f"{node.cost_usd:.6f}", seconds])
        total["tokens_in"] += node.tokens_in
        total["tokens_out"] += node.tokens_out
        total["cost_usd"] += node.cost_usd
    extra = session(flow).record.get("overhead") or {}
    if extra.get("calls"):
        rows.append(["(planning, updates, write-up)", "", "", str(extra.get("input_tokens", 0)),
                     str(extra.get("output_tokens", 0)), f"{extra.get('cost_usd', 0.0):.6f}", ""])
        total["tokens_in"] += extra.get("input_tokens", 0)
        total["tokens_out"] += extra.get("output_tokens", 0)
        total["cost_usd"] += extra.get("cost_usd", 0.0)
    rows.append(["total", "", "", str(total["tokens_in"]), str(total["tokens_out"]),
                 f"{total['cost_usd']:.6f}", ""])
    return rows, total


def tables(header: list[str], rows: list[list[str]]) -> tuple[str, str]:
    cells = [header, *rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    text = "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells)
    md = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    md += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
    return text, "\n".join(md)


def result_bundle(flow) -> tuple[dict, dict]:
    """(data, metadata) of the result-and-cost cell."""
    wf = flow.workflow
    left = [i for i in wf.order() if wf.nodes[i].status != Status.DONE]
    stale = [i for i in wf.order() if wf.nodes[i].stale]
    if left:
        result = f"*no result yet: not done: {', '.join(left)}*"
    elif stale:
        result = (f"*⚠ stale — re-run the cells of {', '.join(stale)}, then this cell.*"
                  + (f"\n\n{flow.result}" if flow.result else ""))
    elif flow.result is None:
        result = ("*no result: the final write-up is off (consolidate=False)*"
                  if not flow.settings.consolidate else "*no result yet*")
    else:
        result = flow.result
    rows, total = _cost_rows(flow)
    text_table, md_table = tables(
        ["node", "agent", "model", "tokens in", "tokens out", "USD", "seconds"], rows)
    text = f"Result\n\n{result}\n\nCost\n\n{text_table}"
    meta = {"flowmagic": {"run": flow.run_id, "what": "result", "total": total,
                          "source_run": session(flow).record.get("run")}}
    from ..view.safe import markdown_html
    # the model's result on its own, so a fence it left open cannot swallow the cost table
    html = markdown_html(f"### Result\n\n{result}") + markdown_html(f"### Cost\n\n{md_table}")
    return {"text/html": html, "text/plain": text}, meta


def _show(flow, what: str, bundle: tuple[dict, dict], *, update: bool = False) -> None:
    """Display a node's (or the result's) output; `update` rewrites its latest display.

    Each display gets a new id, remembered per node: an update must reach the output now
    on screen, not one a re-run cell has already cleared (nbclient trips over those)."""
    data, meta = bundle
    state = session(flow)
    if update:
        if what in state.shown:
            outputs.show(data, meta, display_id=state.shown[what], update=True)
        return
    state.count += 1
    state.shown[what] = f"flowmagic-{flow.name}-{what}-{state.count}"
    outputs.show(data, meta, display_id=state.shown[what])


# ----------------------------------------------------------------------------- the cells
def json_body(cell: str | None, magic: str) -> Any:
    """The JSON body of a `%%flow_plan` / `%%flow_record` cell, or one line saying it is not."""
    try:
        return json.loads(cell or "")
    except ValueError as exc:
        raise PlanError(f"the body of %%{magic} is not JSON ({exc}); fix it or export again") from None


def plan_parts(plan: dict, namespace: dict | None = None) -> tuple[Any, dict]:
    """(workflow, settings) of the Flow a `%%flow_plan` cell makes: nodes pending (pruned
    ones stay pruned); the caller makes the Flow (`flowmagic.flow.flow_from_plan`).

    A setting "function:NAME" (a validator) becomes the function NAME of `namespace` when
    the notebook defines it; else it stays a name, and a node that runs again reports
    its validator as unavailable."""
    from ..model.graph import Workflow
    from ..settings import DEFAULTS

    if not isinstance(plan, dict) or "nodes" not in plan:
        raise PlanError('a %%flow_plan body is {"task": ..., "settings": {...}, "nodes": [...], '
                        '"edges": [...]}; export the flow again to get one')
    workflow = Workflow.from_dict({k: plan[k] for k in ("task", "nodes", "edges") if k in plan},
                                  task=plan.get("task") or "")
    for node in workflow.nodes.values():
        if node.status != Status.PRUNED:
            transition.reset(node)
    settings = {k: v for k, v in (plan.get("settings") or {}).items() if k in DEFAULTS}
    for key, value in settings.items():
        if isinstance(value, str) and value.startswith("function:"):
            found = (namespace or {}).get(value.split(":", 1)[1])
            if callable(found):
                settings[key] = found
    return workflow, settings


def settle(flow) -> bool:
    """Call the flow done when every active node is; True when it is."""
    wf = flow.workflow
    done = all(wf.nodes[i].status == Status.DONE for i in wf.order())
    if done:
        flow.status = RunState.DONE
    return done


def plan_summary(flow) -> str:
    """The one line a `%%flow_plan` cell prints."""
    order = flow.workflow.order()
    return (f"{flow.name}: {len(order)} subtasks ({', '.join(order)}), "
            f"{len(flow.workflow.edges())} dependencies")


def use_record(flow, cell: str | None, allow: bool) -> None:
    """A `%%flow_record NAME` cell: what every node of `flow` produced when it was exported,
    checked against its signature before anything is replayed from it."""
    state = session(flow)
    state.allow_calls = state.allow_calls or allow
    state.record, state.rejected = {}, "its %%flow_record cell did not give a usable record"
    record = json_body(cell, "flow_record")
    if not isinstance(record, dict) or not isinstance(record.get("nodes"), dict):
        raise PlanError('a %%flow_record body is {"run": ..., "nodes": {...}}; export again')
    signed = record.get("signature")
    # Records before format 2 carry no signature; they replay as they always did.
    if (signed is not None or record.get("format", 1) >= 2) and signed != record_signature(record):
        state.rejected = "its record was changed after export"
        raise PlanError(
            f"the record of {flow.name!r} does not match its signature (it was changed after "
            "export), so nothing is replayed from it; export the notebook again, or add "
            "--allow-calls to let its node cells call the model")
    attach_record(flow, record)
    state.rejected = None


def attach_record(flow, record: dict) -> None:
    """Give `flow` the record its `%%flow_node` cells replay from."""
    session(flow).record = record


def apply_record(flow, node_id: str, rec: dict) -> None:
    """Make a node what the record says it was (status, output, usage, timings, attempts)."""
    node = flow.workflow.nodes[node_id]
    status = rec.get("status", Status.DONE)
    if status not in STATUSES:
        raise NodeError(f"the record of node {node_id!r} says status {status!r}, which is none "
                        f"of {STATUSES}; export the flow again to get a good record")
    node.status = Status(status)
    node.output, node.error = rec.get("output"), rec.get("error")
    node.tokens_in, node.tokens_out = rec.get("tokens_in", 0), rec.get("tokens_out", 0)
    node.cost_usd, node.start, node.end = rec.get("cost_usd", 0.0), rec.get("start"), rec.get("end")
    node.attempts = [dict(a) for a in rec.get("attempts", [])]
    node.clone, node.stale = rec.get("clone"), False
    node.execution = rec.get("execution")


def _edit(flow, node_id: str, requirement: str, agent: str, model: str | None) -> bool:
    """Apply what the cell says; True when the node is no longer what it was."""
    from ..model.names import agent_name_problem, model_name_problem

    problem = agent_name_problem(agent) or (model is not None and model_name_problem(model))
    if problem:   # an edited line: its names must be ones an export could write again
        raise ConfigError(f"%%flow_node {node_id}: {problem}; fix the cell's line")
    node = flow.workflow.nodes[node_id]
    if (requirement, agent, model) == (node.requirement, node.agent, node.model):
        return False
    flow.edit(node_id, requirement)   # resets a finished node, marks its descendants stale
    node.agent = agent
    if model != node.model:
        if model:
            flow.downgrade(node_id, model)
        else:
            node.model = None
    return True


def _check_after(flow, node_id: str, after: str) -> None:
    said = sorted(a for a in after.replace(" ", "").split(",") if a)
    parents = flow.workflow.parents(node_id)
    if said != sorted(parents):
        raise PlanError(f"the plan has {node_id!r} after {', '.join(parents) or 'nothing'} but "
                        f"the cell says --after {','.join(said) or '(nothing)'}; change edges in "
                        "the %%flow_plan cell and run it again")


def _run_one(flow, node_id: str) -> None:
    """Run one node as if for the first time, so the same cell always makes the same call
    (and hits the cache the next time); earlier attempts are kept before the new ones.
    No final write-up: the result cell does that."""
    node = flow.workflow.nodes[node_id]
    consolidate, earlier = flow.settings.consolidate, node.attempts
    flow.settings.consolidate, node.attempts = False, []
    try:
        _block(flow, lambda: flow.arun(only=[node_id]))
    finally:
        flow.settings.consolidate = consolidate
        node.attempts = earlier + node.attempts


def _mark_stale(flow, node_id: str) -> list[str]:
    wf = flow.workflow
    stale = [d for d in wf.descendants(node_id) if wf.nodes[d].stale]
    if outputs.in_kernel():
        for d in stale:
            _show(flow, d, node_bundle(flow, d), update=True)
        _show(flow, "result", result_bundle(flow), update=True)
    return stale


def replay_node(flow, node_id: str, cell: str | None, *, after: str, agent: str | None,
                model: str | None, allow: bool) -> None:
    """A `%%flow_node NAME NODE --after A,B --agent ROLE [--model M]` cell: replay or run
    one node by the replay rule, and show its output."""
    wf = flow.workflow
    node = wf.node(node_id)
    if node.status == Status.PRUNED:
        raise NodeError(f"node {node_id!r} is pruned; delete its cell or restore it in the plan")
    _check_after(flow, node_id, after)
    requirement = (cell or "").strip()
    if not requirement:
        raise NodeError(f"the cell of {node_id!r} is empty; its body is the node's requirement")
    rec = session(flow).record.get("nodes", {}).get(node_id)
    waiting = [p for p in wf.parents(node_id) if wf.nodes[p].status != Status.DONE]
    if waiting:
        if rec is not None and rec.get("status") == Status.PENDING:
            _show(flow, node_id, node_bundle(flow, node_id))
            return   # it never ran when exported, and cannot run now: same output as then
        raise NodeError(f"node {node_id!r} waits for {', '.join(waiting)}; run their cells first")
    changed = _edit(flow, node_id, requirement, agent or node.agent, model)
    replayed, stale = _replay_or_run(flow, node_id, rec, changed, allow)
    _show(flow, node_id, node_bundle(flow, node_id, replayed=replayed))
    if stale:
        print(f"{node_id} ran again; stale now: {', '.join(stale)} (re-run their cells to update)")


def _before_call(flow, node_id: str, rec: dict | None, allow: bool) -> None:
    """Say that a replay is about to call a model, or refuse when there is no trusted record."""
    state = session(flow)
    if not state.record and not (allow or state.allow_calls):
        why = state.rejected or f"no %%flow_record {flow.name} cell has run"
        raise NodeError(
            f"node {node_id!r} has no trusted record to replay ({why}), so this cell would "
            f"call the model; run the record cell, export again, or add --allow-calls to "
            "this cell to call it")
    node = flow.workflow.nodes[node_id]
    if rec is None or not state.record:
        why = "no record of it"
    elif rec.get("status") not in (Status.DONE, Status.FAILED):
        why = "it had not run when the notebook was exported"
    else:
        why = "its requirement or inputs changed since the export"
    print(f"{node_id}: {why}; calling {_model_named(node.model or flow.settings.model)}")


def _model_named(model: str | None) -> str:
    """The model a call will go to, as a user would name it."""
    from ..llm.endpoints import resolve

    endpoint, name = resolve(model)
    where = "the embedded model" if endpoint.local else endpoint.base_url
    return f"{name} at {where}" if name else where


def _replay_or_run(flow, node_id: str, rec: dict | None, changed: bool,
                   allow: bool = False) -> tuple[bool, list[str]]:
    """(replayed, descendants now stale): the replay rule of the module docstring."""
    state = session(flow)
    node = flow.workflow.nodes[node_id]
    fp = fingerprint(flow, node_id)
    stale: list[str] = []
    if node.status in (Status.DONE, Status.FAILED) and not changed and state.seen.get(node_id) == fp:
        replayed = node_id in state.replayed   # shown before in this session, unchanged
        node.stale = False                      # its inputs are what they were then
    elif rec is not None and rec.get("fingerprint") == fp and rec.get("status") in (Status.DONE, Status.FAILED):
        apply_record(flow, node_id, rec)
        state.replayed.add(node_id)
        replayed = True
        settle(flow)
        flow.emit("replayed", node_id, {"source_run": state.record.get("run")})
    else:
        _before_call(flow, node_id, rec, allow)
        if node.status in (Status.DONE, Status.FAILED):
            flow.edit(node_id, node.requirement)   # an input changed: run it again
        _run_one(flow, node_id)
        state.replayed.discard(node_id)
        state.executed.add(node_id)
        replayed = False
        stale = _mark_stale(flow, node_id)
    state.seen[node_id] = fp
    return replayed, stale


def show_result(flow) -> None:
    """The result (replayed when every node was, else written again) and the cost table."""
    state = session(flow)
    wf = flow.workflow
    active = wf.order()
    fresh = not any(wf.nodes[i].stale for i in active)
    if flow.result is None and fresh and all(wf.nodes[i].status == Status.DONE for i in active):
        recorded = state.record.get("result")
        if recorded is not None and not state.executed and state.replayed >= set(active):
            flow.result = recorded
        elif flow.settings.consolidate:
            if not (state.record or state.allow_calls or state.executed):
                raise NodeError(
                    f"the result of {flow.name!r} has no trusted record to replay "
                    f"({state.rejected or 'no record cell has run'}), so this cell would call "
                    f"the model; export again, or add --allow-calls to %%flow_plan {flow.name}")
            print(f"result: the nodes are not all as exported; calling "
                  f"{_model_named(flow.settings.model)} for the final write-up")
            _block(flow, flow.arun)   # nothing left to run: only the final write-up
    _show(flow, "result", result_bundle(flow))

