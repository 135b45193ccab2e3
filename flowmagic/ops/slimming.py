"""Slimming: which nodes matter, and a cheaper workflow that scores within tau of the baseline.

Importance of every active node fuses four ranks by weighted reciprocal rank fusion,
RRF(v) = sum_m w_m / (kappa + rank_m(v)) with kappa = max(10, |V|):
degree and betweenness centrality (networkx, on the active graph); leave-one-out, the
score drop on the probe set when the node alone is pruned (or downgraded, in the
downgrade stage); and cost, the saving that step brings. As in AgentSlimming's Eq. 6, rank
1 is the least important (low centrality, a small score drop, a large saving) and the node
with the largest RRF is tried first; since 1/(kappa + r) is convex, ranking the other way
round and trying the smallest RRF first is not the same order (a node ranked last on one
metric and first on another beats one ranked in the middle on both). Ties share the
smallest rank, and a node that cannot be pruned (a sink: it produces the final result) or
downgraded (no cheaper model) counts as most important on the measured metrics.

`aslim` is greedy, like AgentSlimming, but without its failures: stage 1 tries the
`top_k` least important nodes in order and keeps the first prune whose score stays at
or above tau times the stage's baseline (and is not dearer), then ranks again, until no
prune is kept; stage 2 does the same with model downgrades (a kept downgrade must be
strictly cheaper). As in AgentSlimming, each stage's baseline is the score it starts from:
the original score for pruning, the score after pruning for downgrading. Every
configuration is evaluated once (memoised), its inputs concurrently. A baseline score of
0 is an error, never a silent "accept all".

Around the paper: `accept=` gives a separate probe split (or the fraction of the probe
set held out) on which steps are accepted, so the examples that ranked a node do not also
judge it; `budget_usd=` (mean USD per example) makes the result the best-scoring
configuration seen whose cost is within the budget; the report gives what the
optimisation itself spent and after how many runs the saving pays it back.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import networkx as nx

from .._internal.aio import gather_all
from .batch import Evaluation, Probe, evaluate, fresh_copy, probe_set, sinks
from ..llm.endpoints import resolve
from ..errors import ConfigError, FlowError, NodeError
from ..model.graph import Workflow
from ..view.pareto import pareto_front, pareto_svg
from ..view.safe import text_html
from ..model.status import Status

# "Flow" in annotations is flowmagic.flow.Flow: the layer above, which hands itself in.

__all__ = ["WEIGHTS", "METRICS", "Importance", "SlimReport", "rank", "fuse", "kappa_for",
           "without", "with_model", "cheaper_for", "aimportance", "aslim", "resolve_probe",
           "pareto_front", "pareto_svg"]   # the last two live in flowmagic.view.pareto

WEIGHTS = {"degree": 1.0, "betweenness": 1.0, "loo": 2.0, "cost": 1.0}
METRICS = tuple(WEIGHTS)
STAGES = ("prune", "downgrade")


# -- ranks and fusion (pure) -----------------------------------------------------------------
def rank(values: dict[str, float | None]) -> dict[str, int]:
    """Rank by importance, 1 = least important: 1 + how many nodes have a strictly smaller
    value (None, a node that cannot take the step, counts as the largest)."""
    key = {v: math.inf if x is None else round(float(x), 12) for v, x in values.items()}
    return {v: 1 + sum(1 for u in key if key[u] < key[v]) for v in key}


def kappa_for(n_nodes: int) -> int:
    return max(10, int(n_nodes))


def _weights(weights: dict | None) -> dict[str, float]:
    unknown = sorted(set(weights or {}) - set(METRICS))
    if unknown:
        raise ConfigError(f"unknown importance weight(s) {', '.join(unknown)}; known: {', '.join(METRICS)}")
    merged = {**WEIGHTS, **{k: float(v) for k, v in (weights or {}).items()}}
    if any(w < 0 or math.isnan(w) for w in merged.values()) or not any(merged.values()):
        raise ConfigError("importance weights must be >= 0 and not all 0")
    return merged


def fuse(ranks: dict[str, dict[str, int]], weights: dict | None = None,
         n_nodes: int | None = None) -> dict[str, float]:
    """Weighted reciprocal rank fusion of per-metric ranks (1 = least important); larger
    means less important: the node to try first."""
    weights = _weights(weights)
    nodes = sorted({v for r in ranks.values() for v in r})
    kappa = kappa_for(n_nodes if n_nodes is not None else len(nodes))
    return {v: sum(w / (kappa + ranks[m][v]) for m, w in weights.items() if w and m in ranks)
            for v in nodes}


# -- configurations ------------------------------------------------------------------------------
def without(workflow: Workflow, node_id: str) -> Workflow:
    """A copy with `node_id` pruned by the same surgery as Flow.prune (predecessors -> successors)."""
    workflow.node(node_id)
    if node_id in sinks(workflow):
        raise NodeError(f"node {node_id!r} produces the final result; it is never pruned")
    out = workflow.copy()
    out.prune(node_id)
    return out


def with_model(workflow: Workflow, node_id: str, model: str, default: str | None = None) -> Workflow:
    """A copy whose node `node_id` runs on `model`; it remembers the model it had."""
    out = workflow.copy()
    node = out.node(node_id)
    node.downgraded_from = node.downgraded_from or node.model or default or "default"
    node.model = model
    return out


def cheaper_for(model: str | None, cheaper: dict[str, str]) -> str | None:
    """The cheaper model for `model` in the map (by id as written, model name or endpoint)."""
    if not cheaper:
        return None
    if model in cheaper:
        return cheaper[model]
    endpoint, name = resolve(model)
    for key in (name, f"{endpoint.name}:{name}", endpoint.name):
        if key and key in cheaper and resolve(cheaper[key]) != (endpoint, name):
            return cheaper[key]
    return None


def _check_cheaper(cheaper: dict | None) -> dict[str, str]:
    cheaper = dict(cheaper or {})
    for src, dst in cheaper.items():
        if not isinstance(src, str) or not isinstance(dst, str) or not dst:
            raise ConfigError("cheaper maps model ids to model ids, e.g. {'big': 'small'}")
        resolve(dst)   # a malformed endpoint is a ConfigError now, not mid-run
    return cheaper


def _key(wf: Workflow) -> tuple:
    return (tuple((i, n.status == Status.PRUNED, n.model or "") for i, n in wf.nodes.items()),
            tuple(sorted(wf.graph.edges)))


def _describe(original: Workflow, wf: Workflow) -> dict:
    pruned = [i for i, n in wf.nodes.items()
              if n.status == Status.PRUNED and original.nodes[i].status != Status.PRUNED]
    models = {i: n.model for i, n in wf.nodes.items()
              if n.status != Status.PRUNED and n.model != original.nodes[i].model}
    parts = [f"-{i}" for i in pruned] + [f"{i}→{m}" for i, m in models.items()]
    return {"label": " ".join(parts) or "baseline", "pruned": pruned, "models": models}


class _Session:
    """Memoised evaluations of configurations of one flow on one probe set."""

    def __init__(self, flow: "Flow", probe: Probe, concurrency: int | None,
                 progress: Callable[[dict], None] | None):
        self.flow, self.probe, self.progress = flow, probe, progress
        self.original = fresh_copy(flow.workflow)
        self.limit = asyncio.Semaphore(int(concurrency) if concurrency else 1_000_000)
        self.points: list[dict] = []
        self.configs: dict[str, Workflow] = {}   # label -> configuration, for "best under budget"
        self.spent_usd = 0.0                     # what the evaluations really paid
        self._memo: dict[tuple, asyncio.Task] = {}

    def tell(self, event: dict) -> None:
        if self.progress is not None:
            self.progress(event)

    async def evaluate(self, wf: Workflow) -> Evaluation:
        key = _key(wf)
        if key not in self._memo:
            self._memo[key] = asyncio.ensure_future(self._run(wf))
        return await self._memo[key]

    async def _run(self, wf: Workflow) -> Evaluation:
        ev = await evaluate(self.flow, wf, self.probe, limit=self.limit)
        point = {**_describe(self.original, wf), "score": ev.score, "cost_usd": ev.cost_usd,
                 "failures": ev.failures}
        self.spent_usd += sum(item.paid_usd for item in ev.batch)
        self.configs[point["label"]] = wf
        self.points.append(point)
        self.tell({"phase": "evaluated", **point})
        return ev


# -- importance -----------------------------------------------------------------------------------
@dataclass
class Importance:
    """One row per active node, most important (smallest RRF) first; `least_important()`
    gives the try order (largest RRF first)."""
    stage: str
    rows: list[dict]
    baseline: Evaluation
    weights: dict[str, float]
    kappa: int

    def least_important(self) -> list[str]:
        cands = [r for r in self.rows if r["candidate"]]
        return [r["node"] for r in sorted(cands, key=lambda r: (-r["rrf"], r["position"]))]

    def to_rows(self) -> list[dict]:
        return [dict(r) for r in self.rows]

    def text(self) -> str:
        head = f"{'node':<16}{'deg':>6}{'betw':>6}{'loo':>8}{'saved $':>11}{'rrf':>8}  note"
        lines = [f"importance ({self.stage}; baseline S={self.baseline.score:.3f}, "
                 f"C=${self.baseline.cost_usd:.6f}/example, kappa={self.kappa})", head]
        for r in self.rows:
            loo = "-" if r["loo"] is None else f"{r['loo']:.3f}"
            saved = "-" if r["saved_usd"] is None else f"{r['saved_usd']:.6f}"
            lines.append(f"{r['node']:<16}{r['degree']:>6.2f}{r['betweenness']:>6.2f}{loo:>8}"
                         f"{saved:>11}{r['rrf']:>8.4f}  {r['protected'] or ''}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.text()


def _trial(wf: Workflow, stage: str, node_id: str, cheaper: dict, default: str | None):
    """(configuration, new model) for one step on `node_id`, or None when it cannot be taken."""
    if stage == "prune":
        return None if node_id in sinks(wf) else (without(wf, node_id), None)
    node = wf.nodes[node_id]
    target = cheaper_for(node.model or default, cheaper)
    return None if target is None else (with_model(wf, node_id, target, default), target)


async def _importance(session: _Session, wf: Workflow, stage: str, cheaper: dict,
                      weights: dict) -> Importance:
    base = await session.evaluate(wf)
    g = wf.active()
    nodes = list(g.nodes)
    degree = nx.degree_centrality(g) if len(nodes) > 1 else {v: 0.0 for v in nodes}
    between = nx.betweenness_centrality(g)
    default = session.flow.settings.model
    trials = {v: t for v in nodes if (t := _trial(wf, stage, v, cheaper, default)) is not None}
    evs = await gather_all([session.evaluate(t[0]) for t in trials.values()])
    loo: dict[str, float | None] = dict.fromkeys(nodes)
    saved: dict[str, float | None] = dict.fromkeys(nodes)
    for v, ev in zip(trials, evs):
        loo[v], saved[v] = base.score - ev.score, base.cost_usd - ev.cost_usd
    ranks = {"degree": rank(degree), "betweenness": rank(between), "loo": rank(loo),
             "cost": rank({v: None if s is None else -s for v, s in saved.items()})}
    rrf = fuse(ranks, weights, len(nodes))
    why = "produces the final result" if stage == "prune" else "no cheaper model"
    rows = [{"node": v, "position": i, "agent": wf.nodes[v].agent, "model": wf.nodes[v].model,
             "to_model": trials[v][1] if v in trials else None, "degree": degree[v],
             "betweenness": between[v], "loo": loo[v], "saved_usd": saved[v],
             "cost_usd": base.node_cost.get(v, 0.0), "rrf": rrf[v],
             **{f"rank_{m}": ranks[m][v] for m in METRICS},
             "candidate": v in trials, "protected": None if v in trials else why}
            for i, v in enumerate(nodes)]
    rows.sort(key=lambda r: (r["rrf"], r["position"]))
    return Importance(stage, rows, base, weights, kappa_for(len(nodes)))


def resolve_probe(flow: "Flow", probe: Any = None, scorer: Any = None) -> Probe:
    """The probe set to use: given, built from examples and a scorer, or the attached one."""
    attached = getattr(flow, "probe", None)
    if isinstance(probe, Probe):
        return probe if scorer is None else Probe(probe.examples, scorer, probe.seed, probe.indices)
    if probe is None:
        if attached is None:
            raise ConfigError("no probe set: pass examples and a scorer, or call "
                              "flow.attach_probe(examples, scorer) first")
        return attached if scorer is None else Probe(attached.examples, scorer, attached.seed,
                                                     attached.indices)
    scorer = scorer if scorer is not None else getattr(attached, "scorer", None)
    if scorer is None:
        raise ConfigError("a probe set needs a scorer: 'exact', 'contains', 'judge' or a "
                          "function (result, example) -> float")
    return probe_set(probe, scorer)


async def aimportance(flow: "Flow", probe: Probe, *, stage: str = "prune",
                      cheaper: dict | None = None, weights: dict | None = None,
                      concurrency: int | None = 4,
                      progress: Callable[[dict], None] | None = None) -> Importance:
    """The importance table of the flow's workflow on `probe` (see the module docstring)."""
    if stage not in STAGES:
        raise ConfigError(f"stage {stage!r} must be 'prune' or 'downgrade'")
    cheaper = _check_cheaper(cheaper)
    if stage == "downgrade" and not cheaper:
        raise ConfigError("the downgrade stage needs cheaper={'big-model': 'small-model', ...}")
    session = _Session(flow, probe, concurrency, progress)
    return await _importance(session, session.original, stage, cheaper, _weights(weights))


