"""Export an executed flow as a notebook whose cells replay it; drawings; the call cache.

`export(flow, path)` (also `Flow.to_notebook(path)` and `%flow export NAME PATH`) writes an
nbformat v4 notebook:

1. the task (Markdown);
2. `%load_ext flowmagic` and the endpoints by name and model (never a key);
3. `%%flow_plan NAME`: the chosen graph and the settings as JSON (nothing is planned again);
4. `%%flow_record NAME` (input collapsed): what every node produced, with its fingerprint;
5. one `%%flow_node NAME NODE --after A,B --agent ROLE [--model M]` cell per node in
   topological order, its body the requirement, its output the node's recorded output;
6. the result and the cost (`show_result`), then the graph and the timeline
   (`show_drawings`, tagged `nbval-ignore-output`: graphviz versions draw differently),
   each as PNG beside SVG so they show in an untrusted notebook and on code-hosting sites.

Every output is made by the same function the cell calls when it runs (see replay.py), on
a copy of the flow rebuilt from the exported cells, so running the notebook top to bottom
reproduces each output exactly with no model call. The notebook's metadata keeps models,
seeds, cache keys, tokens, cost, timings, the candidates and the update log.

`save_cache` / `load_cache` move cached model answers between machines as JSON (the
tutorials ship theirs, so they replay anywhere without calling the model).
"""

from __future__ import annotations

import base64
import json
import re
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from .celltext import comment, literal, magic_line
from .codecells import (FigureBudget, code_line, code_outputs, code_run, figure_data,
                        files_dir_for, is_code_node)
from ..engine.session import kept_cells, recorded_cells
from ..errors import ConfigError, NodeError, write_error
from ..view.safe import markdown_cell
from .replay import (apply_record, attach_record, fingerprint, node_bundle, plan_parts,
                     plan_summary, record_signature, result_bundle, setting_value, settle,
                     show_result, tables)
from ..model.status import Status
from .._internal.outputs import show as display_output

__all__ = ["export", "build", "plan_json", "drawing_bundles", "show_result", "show_drawings",
           "load_cache", "save_cache", "NBVAL_IGNORE", "RECORD_FORMAT"]

NBVAL_IGNORE = "nbval-ignore-output"
RECORD_FORMAT = 2   # 2: signed (replay.record_signature)
_ATTEMPT_KEYS = ("attempt", "start", "end", "passed", "feedback", "error", "call_id",
                 "cache_key", "model", "cached", "tokens_in", "tokens_out", "cost_usd",
                 "seed", "masked", "cut", "continuations", "execution")
_KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}


# ----------------------------------------------------------------------------- drawings
def _timeline_png(rows: list[dict]) -> bytes | None:
    """The timeline as PNG, drawn by graphviz at fixed positions (neato -n2), so it shows
    where SVG does not (an untrusted notebook in JupyterLab); None without `dot`."""
    import graphviz

    rows = [r for r in rows if r.get("start") is not None and r.get("end") is not None]
    if not rows:
        return None
    from ..view.render import STATUS_COLORS

    t0 = min(r["start"] for r in rows)
    span = max(max(r["end"] for r in rows) - t0, 1e-3)
    scale, left, row_h = 400 / span, 180, 22
    g = graphviz.Graph("timeline", engine="neato")
    g.attr(bgcolor="white")
    g.attr("node", fontname="Helvetica", fontsize="9", fixedsize="true", height=str(14 / 72))
    for i, row in enumerate(rows):
        y = (len(rows) - i) * row_h + 20
        x0, x1 = left + (row["start"] - t0) * scale, left + (row["end"] - t0) * scale
        width = max(x1 - x0, 2)
        who = row.get("clone") or row.get("agent") or ""
        g.node(f"l{i}", label=f"{row['node']} · {who}"[:34], shape="plaintext",
               pos=f"{left / 2 - 4},{y}!", width=str((left - 10) / 72))
        g.node(f"b{i}", label="", shape="box", style="filled", pos=f"{x0 + width / 2},{y}!",
               width=str(width / 72), fillcolor=STATUS_COLORS.get(row.get("status"), "#ffffff"))
    g.node("axis", label=f"0 s … {span:.1f} s", shape="plaintext", pos=f"{left + 200},8!",
           width=str(400 / 72))
    try:
        return g.pipe(format="png", neato_no_op=2, quiet=True)
    except graphviz.ExecutableNotFound:
        return None


