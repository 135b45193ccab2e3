"""Choosing among candidate plans: scores, the rule, and one line why each won or lost.

Flow's P_avg and C_dependency are reported as the paper defines them, but not ranked by:
P_avg is 1/depth, so a one-node or dependency-free plan would always win. RULE, in order:
coverage (a connected plan with one final, integrating subtask beats a connected plan with
several loose ends, which beats one subtask or unconnected subtasks for a multi-step task);
the share of subtasks on topic (plan_checks.topic_share: a plan that drifts off the task
covers less of it);
the speed-up |V|/T (width-aware parallelism); for a multi-step task, at least three
subtasks (a chain without its last step is as fast, and would otherwise win the next
test); Theorem 1's expected successes per subtask at p = 0.1 (fewer dependencies, so
Flow's Workflow 2 beats Workflow 1); fewer edges; fewer nodes; the earlier candidate. Works on planner and updater candidates alike (anything with
index, ok, workflow, scores and, optionally, note).
"""

from __future__ import annotations

from collections import Counter

from ..model import metrics
from ..errors import PlanError
from ..model.graph import Workflow
from ..model.plan_checks import topic_share

__all__ = ["RULE", "FAILURE_P", "TIE", "BaseCandidate", "score", "coverage", "multi_step",
           "select", "candidate_line", "failure_summary"]

class BaseCandidate:
    """What a planner's and an updater's candidate share (each is a dataclass with at least
    `workflow` and `error`): usable or not, and their dict form, stored with the run."""

    @property
    def ok(self) -> bool:
        return self.error is None and self.workflow is not None

    def to_dict(self) -> dict:
        """Every field in order (dicts and lists copied), the workflow last, as a dict."""
        d = {k: _copied(getattr(self, k)) for k in self.__dataclass_fields__ if k != "workflow"}
        d["workflow"] = self.workflow.to_dict() if self.workflow is not None else None
        return d

    @classmethod
    def from_dict(cls, d: dict):
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        wf = known.pop("workflow", None)
        cand = cls(**known)
        cand.workflow = Workflow.from_dict(wf) if wf is not None else None
        return cand


def _copied(value):
    return dict(value) if isinstance(value, dict) else list(value) if isinstance(value, list) else value


TIE = 1e-9
FAILURE_P = 0.1
FULL = 3   # subtasks: fewer cover less of a multi-step task
RULE = ("coverage (connected, one final subtask), then the share of subtasks on topic, then "
        f"speed-up |V|/T, then at least {FULL} subtasks for a multi-step task, then Theorem 1's "
        f"expected successes per subtask at p={FAILURE_P}, then fewer edges, fewer nodes")
# Why a candidate failed, by error class, for PlanError's one-line summary.
_WHY = {"TruncatedError": "the answer was cut off by the token limit",
        "ModelOutputError": "the model did not answer with JSON",
        "PlanError": "the plan had no usable subtasks",
        "OffTopicError": "the plan copied the prompt's example or was not about the task",
        "TimeoutError": "no plan came within the time limit",
        "EndpointError": "the endpoint failed"}


def score(wf: Workflow, task: str = "") -> dict:
    """The numbers `select` and the UI use, from metrics over the active nodes."""
    scores = metrics.shape(wf, FAILURE_P)
    scores["topic_share"] = topic_share([n.requirement for n in wf.nodes.values()],
                                        task or wf.task or "")
    scores["coverage"] = coverage(scores, multi_step(task or wf.task or ""))[0]
    if any(n.estimate_s is not None for n in wf.nodes.values()):
        scores["critical_path_s"] = metrics.critical_path(wf, "duration")[1]
    return scores


def failure_summary(candidates: list) -> str:
    """One line: how many candidates failed for which reason, with a first example."""
    kinds: Counter = Counter()
    first: dict[str, str] = {}
    for c in candidates:
        kind, _, message = (c.error or "ModelOutputError: no plan").partition(": ")
        why = _WHY.get(kind, "the plan could not be used")
        kinds[why] += 1
        first.setdefault(why, message[:120])
    parts = [f"{why} ({first[why]})" if n == 1 else f"{n} x {why} (e.g. {first[why]})"
             for why, n in kinds.items()]
    return "; ".join(parts)


_CUES = (",", ";", " and ", " then ", " after ", " before ", ":", "\n")


def multi_step(task: str) -> bool:
    """Whether a task reads as several steps (a list, "and", "then", more than a line's
    worth of words, or "How to ...", which asks for a procedure): for such a task a
    one-subtask plan does not cover it."""
    text = f" {' '.join(task.lower().split())} "
    return (len(text.split()) > 8 or text.startswith(" how to ")
            or any(cue in text for cue in _CUES))


def coverage(scores: dict, several_steps: bool = True) -> tuple[int, str]:
    """(tier, why): 2 connected with one final subtask, 1 connected with several final
    subtasks, 0 one subtask (for a multi-step task) or unconnected subtasks."""
    n, edges, sinks = scores["nodes"], scores["edges"], scores["sinks"]
    if n <= 1:
        return (0, "one subtask for a multi-step task") if several_steps else (2, "one subtask")
    if not scores["connected"]:
        return 0, ("no dependencies (flat)" if edges == 0 else "unconnected pieces")
    if sinks > 1:
        return 1, f"connected but {sinks} final subtasks (no integrating last step)"
    return 2, "connected, one final subtask"


