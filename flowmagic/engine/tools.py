"""Tools: the user's own Python functions, offered to a node's model.

`@flowmagic.tool` registers a function (so does `%%flow --tools fn1,fn2` or
`flow.tools = [...]`); its JSON schema comes from the signature, the type hints and
the docstring (`flowmagic.engine.toolschema`, which also checks a model's arguments). A node is offered
only the `top_n` tools most similar to its requirement (`select_tools`, with the
similarity backends of `flowmagic.evaluate`).

The conversation that lets a model call them is `flowmagic.engine.toolloop.run_with_tools`.

Tools run in the kernel, with a timeout. A sync tool runs in its own daemon thread (not
asyncio's shared executor, whose shutdown would wait for a hung tool): Python cannot kill
a thread, so a timed-out call may still be running, and the result the model gets says so.
An exception or a timeout becomes the tool's result and a logged error, never a crash.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import json
import re
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

from ..errors import ConfigError
from .toolschema import check_arguments, schema_of

__all__ = ["Tool", "ToolCall", "tool", "registry", "unregister", "as_tool", "as_tools",
           "schema_of", "resolve_tools", "select_tools", "aselect_tools", "call_tool"]

_REGISTRY: dict[str, "Tool"] = {}
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")


@dataclass
class Tool:
    """A function the model may call, with the JSON schema of its arguments."""
    name: str
    fn: Callable
    description: str
    parameters: dict
    timeout_s: float | None = None   # overrides the caller's timeout for this tool

    def spec(self) -> dict:
        """The OpenAI function-calling form."""
        return {"type": "function", "function": {
            "name": self.name, "description": self.description, "parameters": self.parameters}}

    def text(self) -> str:
        """What the tool filter compares with a requirement (names split into words)."""
        params = " ".join(f"{k.replace('_', ' ')} {v.get('description', '')}"
                          for k, v in self.parameters.get("properties", {}).items())
        return f"{self.name.replace('_', ' ')}: {self.description} {params}".strip()


@dataclass
class ToolCall:
    """One call a model asked for: stored, shown in the node's view, given back to the model."""
    tool: str
    arguments: Any
    result: str                     # what the model is told (an error message when it failed)
    duration_s: float = 0.0
    error: str | None = None
    round: int = 0
    protocol: str = "native"
    id: str | None = None

    def summary(self, limit: int = 200) -> str:
        text = " ".join((self.error or self.result or "").split())
        return text if len(text) <= limit else text[: limit - 3] + "..."

    def to_dict(self) -> dict:
        return {"tool": self.tool, "arguments": self.arguments, "result": self.summary(),
                "duration_s": round(self.duration_s, 4), "error": self.error,
                "round": self.round, "protocol": self.protocol}


# ---------------------------------------------------------------------------- registration
def as_tool(obj: Any, *, name: str | None = None, description: str | None = None,
            timeout_s: float | None = None) -> Tool:
    """A Tool from a function (or a Tool, returned as it is)."""
    if isinstance(obj, Tool):
        return obj
    if isinstance(getattr(obj, "__flowmagic_tool__", None), Tool) and name is None:
        return obj.__flowmagic_tool__
    if not callable(obj):
        raise ConfigError(f"{obj!r} is not a function; tools are Python functions")
    name = name or getattr(obj, "__name__", "")
    if not _NAME.match(name or "") or name == "<lambda>":
        raise ConfigError(f"tool name {name!r} is not usable (letters, digits, _ or -); "
                          "give one with @flowmagic.tool(name=...)")
    summary, params = schema_of(obj)
    return Tool(name, obj, description or summary, params, timeout_s)


def tool(fn: Callable | None = None, *, name: str | None = None, description: str | None = None,
         timeout_s: float | None = None):
    """Register a function as a tool: `@flowmagic.tool` or `@flowmagic.tool(timeout_s=5)`.

    The function is returned unchanged (still callable by you); flows with no explicit
    `tools` offer every registered tool. Running the cell again replaces the registration.
    """
    def register(f: Callable) -> Callable:
        t = as_tool(f, name=name, description=description, timeout_s=timeout_s)
        _REGISTRY[t.name] = t
        try:
            f.__flowmagic_tool__ = t
        except (AttributeError, TypeError):   # builtins and bound methods take no attributes
            pass
        return f

    return register(fn) if fn is not None else register


def registry() -> dict[str, Tool]:
    """The registered tools by name."""
    return dict(_REGISTRY)


def unregister(name: str | None = None) -> None:
    """Forget one registered tool, or all of them."""
    if name is None:
        _REGISTRY.clear()
    else:
        _REGISTRY.pop(name, None)


def as_tools(items: Any) -> list[Tool]:
    """Tools from a list of functions, Tools or registered names (duplicates by name dropped)."""
    if items is None:
        return []
    if isinstance(items, (str, Tool)) or callable(items):
        items = [items]
    out: dict[str, Tool] = {}
    for item in items:
        if isinstance(item, str):
            if item not in _REGISTRY:
                raise ConfigError(f"no registered tool {item!r}; registered: "
                                  f"{', '.join(_REGISTRY) or 'none'} (use @flowmagic.tool)")
            item = _REGISTRY[item]
        t = as_tool(item)
        out.setdefault(t.name, t)
    return list(out.values())