def _timeline_text(rows: list[dict]) -> str:
    rows = [r for r in rows if r.get("start") is not None]
    if not rows:
        return "nothing has run yet"
    t0 = min(r["start"] for r in rows)
    table = [[r["node"], r.get("clone") or r.get("agent") or "", r["status"],
              f"{r['start'] - t0:.1f}",
              f"{r['duration_s']:.1f}" if r.get("duration_s") is not None else ""]
             for r in rows]
    return tables(["node", "agent", "status", "start s", "took s"], table)[0]


def drawing_bundles(flow) -> list[tuple[dict, dict]]:
    """The graph (PNG beside SVG) and the timeline (SVG, PNG and a text table)."""
    from ..view import render

    meta = {"flowmagic": {"run": flow.run_id, "what": "drawing"}}
    graph: dict[str, Any] = {"text/plain": render.summary(flow)}
    if render.have_dot():
        graph["image/svg+xml"] = render.svg(flow)
        graph["image/png"] = base64.b64encode(render.png(flow)).decode("ascii")
    else:
        graph["text/plain"] += f"\n{render.DOT_HINT}\n{render.draw(flow).source}"
    rows = flow.timeline_rows()
    timeline: dict[str, Any] = {"text/plain": _timeline_text(rows),
                                "image/svg+xml": render.timeline_svg(flow)}
    picture = _timeline_png(rows)
    if picture is not None:
        timeline["image/png"] = base64.b64encode(picture).decode("ascii")
    return [(graph, meta), (timeline, {"flowmagic": {"run": flow.run_id, "what": "timeline"}})]




def show_drawings(flow) -> None:
    """The graph and the timeline, each as PNG beside SVG."""
    for data, meta in drawing_bundles(flow):
        display_output(data, meta)


# ----------------------------------------------------------------------------- export
def _identifier(name: str) -> str:
    from ..model.graph import slugify
    from ..magic_grammar import is_flow_name

    slug = slugify(name, "flow")
    return slug if slug[0].isalpha() and is_flow_name(slug) else f"flow_{slug}"


def _plan(flow) -> dict:
    wf = flow.workflow
    nodes = []
    for node in wf.nodes.values():
        d = {"id": node.id, "requirement": node.requirement.strip(), "agent": node.agent,
             "model": node.model}
        if node.downgraded_from:
            d["downgraded_from"] = node.downgraded_from
        if node.status == Status.PRUNED:
            d["status"] = Status.PRUNED
        nodes.append(d)
    settings = {k: setting_value(v) for k, v in flow.settings.items()}
    return {"task": wf.task, "settings": settings, "nodes": nodes,
            "edges": [list(e) for e in wf.edges()]}


def plan_json(plan: dict) -> str:
    """The plan as JSON to read: one line per node and for the settings."""
    def one(value: Any) -> str:
        return json.dumps(value, ensure_ascii=False)

    nodes = ",\n".join(f"  {one(n)}" for n in plan["nodes"])
    return (f'{{\n "task": {one(plan["task"])},\n "settings": {one(plan["settings"])},\n'
            f' "nodes": [\n{nodes}\n ],\n "edges": {one(plan["edges"])}\n}}')


def _node_record(node, folder: Path | None = None, budget: FigureBudget | None = None) -> dict:
    attempts = [{k: a[k] for k in _ATTEMPT_KEYS if k in a} for a in node.attempts]
    rec = {"status": node.status, "output": node.output, "error": node.error,
           "tokens_in": node.tokens_in, "tokens_out": node.tokens_out,
           "cost_usd": node.cost_usd, "start": node.start, "end": node.end,
           "clone": node.clone, "attempts": attempts, "execution": node.execution}
    if is_code_node(node):   # the figures travel with the notebook, so a replay shows them
        runs = [r for r in (code_run(node, start=True), code_run(node)) if r]
        rec["figures_png"] = figure_data(folder, [f for r in runs for f in r.get("figures", [])],
                                         budget)
    return rec


