"""`Steering`: a user's changes to a flow's plan between (or during) runs; every button of the
panel that changes the plan is one of these methods.

Each checks what the user asked, changes the workflow, then tells the run core
(`RunCore.changed`: stored, recounted, announced); a node that is running is never changed
under it.
"""

from __future__ import annotations

from ..errors import NodeError
from ..llm.endpoints import check_model
from ..model import status as transition
from ..model.status import Status

__all__ = ["Steering"]

# "Flow" in annotations is flowmagic.flow.facade.Flow, which mixes this class in.


class Steering:
    """Steering a Flow: `prune`, `unprune`, `downgrade`, `rerun`, `edit`, `use_candidate`.
    Mixed into `Flow`: it changes the flow's `workflow` and tells its `core`."""

    def _not_running(self, node_id: str):
        node = self.workflow.node(node_id)
        if node.status == Status.RUNNING:
            raise NodeError(f"node {node_id!r} is running; stop() the flow first")
        return node

    def prune(self, node_id: str) -> None:
        """Remove a node: every predecessor is linked to every successor; history kept."""
        self._not_running(node_id)
        self.workflow.prune(node_id)
        self.core.changed("pruned", node_id)

    def unprune(self, node_id: str) -> None:
        """Undo prune(): the node and its edges come back, the bypass edges go."""
        self.workflow.unprune(node_id)
        self.result = None
        self.core.changed("unpruned", node_id)

    def downgrade(self, node_id: str, model: str) -> None:
        """Run this node on another (cheaper) model from now on."""
        node = self._not_running(node_id)
        # a malformed endpoint, or a model the endpoint does not list: a ConfigError now
        check_model(model)
        node.downgraded_from = node.downgraded_from or node.model or self.settings.model or "default"
        node.model = model
        self.core.changed("downgraded", node_id, model=model)

    def rerun(self, node_id: str, *, run: bool = True) -> "Flow":
        """Run a node again; its descendants become pending (their old outputs stay in attempts)."""
        node = self._not_running(node_id)
        if node.status == Status.PRUNED:
            raise NodeError(f"node {node_id!r} is pruned; nothing to rerun")
        descendants = self.workflow.descendants(node_id)
        for i in [node_id, *descendants]:
            if self.workflow.nodes[i].status != Status.RUNNING:
                transition.reset(self.workflow.nodes[i])
        self.core.restart_running(descendants)
        self.result = None
        self.core.changed("rerun", node_id)
        return self.run() if run and self.core.executor is None else self

    def edit(self, node_id: str, requirement: str) -> None:
        """New requirement: the node runs again on the next run(); descendants are marked stale."""
        node = self._not_running(node_id)
        if not isinstance(requirement, str) or not requirement.strip():
            raise NodeError("a requirement must be non-empty text")
        node.requirement = requirement.strip()
        if node.status in (Status.DONE, Status.FAILED):
            transition.reset(node)
            descendants = self.workflow.descendants(node_id)
            for i in descendants:
                if self.workflow.nodes[i].status == Status.DONE:
                    self.workflow.nodes[i].stale = True
            self.core.restart_running(descendants)
        self.result = None
        self.core.changed("edited", node_id)

    def use_candidate(self, index: int) -> None:
        """Switch to another candidate plan (before anything has run)."""
        if any(n.status in (Status.DONE, Status.RUNNING, Status.FAILED) for n in self.workflow.nodes.values()):
            raise NodeError("this flow has already run nodes; plan again to switch candidates")
        if not 0 <= index < len(self.candidates) or self.candidates[index].workflow is None:
            usable = [c.index for c in self.candidates if c.workflow is not None]
            raise NodeError(f"no usable candidate {index}; usable: {usable}")
        self.workflow = self.candidates[index].workflow.copy()
        self.chosen = index
        self.core.changed("candidate", None, index=index)
