"""The only door to models: the client (`LLM`), endpoints and prices, the embedded server.

`from flowmagic.llm import LLM` works as before the layer folders; the client and the
openai SDK load on first use, so `import flowmagic` (and `%load_ext`) stays fast.
"""

from __future__ import annotations

from typing import Any

__all__ = ["LLM", "Reply", "configure", "get_llm", "cache_key", "ToolsUnsupportedError",
           "EmbeddingsUnsupportedError"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import client
        return getattr(client, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