def _overhead(flow) -> dict:
    """Calls that belong to no node: planning, updates, validation, the final write-up."""
    out = {"calls": 0, "input_tokens": 0, "output_tokens": 0, "cost_usd": 0.0}
    for row in flow.cost_data()["rows"]:
        if row.get("purpose") == "node":
            continue
        for key in out:
            out[key] += row.get(key) or 0
    return out


def _replica(flow, name: str, files_dir: str | None = None):
    """The flow as the exported cells will rebuild it, with the record applied."""
    from .._internal.version import __version__

    folder = flow.workspace.root if flow.files() else None
    workflow, settings = plan_parts(_plan(flow))
    replica = type(flow)(workflow, name=name, origin="replay", run_id=flow.run_id,
                         llm=flow.llm, store=flow.store, save=False, **settings)
    nodes: dict[str, dict] = {}
    budget = FigureBudget()   # one notebook's figures, over all its nodes
    for node_id in replica.workflow.order():   # parents first: a fingerprint reads their outputs
        original = flow.workflow.nodes[node_id]
        rec = _node_record(original, folder, budget)
        if original.status in (Status.DONE, Status.FAILED):
            apply_record(replica, node_id, rec)
            rec["fingerprint"] = fingerprint(replica, node_id)
        else:
            rec = {"status": Status.PENDING, "fingerprint": None}
        nodes[node_id] = rec
    record = {"format": RECORD_FORMAT, "flowmagic": __version__, "run": flow.run_id,
              "result": flow.result, "overhead": _overhead(flow), "nodes": nodes,
              "files_dir": files_dir, "files": flow.files()}
    if recorded_cells(flow.workflow):   # its code ran in a session: the prelude it ran first
        record["prelude"] = _prelude_of(flow)
    record = json.loads(json.dumps(record))   # as the record cell will read it back
    record["signature"] = record_signature(record)
    attach_record(replica, record)
    if settle(replica):
        replica.result = flow.result
    return replica, record


def _prelude_of(flow) -> str:
    """The prelude the flow's session ran (made again from its inputs when it did not run
    in this kernel)."""
    from ..engine.session import prelude

    ran = flow.session().prelude   # ("" until its interpreter started: nothing starts here)
    return ran or prelude(flow.workspace)