# -- slimming ------------------------------------------------------------------------------------------
@dataclass
class SlimReport:
    """Every step tried (kept or rolled back) with S and C before and after, and every point."""
    baseline: dict
    final: dict
    steps: list[dict] = field(default_factory=list)
    points: list[dict] = field(default_factory=list)
    settings: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    optimisation: dict = field(default_factory=dict)   # cost_usd, saving_usd, break_even_runs

    def pareto(self) -> list[dict]:
        return [self.points[i] for i in pareto_front(self.points)]

    def svg(self) -> str:
        return pareto_svg(self.points, final=self.final.get("label"))

    def to_dict(self) -> dict:
        return {"baseline": self.baseline, "final": self.final, "steps": self.steps,
                "points": self.points, "pareto": self.pareto(), "settings": self.settings,
                "notes": self.notes, "optimisation": self.optimisation}

    def text(self) -> str:
        b, f = self.baseline, self.final
        lines = [f"baseline S={b['score']:.3f} C=${b['cost_usd']:.6f} -> final [{f['label']}] "
                 f"S={f['score']:.3f} C=${f['cost_usd']:.6f} "
                 f"({len(self.steps)} steps tried, {len(self.points)} configurations)"]
        for s in self.steps:
            what = s["node"] if s["action"] == "prune" else f"{s['node']} {s['from_model']}→{s['to_model']}"
            lines.append(f"  {s['action']:<9} {what:<28} S {s['score_before']:.3f}→{s['score_after']:.3f}"
                         f"  C ${s['cost_before']:.6f}→${s['cost_after']:.6f}  "
                         f"{'kept' if s['accepted'] else 'rolled back'}: {s['reason']}")
        o = self.optimisation
        if o:
            runs = o["break_even_runs"]
            lines.append(f"  optimisation cost ${o['cost_usd']:.6f}; saving ${o['saving_usd']:.6f} "
                         "per run: " + (f"pays back after {runs} run(s)" if runs is not None
                                        else "never pays back (no saving)"))
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.text()

    def _repr_mimebundle_(self, include=None, exclude=None):
        body = f"<pre>{text_html(self.text())}</pre>{self.svg()}"
        return {"text/plain": self.text(), "text/html": body}


