"""`ToolChoice`: the tools a flow's nodes may call, and the few offered to one node.

None chosen means every `@flowmagic.tool` of this process (so a copy of the flow elsewhere, a
Dask worker say, offers that process's tools); a list means exactly those.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["ToolChoice"]

_TOOLS_MODULE = f"{__package__}.tools"


class ToolChoice:
    def __init__(self, chosen: Any = None):
        self.chosen: list | None = None
        self.set(chosen)

    def set(self, value: Any) -> None:
        if value is None:   # (the tools module is not loaded for it: see any())
            self.chosen = None
            return
        from .tools import as_tools
        self.chosen = as_tools(value)

    def all(self) -> list:
        """The functions nodes may call: those chosen, else every @flowmagic.tool."""
        from .tools import registry
        return list(self.chosen) if self.chosen is not None else list(registry().values())

    def any(self) -> bool:
        """Whether nodes are offered any tool (asked once per node: no list is built, and no
        import statement run: no tool is registered before the tools module is loaded)."""
        if self.chosen is not None:
            return bool(self.chosen)
        tools = sys.modules.get(_TOOLS_MODULE)
        return tools is not None and bool(tools.registry())

    def for_requirement(self, requirement: str, settings: Any) -> list:
        """The `tools_top_n` tools most similar to a requirement (by words: no model call)."""
        from .tools import select_tools
        similarity = settings.tool_similarity
        similarity = "tfidf" if similarity in ("auto", "embeddings") else similarity
        return select_tools(requirement, self.all(), top_n=settings.tools_top_n,
                            similarity=similarity)

    async def offer(self, node: Any, settings: Any, llm: Any) -> list:
        """The tools offered to a node, by meaning when the endpoint embeds (see
        flowmagic.engine.tools.aselect_tools; `tool_similarity` "auto" by default)."""
        from .tools import aselect_tools
        return await aselect_tools(node.requirement, self.all(), top_n=settings.tools_top_n,
                                   similarity=settings.tool_similarity, llm=llm,
                                   model=node.model or settings.model)