def _clean_url(url: str) -> str:
    """A URL without user:password@ or a query string (either can carry a key)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = host + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _endpoints() -> list[dict]:
    from ..llm.endpoints import endpoints

    out = []
    for ep in endpoints():
        out.append({"name": ep.name, "base_url": "embedded" if ep.local else _clean_url(ep.base_url),
                    "model": ep.model, "key_from": ep.key_env if ep.api_key else None})
    return out


def _config_source(flow, endpoints: list[dict]) -> str:
    """The configuration cell. Its comments name endpoints and models, which may come from
    a server found running (discovery): each is one `celltext.comment` line, so no value can
    end the comment and start a line of code."""
    from .._internal.version import __version__

    notes = [f"Exported by flowmagic {__version__} from run {flow.run_id}. Running the cells below",
             "replays every node from its record: no model call. A node whose cell you edit calls",
             "its model. Endpoints used (keys are never written here; they come from your "
             "environment):"]
    for ep in endpoints:
        if ep["base_url"] == "embedded":
            notes.append(f"  {ep['name']}: the embedded model {ep['model']} (nothing to configure)")
            continue
        key = f", key from ${ep['key_from']}" if ep["key_from"] else ""
        notes.append(f"  {ep['name']}: {ep['base_url']} model {ep['model'] or '(first listed)'}{key}")
        call = (f"flowmagic.configure(base_url={literal(ep['base_url'])}, model="
                + (literal(ep["model"]) if ep["model"] is not None else "None")
                + ("" if ep["name"] == "default" else f", name={literal(ep['name'])}") + ")")
        notes.append(f"  to use it: import flowmagic; {call}")
    return "\n".join(["%load_ext flowmagic",
                      "from flowmagic.ops.export import show_drawings, show_result",
                      *map(comment, notes)])


def _metadata(flow, record: dict, endpoints: list[dict], name: str) -> dict:
    from .._internal.version import __version__

    nodes = {}
    for node_id, node in flow.workflow.nodes.items():
        nodes[node_id] = {
            "agent": node.agent, "model": node.model, "status": node.status,
            "downgraded_from": node.downgraded_from,
            "models": [a.get("model") for a in node.attempts if a.get("model")],
            "seeds": [a.get("seed") for a in node.attempts if a.get("seed") is not None],
            "cache_keys": [a.get("cache_key") for a in node.attempts if a.get("cache_key")],
            "tokens_in": node.tokens_in, "tokens_out": node.tokens_out,
            "cost_usd": node.cost_usd, "start": node.start, "end": node.end,
            "duration_s": node.duration, "attempts": len(node.attempts),
            "fingerprint": (record["nodes"].get(node_id) or {}).get("fingerprint")}
    candidates = [{k: v for k, v in (c.to_dict() if hasattr(c, "to_dict") else dict(c)).items()
                   if k != "workflow"} for c in flow.candidates]
    meta = {"version": __version__, "name": name, "run": flow.run_id, "task": flow.task,
            "status": flow.status, "exported": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "settings": {k: setting_value(v) for k, v in flow.settings.items()},
            "endpoints": endpoints,
            "planning": {"chosen": getattr(flow, "chosen", 0), "candidates": candidates},
            "nodes": nodes, "cost": flow.cost_data()["total"], "timeline": flow.timeline_rows(),
            "update_log": flow.update_log, "result": flow.result}
    return json.loads(json.dumps(meta, default=str))   # plain JSON all the way down


def _node_line(flow, name: str, node_id: str) -> str:
    """The `%%flow_node` line: safe names only (`celltext.magic_word`), else one line why."""
    node = flow.workflow.nodes[node_id]
    return magic_line("flow_node", (name, "the flow's name"), (node_id, "the node id"), options={
        "--after": (",".join(flow.workflow.parents(node_id)), f"the parents of {node_id}"),
        "--agent": (node.agent, f"the agent of {node_id}"),
        "--model": (node.model, f"the model of {node_id}")})


def _code_span(text: str) -> str:
    """`text` as a Markdown code span, whatever backticks it holds (a file name can)."""
    fence = "`" * (max(map(len, re.findall("`+", text)), default=0) + 1)
    return f"{fence} {text} {fence}"


def _files_cell(record: dict):
    from .._internal.nbformat_import import v4

    files = record.get("files") or []
    where = record.get("files_dir")
    lines = [f"### Files of this run ({len(files)})", "",
             (f"Written next to this notebook, in `{where}/`:" if where else
              "In the run's workspace:")]
    lines += [f"- {_code_span(f)}" for f in files]
    return v4.new_markdown_cell(markdown_cell("\n".join(lines)))   # file names the code chose


_STARTER_WHOSE = ("Code of flowmagic's working start (from the input's own columns, not written "
                  "by the model)")


def _code_cell(replica, record: dict, node_id: str, ran: dict, line: str):
    """A `%%flow_code` cell with the recorded run's outputs (what it printed and drew)."""
    from .._internal.nbformat_import import v4

    figures = record["nodes"][node_id].get("figures_png") or {}
    outputs = []
    for item in code_outputs(replica.run_id, node_id, ran, figures):
        if item[0] == "stream":
            outputs.append(v4.new_output("stream", name=item[1], text=item[2]))
        else:
            outputs.append(v4.new_output("display_data", data=item[1], metadata=item[2]))
    return v4.new_code_cell(f"{line}\n{ran['code'].rstrip()}", outputs=outputs,
                            metadata={"flowmagic": {"node": node_id, "code": True}})


def _earlier_runs(node) -> list[dict]:
    """The runs of a node's code the session kept before its own (the working start's, an
    answer's sent back after its code ran well), in their order."""
    own = code_run(node) or {}
    return [c for c in kept_cells([(node.id, node.execution, node.attempts)])
            if c.get("seq") != own.get("seq")]