def _check_slim(tau_prune: float, tau_downgrade: float, top_k: int) -> None:
    for name, tau in (("tau_prune", tau_prune), ("tau_downgrade", tau_downgrade)):
        if not 0 < float(tau) <= 1:
            raise ConfigError(f"{name} must be in (0, 1], e.g. 0.95")
    if int(top_k) < 1:
        raise ConfigError("top_k must be at least 1")


def _step(stage: str, round_no: int, row: dict, before: Evaluation, after: Evaluation,
          threshold: float, baseline: float) -> dict:
    # A downgrade that saves nothing is no step at all; a prune may tie on cost ($0 models).
    dearer = (after.cost_usd >= before.cost_usd if stage == "downgrade"
              else after.cost_usd > before.cost_usd + 1e-15)
    if after.score < threshold - 1e-12:
        accepted, reason = False, f"score {after.score:.3f} < tau x stage baseline = {threshold:.3f}"
    elif dearer:
        accepted, reason = False, f"not cheaper (${after.cost_usd:.6f} vs ${before.cost_usd:.6f})"
    else:
        accepted, reason = True, f"score {after.score:.3f} >= tau x stage baseline = {threshold:.3f}"
    return {"stage": stage, "round": round_no, "action": stage, "node": row["node"],
            "from_model": row["model"], "to_model": row["to_model"], "rrf": row["rrf"],
            "score_before": before.score, "cost_before": before.cost_usd,
            "score_after": after.score, "cost_after": after.cost_usd, "threshold": threshold,
            "baseline": baseline, "accepted": accepted, "reason": reason}


