"""The AOV workflow: subtasks (`Node`) and "must finish before" edges on a networkx DiGraph.

A `Workflow` keeps the graph (ids only) and the `Node` objects side by side. Pruned nodes
stay in `nodes` for their history but have no edges, so every query that matters works
on `active()`. Counts such as `num_parents_not_completed` are always derived from the
graph, never stored, so they cannot drift. `parse_plan` turns whatever a model wrote
into a valid DAG plus one warning per repair (the repairs are `plans`'), or one `PlanError`.
"""

from __future__ import annotations

import copy as _copy
from typing import Any

import networkx as nx

from ..errors import NodeError, PlanError
from .node import SLUG_MAX, STATUSES, Node, is_slug, slugify
from .plans import RepairedPlan, repair_plan
from . import status as transition
from .status import Status

__all__ = ["STATUSES", "SLUG_MAX", "Node", "Workflow", "parse_plan", "slugify", "is_slug"]

class _Nodes(dict):
    """The plan-ordered `id -> Node` dict that also keeps each id's position, rebuilt only
    after the dict changed, so ordering a node's parents costs O(degree), not O(|V|)."""

    _pos: dict | None = None

    def positions(self) -> dict[str, int]:
        if self._pos is None:
            self._pos = {k: i for i, k in enumerate(self)}
        return self._pos

    def __setitem__(self, key, value) -> None:
        if key not in self:
            self._pos = None
        super().__setitem__(key, value)

    def __delitem__(self, key) -> None:
        self._pos = None
        super().__delitem__(key)

    def pop(self, *args):
        self._pos = None
        return super().pop(*args)

    def popitem(self):
        self._pos = None
        return super().popitem()

    def clear(self) -> None:
        self._pos = None
        super().clear()

    def update(self, *args, **kwargs) -> None:
        self._pos = None
        super().update(*args, **kwargs)

    def setdefault(self, key, default=None):
        self._pos = None
        return super().setdefault(key, default)

    def __ior__(self, other):
        self._pos = None
        return super().__ior__(other)