def _code_cells(replica, record: dict, name: str, node_id: str) -> list:
    """A note and a code cell for the node's code run (the cell that settles the node)."""
    from .._internal.nbformat_import import v4

    node = replica.workflow.nodes[node_id]
    failed = f"\n\n**failed**: {node.error}" if node.status == Status.FAILED else ""
    ran = code_run(node)
    whose = _STARTER_WHOSE if ran.get("starter") else "Code written by the model"
    return [v4.new_markdown_cell(markdown_cell(
        f"{_head(node)}{failed}\n\n*{whose}: the cell below shows its recorded run; it runs "
        "again only in the sandbox (`--execute`).*")),
        _code_cell(replica, record, node_id, ran, code_line(replica, name, node_id))]


def _earlier_cells(replica, record: dict, name: str, node_id: str, ran: dict) -> list:
    """A note and a code cell for an earlier run of the node's code that the session kept."""
    from .._internal.nbformat_import import v4

    node = replica.workflow.nodes[node_id]
    if ran.get("starter"):
        note = (f"*{_STARTER_WHOSE}, run before the model's own code: the cell below shows "
                "its recorded run; it runs again only in the sandbox (`--execute`).*")
        line = f"{code_line(replica, name, node_id)} --start"
    else:
        note = ("*An earlier answer's code, which ran well and stayed in the session (the "
                "answer itself was sent back): the cell below shows its recorded run.*")
        line = f"{code_line(replica, name, node_id)} --seq {int(ran['seq'])}"
    return [v4.new_markdown_cell(markdown_cell(f"{_head(node)}\n\n{note}")),
            _code_cell(replica, record, node_id, ran, line)]


def _head(node) -> str:
    return f"**{node.id}** · {node.agent}: {node.requirement.strip()}"


def _prelude_cell(name: str, prelude: str):
    from .._internal.nbformat_import import v4

    line = magic_line("flow_code", (name, "the flow's name")) + " --prelude"
    return v4.new_code_cell(f"{line}\n{prelude.rstrip()}",
                            metadata={"flowmagic": {"prelude": True}})


def _cell_order(replica) -> list[tuple]:
    """("node", id, None) and ("run", id, run) items, parents first, the code cells in the order
    the flow's session ran them (a text node as early as the code below it needs)."""
    import networkx as nx

    wf = replica.workflow
    topo = {n: i for i, n in enumerate(wf.order())}
    graph, seq, runs = nx.DiGraph(), {}, {}
    for node_id in wf.order():
        node = wf.nodes[node_id]
        own = ("node", node_id)
        graph.add_node(own)
        if is_code_node(node):
            seq[own] = (code_run(node) or {}).get("seq")
            for i, ran in enumerate(_earlier_runs(node)):
                item = ("run", node_id, i)
                graph.add_edge(item, own)
                seq[item], runs[item] = ran.get("seq"), ran
        for parent in wf.parents(node_id):
            graph.add_edges_from((("node", parent), item) for item in list(graph.nodes)
                                 if item[1] == node_id)
    inf = float("inf")
    first = {item: (seq.get(item) if isinstance(seq.get(item), int) else inf) for item in graph}
    for item in reversed(list(nx.topological_sort(graph))):   # what the code below it needs
        below = [first[d] for d in graph.successors(item)]
        if item not in seq:
            first[item] = min(below, default=inf)

    def key(item):
        return (first[item], topo[item[1]], item[0] == "node", item[2] if item[0] == "run" else 0)

    return [(item[0], item[1], runs.get(item))
            for item in nx.lexicographical_topological_sort(graph, key=key)]


