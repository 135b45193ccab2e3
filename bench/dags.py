"""The DAG families of the benchmark, as plain dicts `Flow.from_dict` takes.

Every generator is a pure function of its arguments (a seeded `random.Random`), so the
same family and size give the same graph in every runner and on every machine.
"""

from __future__ import annotations

import math
import random

__all__ = ["chain", "fan", "layered", "family", "levels_of", "parents_of"]


def _node(i: int) -> dict:
    # The requirement names the node, so every prompt (and so every request body,
    # whose hash sets the server's latency) differs from node to node.
    return {"id": f"n{i:05d}", "requirement": f"Do step {i} of the benchmark workflow."}


def chain(n: int) -> dict:
    """n nodes one after another: no parallelism, every scheduler should match the bound."""
    nodes = [_node(i) for i in range(n)]
    edges = [[nodes[i]["id"], nodes[i + 1]["id"]] for i in range(n - 1)]
    return {"nodes": nodes, "edges": edges}


def fan(n: int) -> dict:
    """One source, n - 2 parallel nodes, one sink (wide fan-out, then fan-in)."""
    nodes = [_node(i) for i in range(n)]
    src, sink = nodes[0]["id"], nodes[-1]["id"]
    mids = [x["id"] for x in nodes[1:-1]]
    edges = [[src, m] for m in mids] + [[m, sink] for m in mids]
    return {"nodes": nodes, "edges": edges}


def layered(n: int, seed: int = 0, *, depth: int | None = None, extra: float = 0.3) -> dict:
    """A random layered DAG: about sqrt(n) layers of equal width.

    Each node after the first layer has 1-3 parents drawn from the layer just before it
    (so its longest-path level is its layer), and with probability `extra` one more
    parent from any earlier layer (a skip edge, as real plans have).
    """
    rng = random.Random(f"layered:{n}:{seed}")
    depth = depth or max(2, round(math.sqrt(n)))
    sizes = [n // depth + (1 if i < n % depth else 0) for i in range(depth)]
    nodes, layers, i = [], [], 0
    for size in sizes:
        layer = []
        for _ in range(size):
            nodes.append(_node(i))
            layer.append(nodes[-1]["id"])
            i += 1
        layers.append(layer)
    edges = []
    for k in range(1, depth):
        prev, earlier = layers[k - 1], [x for layer in layers[: k - 1] for x in layer]
        for child in layers[k]:
            parents = rng.sample(prev, min(len(prev), rng.randint(1, 3)))
            if earlier and rng.random() < extra:
                parents.append(rng.choice(earlier))
            edges += [[p, child] for p in sorted(parents)]
    return {"nodes": nodes, "edges": edges}


def family(name: str, n: int, seed: int = 0) -> dict:
    if name == "chain":
        return chain(n)
    if name == "fan":
        return fan(n)
    if name == "layered":
        return layered(n, seed)
    raise ValueError(f"unknown DAG family {name!r}; use chain, fan or layered")


def parents_of(dag: dict) -> dict[str, list[str]]:
    parents: dict[str, list[str]] = {x["id"]: [] for x in dag["nodes"]}
    for a, b in dag["edges"]:
        parents[b].append(a)
    return parents


def levels_of(dag: dict) -> list[list[str]]:
    """Longest-path levels in plan order (what a level-synchronous runner waits on)."""
    parents = parents_of(dag)
    level: dict[str, int] = {}
    for x in dag["nodes"]:  # plan order is a topological order for every family here
        level[x["id"]] = 1 + max((level[p] for p in parents[x["id"]]), default=-1)
    out: list[list[str]] = [[] for _ in range(max(level.values(), default=-1) + 1)]
    for node_id, k in level.items():
        out[k].append(node_id)
    return out