async def _stage(session: _Session, judge: _Session, report: SlimReport, wf: Workflow,
                 current: Evaluation, stage: str, tau: float, baseline: float, top_k: int,
                 cheaper: dict, weights: dict) -> tuple[Workflow, Evaluation]:
    """Rank on `session`'s probe split, accept on `judge`'s (the same session when no
    separate split was given)."""
    default = session.flow.settings.model
    round_no = 0
    # Ends: a kept prune removes a node, a kept downgrade strictly lowers the cost.
    while True:
        round_no += 1
        table = await _importance(session, wf, stage, cheaper, weights)
        rows = {r["node"]: r for r in table.rows}
        tried = table.least_important()[:top_k]
        if not tried:
            report.notes.append(f"{stage}: no node left to try")
            return wf, current
        for node_id in tried:
            trial, _ = _trial(wf, stage, node_id, cheaper, default)
            after = await judge.evaluate(trial)   # memoised: ranked above already when one split
            step = _step(stage, round_no, rows[node_id], current, after, tau * baseline, baseline)
            report.steps.append(step)
            session.tell({"phase": "step", **step})
            if step["accepted"]:
                wf, current = trial, after
                break
        else:
            return wf, current


def _split(probe: Probe, accept: Any) -> tuple[Probe, Probe | None]:
    """(ranking split, acceptance split or None) from `accept`: a Probe, a fraction of the
    probe set to hold out for acceptance, or None (one set does both)."""
    if accept is None:
        return probe, None
    if isinstance(accept, Probe):
        return probe, accept
    if isinstance(accept, float) and 0 < accept < 1:
        n = round(len(probe) * accept)
        if not 0 < n < len(probe):
            raise ConfigError(f"accept={accept} leaves no example on one side of a probe set of "
                              f"{len(probe)}; use more examples or another fraction")
        head, tail = len(probe) - n, n
        return (Probe(probe.examples[:head], probe.scorer, probe.seed, probe.indices[:head]),
                Probe(probe.examples[-tail:], probe.scorer, probe.seed, probe.indices[-tail:]))
    raise ConfigError("accept must be a probe set (flowmagic.batch.probe_set) or the fraction "
                      "of the probe set to hold out for acceptance, e.g. 0.5")