def _scores_of(c, task: str) -> dict:
    scores = c.scores
    if "speedup" not in scores or "sinks" not in scores:   # scored elsewhere (e.g. the updater)
        scores = {**score(c.workflow, task), **scores}
    return scores


def _rank(c, scores: dict, several: bool) -> tuple:
    return (-coverage(scores, several)[0], -round(scores.get("topic_share", 1.0), 9),
            -round(scores["speedup"], 9), -_size(scores, several),
            -round(scores["success_share"], 9), scores["edges"], scores["nodes"], c.index)


def _size(scores: dict, several: bool) -> int:
    return min(scores["nodes"], FULL) if several else FULL


def _why(winner, runner, s: dict, r: dict, several: bool) -> str:
    """One line: the first criterion of RULE on which the winner beat the runner-up."""
    (tw, why_w), (tr, why_r) = coverage(s, several), coverage(r, several)
    if tw != tr:
        return f"{why_w}; candidate {runner.index}: {why_r}"
    topic_w, topic_r = s.get("topic_share", 1.0), r.get("topic_share", 1.0)
    if abs(topic_w - topic_r) > TIE:
        return (f"{why_w}; {topic_w:.0%} of subtasks on topic > {topic_r:.0%} "
                f"(candidate {runner.index})")
    if abs(s["speedup"] - r["speedup"]) > TIE:
        return (f"{why_w}; speed-up |V|/T {s['speedup']:.2f} > {r['speedup']:.2f} "
                f"(candidate {runner.index})")
    if _size(s, several) != _size(r, several):
        return (f"{why_w}; same speed-up {s['speedup']:.2f}, {s['nodes']} subtasks against "
                f"{r['nodes']}: fewer than {FULL} cover less of a multi-step task "
                f"(candidate {runner.index})")
    if abs(s["success_share"] - r["success_share"]) > TIE:
        return (f"{why_w}; same speed-up {s['speedup']:.2f}, fewer dependencies: expected "
                f"successes (p={FAILURE_P}) {s['expected_successes']:.3f} of {s['nodes']} > "
                f"{r['expected_successes']:.3f} of {r['nodes']} (candidate {runner.index})")
    return (f"{why_w}; same coverage, topic share, speed-up and expected successes per "
            f"subtask as candidate {runner.index}; then {s['edges']} vs {r['edges']} edges, "
            f"{s['nodes']} vs {r['nodes']} nodes, then the earlier candidate")


def select(candidates: list, task: str = "") -> int:
    """`index` of the best usable candidate by RULE; sets each usable candidate's `note`."""
    ok = [c for c in candidates if c.ok]
    if not ok:
        if not candidates:
            raise PlanError("there are no candidate plans to choose from; plan with k >= 1")
        raise PlanError(f"all {len(candidates)} candidate plans failed: "
                        f"{failure_summary(candidates)}; try again, raise k, or use a "
                        "stronger model")
    task = task or next((c.workflow.task for c in ok if c.workflow.task), "")
    several = multi_step(task)
    scored = {c.index: _scores_of(c, task) for c in ok}
    ranked = sorted(ok, key=lambda c: _rank(c, scored[c.index], several))
    best = ranked[0]
    head = (f"P_avg {scored[best.index]['parallelism']:.2f}, C_dependency "
            f"{scored[best.index]['dependency_complexity']:.2f} (paper, reported); ")
    if len(ranked) == 1:
        _set_note(best, f"chosen: the only usable candidate; {coverage(scored[best.index], several)[1]}")
    else:
        _set_note(best, "chosen: " + head + _why(best, ranked[1], scored[best.index],
                                                  scored[ranked[1].index], several))
    for c in ranked[1:]:
        _set_note(c, f"lost to candidate {best.index}: " + _why(best, c, scored[best.index],
                                                                scored[c.index], several))
    return best.index


def candidate_line(c, chosen: int | None = None) -> str:
    """One line per candidate for the CLI and the panel: its scores and why it won or lost."""
    mark = "*" if c.index == chosen else " "
    if not c.ok:
        return f"{mark} candidate {c.index} (seed {c.seed}): failed: {c.error}"
    s = c.scores
    numbers = (f"{s.get('nodes')} nodes, {s.get('edges')} edges, speed-up "
               f"{s.get('speedup', 0):.2f}, P_avg {s.get('parallelism', 0):.2f}, C_dependency "
               f"{s.get('dependency_complexity', 0):.2f}, expected successes "
               f"{s.get('expected_successes', 0):.3f}")
    return f"{mark} candidate {c.index} (seed {c.seed}): {numbers}" + (f" -- {c.note}" if c.note else "")


def _set_note(c, text: str) -> None:
    if hasattr(c, "note"):
        c.note = text
