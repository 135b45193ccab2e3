"""Which nodes of a workflow can start: graphlib's shape, for a graph that can change.

`prepare(workflow, running)` counts each node's unfinished parents and queues the pending
nodes with none; `get_ready()` hands out the next one; `done(workflow, node_id)` tells it a
node finished well, which queues every child whose last parent that was. Like
`graphlib.TopologicalSorter` it keeps only counts and a queue and leaves the work and its
concurrency to the caller (the scheduler's asyncio driver); unlike it, `prepare` may be
called again at any time (after an update, a prune or a rerun edited the graph). It also
names the clones of an agent that runs more than once at a time (`take_slot`). No asyncio
here: it is tested and reasoned about as plain data.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Iterable

from ..model.graph import Workflow
from ..model import status as transition
from ..model.status import Status

__all__ = ["ReadySet"]


class ReadySet:
    """Counts of unfinished parents, the queue of nodes that can start, and clone slots."""

    def __init__(self) -> None:
        self.waiting: dict[str, int] = {}
        self.ready: deque[str] = deque()
        self._slots: dict[str, tuple[str, int]] = {}   # running node -> (agent, clone number)
        self._free: dict[str, tuple[list[int], list[int]]] = {}   # agent -> (freed heap, [top])

    def prepare(self, workflow: Workflow, running: Iterable[str] = ()) -> None:
        """Derive the counts and the ready queue from the graph (after any edit); a node
        marked ready but not running goes back to pending."""
        nodes, graph = workflow.nodes, workflow.graph
        running = set(running)
        self.waiting = {}
        ready = []
        for node_id, node in nodes.items():
            if node.status == Status.PRUNED:
                continue
            waiting = sum(1 for p in graph.predecessors(node_id) if nodes[p].status != Status.DONE)
            self.waiting[node_id] = waiting
            if node.status == Status.READY and node_id not in running:
                transition.requeue(node)
            if node.status == Status.PENDING and waiting == 0 and node_id not in running:
                ready.append(node_id)
        self.ready = deque(ready)

    def keep_only(self, node_ids: Iterable[str]) -> None:
        """Hand out only these of the ready nodes, in this order (a run of chosen nodes)."""
        self.ready = deque(i for i in node_ids if i in self.ready)

    def get_ready(self, workflow: Workflow) -> str | None:
        """The next node that can start now, or None: queued nodes that an edit made
        unready since (no longer pending, or waiting again) are skipped."""
        while self.ready:
            node_id = self.ready.popleft()
            node = workflow.nodes.get(node_id)
            if node is not None and node.status == Status.PENDING \
                    and not self.waiting.get(node_id, 1):
                return node_id
        return None

    def done(self, workflow: Workflow, node_id: str) -> None:
        """`node_id` finished well: each child it was the last unfinished parent of is ready."""
        for child in workflow.graph.successors(node_id):
            left = self.waiting.get(child, 1) - 1
            self.waiting[child] = left
            if left == 0 and workflow.nodes[child].status == Status.PENDING:
                self.ready.append(child)

    def take_slot(self, node_id: str, agent: str) -> int:
        """The clone number of `agent` this node runs as: the lowest free one.

        Numbers name free slots, not running counts: with #1 and #2 running and #1 done,
        the next instance is #1 again, never a second #2. Each agent keeps its freed
        numbers in a heap and its highest number: O(log n) a start, not a scan of every
        running node (a 500-wide level made that quadratic)."""
        freed, top = self._free.setdefault(agent, ([], [0]))
        if freed:
            n = heapq.heappop(freed)
        else:
            top[0] += 1
            n = top[0]
        self._slots[node_id] = (agent, n)
        return n

    def free_slot(self, node_id: str | None) -> None:
        """The node stopped running: its clone number is free again."""
        slot = self._slots.pop(node_id, None)
        if slot is not None:
            heapq.heappush(self._free[slot[0]][0], slot[1])