class Workflow:
    """An AOV graph of subtasks; ids in `graph`, `Node` objects in `nodes` (plan order)."""

    def __init__(self, task: str = "") -> None:
        self.task = task
        self.graph = nx.DiGraph()
        self.nodes: dict[str, Node] = _Nodes()
        self.warnings: list[str] = []

    def __repr__(self) -> str:
        return (f"Workflow({len(self.nodes)} nodes, {self.graph.number_of_edges()} edges, "
                f"task={self.task[:40]!r})")

    def __contains__(self, node_id: object) -> bool:
        return node_id in self.nodes

    # -- ordering helpers: plan order breaks every tie, so nothing depends on hash seeds
    def _positions(self) -> dict[str, int]:
        nodes = self.nodes
        if not isinstance(nodes, _Nodes):   # someone assigned a plain dict: adopt it
            nodes = self.nodes = _Nodes(nodes)
        return nodes.positions()

    def _sorted(self, ids) -> list[str]:
        ids = list(ids)
        if len(ids) < 2:   # most nodes have one parent or one child: nothing to order
            return ids
        pos = self._positions()
        return sorted(ids, key=lambda i: (pos.get(i, len(pos)), i))

    def edges(self) -> list[tuple[str, str]]:
        """All edges, sorted by the plan order of (parent, child)."""
        pos = self._positions()
        return sorted(self.graph.edges, key=lambda e: (pos.get(e[0], -1), pos.get(e[1], -1)))

    # -- mutation
    def add_node(self, node: Node) -> Node:
        if not isinstance(node, Node):
            raise NodeError(f"add_node takes a Node, not {type(node).__name__}")
        if node.id in self.nodes:
            raise NodeError(f"node {node.id!r} already exists; pick another id or edit that node")
        if not is_slug(node.id):
            raise NodeError(f"node id {node.id!r} is not a slug of [a-z0-9_] (at most {SLUG_MAX} "
                            f"characters); use slugify(), e.g. {slugify(node.id, 'task')!r}")
        if not isinstance(node.requirement, str) or not node.requirement.strip():
            raise NodeError(f"node {node.id!r} has an empty requirement; say what the subtask must do")
        if node.status not in STATUSES:
            raise NodeError(f"node {node.id!r} has unknown status {node.status!r}; use one of {STATUSES}")
        self.nodes[node.id] = node
        self.graph.add_node(node.id)
        return node

    def _active_node(self, node_id: str) -> Node:
        node = self.node(node_id)
        if node.status == Status.PRUNED:
            raise NodeError(f"node {node_id!r} is pruned; it can have no edges")
        return node

    def add_edge(self, a: str, b: str) -> None:
        """Make `a` a parent of `b`; refuses self-loops and edges that would close a cycle."""
        self._active_node(a)
        self._active_node(b)
        if a == b:
            raise PlanError(f"node {a!r} cannot depend on itself; drop that dependency")
        if self.graph.has_edge(a, b):
            return
        if nx.has_path(self.graph, b, a):
            raise PlanError(f"edge {a} -> {b} would close a cycle ({b} already leads to {a}); "
                            "drop one of the dependencies")
        self.graph.add_edge(a, b)

    def remove_edge(self, a: str, b: str) -> None:
        if not self.graph.has_edge(a, b):
            raise NodeError(f"there is no edge {a} -> {b}; see workflow.edges() for the edges")
        self.graph.remove_edge(a, b)

    def prune(self, node_id: str) -> None:
        """Mark pruned and link every predecessor to every successor (AgentSlimming's
        surgery): each successor keeps reading what the pruned node read, so an edge that
        another path already implies is still added (it carries data under
        context="parents"); a drawing may show the transitive reduction instead."""
        node = self.node(node_id)
        if node.status == Status.PRUNED:
            return
        preds, succs = self.parents(node_id), self.children(node_id)
        self.graph.remove_edges_from([(p, node_id) for p in preds] + [(node_id, s) for s in succs])
        # A bypass edge cannot close a cycle: p -> node -> s already existed.
        added = [(p, s) for p in preds for s in succs
                 if p != s and not self.graph.has_edge(p, s)]
        self.graph.add_edges_from(added)
        transition.prune(node, {"parents": preds, "children": succs,
                                "added": [list(e) for e in added]})

    def unprune(self, node_id: str) -> None:
        """Undo prune(): the node's edges come back, the bypass edges go; a node pruned before
        this version (no record) comes back pending with no edges to guess."""
        node = self.node(node_id)
        if node.status != Status.PRUNED:
            raise NodeError(f"node {node_id!r} is {node.status}, not pruned; nothing to undo")
        record = node.pruned_from or {}
        live = lambda i: i in self.nodes and self.nodes[i].status != Status.PRUNED  # noqa: E731
        before = list(self.graph.edges)
        self.graph.remove_edges_from(tuple(e) for e in record.get("added", ())
                                     if self.graph.has_edge(*e))
        self.graph.add_edges_from([(p, node_id) for p in record.get("parents", ()) if live(p)]
                                  + [(node_id, c) for c in record.get("children", ()) if live(c)])
        if not nx.is_directed_acyclic_graph(self.graph):   # the plan changed since the prune
            self.graph.remove_edges_from(list(self.graph.edges))
            self.graph.add_edges_from(before)
            raise NodeError(f"node {node_id!r} cannot come back: the plan changed since it was "
                            "pruned and its edges would now make a cycle")
        transition.unprune(node)

    # -- queries
    def node(self, node_id: str) -> Node:
        try:
            return self.nodes[node_id]
        except (KeyError, TypeError):
            known = ", ".join(list(self.nodes)[:20]) or "none"
            raise NodeError(f"unknown node {node_id!r}; known nodes: {known}") from None

    def parents(self, node_id: str) -> list[str]:
        self.node(node_id)
        return self._sorted(self.graph.predecessors(node_id))

    def children(self, node_id: str) -> list[str]:
        self.node(node_id)
        return self._sorted(self.graph.successors(node_id))

    def ancestors(self, node_id: str) -> list[str]:
        self.node(node_id)
        return self._sorted(nx.ancestors(self.graph, node_id))

    def descendants(self, node_id: str) -> list[str]:
        self.node(node_id)
        return self._sorted(nx.descendants(self.graph, node_id))

    def active(self) -> nx.DiGraph:
        """A new DiGraph of the non-pruned nodes, built in plan order."""
        g = nx.DiGraph()
        g.add_nodes_from(i for i, n in self.nodes.items() if n.status != Status.PRUNED)
        g.add_edges_from((a, b) for a, b in self.edges() if a in g and b in g)
        return g

    def order(self) -> list[str]:
        pos = self._positions()
        return list(nx.lexicographical_topological_sort(self.active(), key=pos.__getitem__))

    def generations(self) -> list[list[str]]:
        return [self._sorted(gen) for gen in nx.topological_generations(self.active())]

    def num_parents_not_completed(self, node_id: str) -> int:
        return sum(1 for p in self.parents(node_id) if self.nodes[p].status != Status.DONE)

    def ready(self) -> list[str]:
        """Pending nodes whose parents are all done, in plan order."""
        return [i for i, n in self.nodes.items()
                if n.status == Status.PENDING and self.num_parents_not_completed(i) == 0]

    def copy(self) -> Workflow:
        return _copy.deepcopy(self)

    # -- JSON
    def to_dict(self) -> dict:
        return {"task": self.task, "nodes": [n.to_dict() for n in self.nodes.values()],
                "edges": [[a, b] for a, b in self.edges()], "warnings": list(self.warnings)}

    def to_paper_dict(self) -> dict:
        """Flow's form: one entry per node id (pruned ones included, with no children)."""
        return {i: {"requirement": n.requirement, "status": n.status, "data": n.output,
                    "agent": n.agent, "child": self.children(i),
                    "num_parents_not_completed": self.num_parents_not_completed(i)}
                for i, n in self.nodes.items()}

    @classmethod
    def from_dict(cls, d: Any, task: str | None = None) -> Workflow:
        """Plain (`to_dict`) or paper (`to_paper_dict`) form, or anything `parse_plan` takes."""
        return parse_plan(d, task=task or "")

    @classmethod
    def assemble(cls, plan: RepairedPlan) -> Workflow:
        """The Workflow of a repaired plan: its nodes in order, and its edges but the one that
        closes a cycle; a pruned node's parents are linked to its children."""
        warnings = list(plan.warnings)
        wf = cls(plan.task)
        for node in plan.nodes:
            wf.add_node(node)
        pos = {node.id: i for i, node in enumerate(plan.nodes)}
        # Edges that follow plan order can never form a cycle, so only backward ones are checked:
        # the edge that closes a cycle is always one that contradicts the order the model wrote.
        wf.graph.add_edges_from(e for e in plan.edges if pos[e[0]] < pos[e[1]])
        for a, b in (e for e in plan.edges if pos[e[0]] > pos[e[1]]):
            if nx.has_path(wf.graph, b, a):
                warnings.append(f"dropped the edge {a} -> {b}: it closed a cycle "
                                f"({b} already leads to {a})")
            else:
                wf.graph.add_edge(a, b)
        for node_id, node in wf.nodes.items():
            if node.status == Status.PRUNED and wf.graph.degree(node_id):
                transition.requeue(node)   # pruned again below, its edges bypassed
                wf.prune(node_id)
                warnings.append(f"linked the parents of pruned subtask {node_id} to its children")
        wf.warnings = warnings
        return wf


def parse_plan(obj_or_text: Any, task: str = "") -> Workflow:
    """A repaired `Workflow` from what a model emitted (JSON text or parsed JSON).

    Every repair is one sentence in `workflow.warnings`; a plan with nothing usable
    raises a one-line `PlanError`, never another exception.
    """
    if isinstance(obj_or_text, Workflow):
        wf = obj_or_text.copy()
        wf.task = task or wf.task
        return wf
    return Workflow.assemble(repair_plan(obj_or_text, task))