def resolve_tools(spec: str | Iterable | None, namespace: Mapping[str, Any] | None = None) -> list[Tool]:
    """Tools named in `spec` ("fn1,fn2" or a list), looked up in `namespace`, then the registry.

    This is what `%%flow --tools fn1,fn2` calls with the notebook's namespace.
    """
    if spec is None:
        return []
    names = [s.strip() for s in spec.split(",")] if isinstance(spec, str) else list(spec)
    found = []
    for item in names:
        if not isinstance(item, str):
            found.append(item)
        elif item and namespace is not None and item in namespace:
            if not callable(namespace[item]):
                raise ConfigError(f"--tools: {item!r} is a {type(namespace[item]).__name__}, "
                                  "not a function; define it with def")
            found.append(namespace[item])
        elif item in _REGISTRY:
            found.append(_REGISTRY[item])
        elif item:
            raise ConfigError(f"--tools: no function named {item!r} in the notebook; define it "
                              "(def ...) before this cell, or register it with @flowmagic.tool")
    return as_tools(found)


def select_tools(requirement: str, tools: Any, top_n: int | None = 3,
                 similarity: Any = "tfidf") -> list[Tool]:
    """The `top_n` tools most similar to the requirement, most similar first.

    `similarity` is a backend name of `flowmagic.llm.similarity.get_similarity` or a callable
    `(labels_a, labels_b) -> matrix`; ties keep the given order.
    """
    tools = as_tools(tools)
    if not tools or top_n is None or len(tools) <= top_n:
        return tools
    if top_n <= 0:
        return []
    from ..llm.similarity import get_similarity
    sim = get_similarity(similarity) if isinstance(similarity, str) else similarity
    scores = sim([requirement or ""], [t.text() for t in tools])[0]
    order = sorted(range(len(tools)), key=lambda i: (-float(scores[i]), i))
    return [tools[i] for i in order[:top_n]]


async def aselect_tools(requirement: str, tools: Any, top_n: int | None = 3,
                        similarity: Any = "auto", *, llm: Any = None,
                        model: str | None = None) -> list[Tool]:
    """`select_tools` by meaning: "auto" (the default) and "embeddings" rank the tools by the
    cosine of the endpoint's `/embeddings` vectors (of `model`'s endpoint; see
    `flowmagic.llm.endpoints.embedding_model`), so "will I need an umbrella" finds the
    weather tool that shares no word with it. "auto" falls back to TF-IDF when the endpoint
    cannot embed (remembered per endpoint, so it is asked once); "embeddings" raises then.
    Any other `similarity` is `select_tools`'."""
    tools = as_tools(tools)
    if not tools or top_n is None or len(tools) <= top_n or top_n <= 0 or llm is None \
            or similarity not in ("auto", "embeddings"):
        fallback = "tfidf" if similarity in ("auto", "embeddings") else similarity
        return select_tools(requirement, tools, top_n, fallback)
    from ..errors import EndpointError
    from ..llm.endpoints import embedding_model
    from ..model.similarity import EmbeddingSimilarity

    try:
        vectors = await llm.embed([requirement or "-", *[t.text() for t in tools]],
                                  model=embedding_model(model), purpose="tool-filter")
    except EndpointError:
        if similarity == "embeddings":
            raise
        return select_tools(requirement, tools, top_n, "tfidf")
    table = dict(zip([requirement or "-", *[t.text() for t in tools]], vectors))
    return select_tools(requirement or "-", tools, top_n,
                        EmbeddingSimilarity(lambda texts: [table[t] for t in texts]))


# ---------------------------------------------------------------------------- calling
def _in_thread(fn: Callable, kwargs: dict) -> asyncio.Future:
    loop = asyncio.get_running_loop()
    future = loop.create_future()
    context = contextvars.copy_context()

    def settle(out: tuple) -> None:
        if not future.done():
            future.set_result(out)

    def work() -> None:
        try:
            out = (True, context.run(fn, **kwargs))
        except BaseException as exc:   # SystemExit from a tool must not end silently
            out = (False, exc)
        try:
            loop.call_soon_threadsafe(settle, out)
        except RuntimeError:   # the loop is closed: nobody is waiting any more
            pass

    threading.Thread(target=work, name=f"flowmagic-tool-{getattr(fn, '__name__', 'fn')}",
                     daemon=True).start()
    return future


async def _guarded(coro) -> tuple[bool, Any]:
    try:
        return True, await coro
    except (Exception, SystemExit) as exc:
        return False, exc


def _render(value: Any, limit: int) -> str:
    if isinstance(value, str):
        text = value
    else:
        try:
            text = json.dumps(value, ensure_ascii=False)
        except (TypeError, ValueError):
            text = repr(value)
    return text if len(text) <= limit else text[: limit - 20] + f" [cut, {len(text)} chars]"


async def call_tool(t: Tool, arguments: Any, *, timeout_s: float | None = 30.0,
                    max_result_chars: int = 4000) -> ToolCall:
    """Run one tool call; failures and timeouts come back as the result, never raised."""
    timeout = t.timeout_s if t.timeout_s is not None else timeout_s
    started = time.perf_counter()
    call = ToolCall(t.name, arguments, "")
    try:
        args = check_arguments(t.fn, arguments, t.parameters)
        call.arguments = args
        if inspect.iscoroutinefunction(t.fn):
            ok, value = await asyncio.wait_for(_guarded(t.fn(**args)), timeout)
        else:
            ok, value = await asyncio.wait_for(_in_thread(t.fn, args), timeout)
            if ok and inspect.isawaitable(value):
                left = None if timeout is None else max(0.0, timeout - (time.perf_counter() - started))
                ok, value = await asyncio.wait_for(_guarded(value), left)
        if ok:
            call.result = _render(value, max_result_chars)
        else:
            call.error = f"{type(value).__name__}: {value}"
    except ValueError as exc:
        call.error = f"bad arguments: {exc}"
    except asyncio.TimeoutError:
        call.error = (f"timed out after {timeout:g} s; the call may still be running"
                      + ("" if inspect.iscoroutinefunction(t.fn) else " (a thread cannot be stopped)"))
    call.duration_s = time.perf_counter() - started
    if call.error:
        call.result = f"Error from tool {t.name}: {call.error}"
    return call