def _under_budget(judge: _Session, report: SlimReport, wf: Workflow, current: Evaluation,
                  budget: float | None) -> Workflow:
    """The greedy result when it is within `budget`, else the best-scoring configuration
    judged within it (cheaper on ties); the original result with a note when none is."""
    if budget is None or current.cost_usd <= budget + 1e-15:
        return wf
    fits = [p for p in judge.points if p["cost_usd"] <= budget + 1e-15]
    if not fits:
        report.notes.append(f"no configuration tried costs at most ${budget:.6f} per run "
                            f"(the cheapest: ${min(p['cost_usd'] for p in judge.points):.6f}); "
                            "kept the greedy result")
        return wf
    best = max(fits, key=lambda p: (p["score"], -p["cost_usd"]))
    report.notes.append(f"budget ${budget:.6f} per run: the greedy result costs "
                        f"${current.cost_usd:.6f}; chose the best configuration under budget "
                        f"[{best['label']}] (S={best['score']:.3f})")
    return judge.configs[best["label"]]


async def aslim(flow: "Flow", probe: Probe, *, cheaper: dict | None = None,
                tau_prune: float = 0.95, tau_downgrade: float = 0.95, top_k: int = 3,
                weights: dict | None = None, concurrency: int | None = 4,
                accept: Any = None, budget_usd: float | None = None,
                progress: Callable[[dict], None] | None = None) -> tuple["Flow", SlimReport]:
    """A slimmed copy of `flow` (the original is untouched) and the report of how it was found.

    `accept`: a separate probe split for accepting steps (a Probe, or the fraction of
    `probe` held out); `budget_usd`: mean USD per run the result must not exceed (the best
    configuration under it is chosen).
    """
    _check_slim(tau_prune, tau_downgrade, top_k)
    if budget_usd is not None and not float(budget_usd) >= 0:
        raise ConfigError("budget_usd must be a number >= 0 (mean USD per run)")
    cheaper, weights = _check_cheaper(cheaper), _weights(weights)
    ranking, held_out = _split(probe, accept)
    session = _Session(flow, ranking, concurrency, progress)
    judge = session if held_out is None else _Session(flow, held_out, concurrency, progress)
    wf = session.original
    base = await judge.evaluate(wf)
    if base.score <= 0:
        raise FlowError(f"the baseline scores {base.score:g} on the {len(judge.probe)} probe examples "
                        f"({base.failures} runs failed), so no step can be judged; check the scorer "
                        "and the expected answers, or the endpoint")
    report = SlimReport(baseline={"label": "baseline", **base.summary()}, final={},
                        settings={"tau_prune": tau_prune, "tau_downgrade": tau_downgrade,
                                  "top_k": top_k, "weights": weights, "cheaper": cheaper,
                                  "probe_size": len(probe), "probe_seed": probe.seed,
                                  "rank_size": len(ranking), "accept_size": len(judge.probe),
                                  "budget_usd": budget_usd})
    current = base
    for stage, tau in (("prune", tau_prune), ("downgrade", tau_downgrade)):
        if stage == "downgrade" and not cheaper:
            report.notes.append("no cheaper={...} map given: the downgrade stage was skipped")
            continue
        # AgentSlimming: a stage is judged against the score it starts from.
        wf, current = await _stage(session, judge, report, wf, current, stage, float(tau),
                                   current.score, int(top_k), cheaper, weights)
    wf = _under_budget(judge, report, wf, current, budget_usd)
    current = await judge.evaluate(wf)
    sessions = [session] if judge is session else [session, judge]
    unpriced = sorted({m for sess in sessions for p in sess._memo.values()
                       if p.done() and not p.exception() for m in p.result().unpriced})
    if unpriced:
        report.notes.append(f"no price for {', '.join(unpriced)}: counted as $0; "
                            "add prices with flowmagic.configure(prices={...})")
    report.final = {**_describe(session.original, wf), **current.summary()}
    report.points = list(judge.points)
    saving = base.cost_usd - current.cost_usd
    spent = sum(sess.spent_usd for sess in sessions)
    report.optimisation = {"cost_usd": spent, "saving_usd": saving,
                           "break_even_runs": math.ceil(spent / saving - 1e-9) if saving > 1e-15 else None}
    slim = flow.derive(fresh_copy(wf), name=f"{flow.name}-slim")
    slim.probe = probe
    session.tell({"phase": "done", "final": report.final})
    return slim, report