def build(flow, *, name: str | None = None, files_dir: str | None = None):
    """The notebook (an nbformat NotebookNode) that replays `flow`; see the module docstring."""
    from .._internal.nbformat_import import v4

    if getattr(flow, "busy", False) or getattr(flow, "running", False):
        raise NodeError(f"flow {flow.name!r} is running; wait for it (or stop it) before exporting")
    name = _identifier(name or flow.name)
    replica, record = _replica(flow, name, files_dir)
    endpoints = _endpoints()

    def out(bundle):
        data, meta = bundle
        return v4.new_output("display_data", data=data, metadata=meta)

    cells = [
        # the task quotes an input's columns (a {{df}} task), which may come from anywhere
        v4.new_markdown_cell(markdown_cell(f"# {name}\n\n{flow.task}")),
        v4.new_code_cell(_config_source(flow, endpoints)),
        v4.new_code_cell(f"%%flow_plan {name}\n" + plan_json(_plan(flow)),
                         outputs=[v4.new_output("stream", name="stdout",
                                                text=plan_summary(replica) + "\n")]),
        v4.new_code_cell(f"%%flow_record {name}\n" + json.dumps(record, indent=1, ensure_ascii=False),
                         metadata={"jupyter": {"source_hidden": True}, "tags": ["flowmagic-record"]}),
    ]
    if record.get("files"):
        cells.append(_files_cell(record))
    if record.get("prelude") is not None:   # the flow's code ran in a session: its first cell
        cells.append(_prelude_cell(name, record["prelude"]))
    for item in _cell_order(replica):
        node_id = item[1]
        if item[0] == "run":
            cells += _earlier_cells(replica, record, name, node_id, item[2])
            continue
        if is_code_node(replica.workflow.nodes[node_id]):
            cells += _code_cells(replica, record, name, node_id)
            continue
        cells.append(v4.new_code_cell(
            f"{_node_line(replica, name, node_id)}\n{replica.workflow.nodes[node_id].requirement}",
            metadata={"flowmagic": {"node": node_id}},
            outputs=[out(node_bundle(replica, node_id, replayed=True))]))
    cells.append(v4.new_code_cell(f"show_result({name})", outputs=[out(result_bundle(replica))]))
    cells.append(v4.new_code_cell(f"show_drawings({name})", metadata={"tags": [NBVAL_IGNORE]},
                                  outputs=[out(b) for b in drawing_bundles(replica)]))
    count = 0
    for cell in cells:   # numbered as one run top to bottom would number them
        if cell.cell_type == "code":
            count += 1
            cell.execution_count = count
    nb = v4.new_notebook(cells=cells)
    nb.metadata.update({"kernelspec": dict(_KERNELSPEC), "language_info": {"name": "python"},
                        "flowmagic": _metadata(flow, record, endpoints, name)})
    return nb


def export(flow, path: str | Path, *, name: str | None = None) -> Path:
    """Write the notebook that replays `flow` to `path` (folders made as needed)."""
    from .._internal.nbformat_import import nbformat

    path = Path(path)
    if path.suffix != ".ipynb":
        raise ConfigError(f"{path} should end in .ipynb")
    files_dir = files_dir_for(path) if flow.files() else None
    nb = build(flow, name=name, files_dir=files_dir)
    nbformat.validate(nb)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, str(path))
        if files_dir:   # the run's files next to the notebook: what its code cells read and wrote
            flow.workspace.copy_to(path.parent / files_dir)
    except OSError as exc:
        raise write_error(path, exc) from None
    return path


# ----------------------------------------------------------------------------- the cache
def save_cache(path: str | Path, *, since_id: int = 0, store=None) -> int:
    """Write the cached answers of the calls logged after `since_id` as JSON; returns how many."""
    from ..store import get_store

    store = store or get_store()
    keys = sorted({row["cache_key"] for row in store.recent_calls(10**9)
                   if row["id"] > since_id and row["cache_key"] and not row["error"]})
    entries = {k: store.cache_get(k) for k in keys}
    entries = {k: v for k, v in entries.items() if v is not None}
    Path(path).write_text(json.dumps(entries, indent=1, sort_keys=True, ensure_ascii=False) + "\n",
                          encoding="utf-8")
    return len(entries)


def load_cache(path: str | Path, *, store=None) -> int:
    """Add the answers in a `save_cache` file to the cache; returns how many were new."""
    from ..store import get_store

    store = store or get_store()
    try:
        entries = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the cache file {path} ({exc})") from None
    added = 0
    for key, payload in entries.items():
        if store.cache_get(key) is None:
            store.cache_put(key, payload)
            added += 1
    return added
