"""Tools: the user's own Python functions, offered to a node's model.

`@flowmagic.tool` registers a function (so does `%%flow --tools fn1,fn2` or
`flow.tools = [...]`); its JSON schema comes from the signature, the type hints and
the docstring (Google, NumPy or Sphinx style parameter descriptions). A node is offered
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
import dataclasses
import enum
import inspect
import json
import re
import threading
import time
import types
import typing
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

from ..errors import ConfigError

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


# ---------------------------------------------------------------------------- schemas
_SIMPLE = {str: "string", int: "integer", float: "number", bool: "boolean", type(None): "null"}
_PARAM_HEADS = ("args", "arguments", "parameters", "params", "keyword args",
                "keyword arguments", "other parameters")
_GOOGLE_HEAD = re.compile(r"^(Args|Arguments|Parameters|Params|Keyword Args|Keyword Arguments|"
                          r"Other Parameters|Returns?|Yields?|Raises|Examples?|Notes?|See Also|"
                          r"Attributes|Warnings?|References|Todo):$")
_SPHINX = re.compile(r"^:param\s+(?:[^:]*\s)?(\w+)\s*:\s*(.*)$")


def _json_type(tp: Any) -> dict:
    """The JSON schema of a type hint; {} (any JSON value) when it has no JSON form."""
    if tp is inspect.Parameter.empty or tp is Any:
        return {}
    if isinstance(tp, str):   # an unresolved forward reference: only the plain names
        return {"type": _SIMPLE[t]} if (t := {"str": str, "int": int, "float": float,
                                             "bool": bool}.get(tp)) else {}
    if tp in _SIMPLE:
        return {"type": _SIMPLE[tp]}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return {"enum": [m.value for m in tp]}
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated:
        out = _json_type(args[0])
        notes = [a for a in args[1:] if isinstance(a, str)]
        return {**out, "description": notes[0]} if notes else out
    if origin is typing.Literal:
        return {"enum": list(args)}
    if origin in (typing.Union, types.UnionType):
        options = [_json_type(a) for a in args if a is not type(None)]
        return options[0] if len(options) == 1 else {"anyOf": options}
    if tp in (list, tuple, set, frozenset) or origin in (list, tuple, set, frozenset) or (
            origin is not None and origin.__name__ in ("Sequence", "Iterable", "Collection")):
        items = [a for a in args if a is not Ellipsis]
        return {"type": "array", **({"items": _json_type(items[0])} if len(set(items)) == 1 else {})}
    if tp is dict or origin is dict or (origin is not None and origin.__name__ == "Mapping"):
        return {"type": "object", **({"additionalProperties": _json_type(args[1])} if args else {})}
    if dataclasses.is_dataclass(tp):
        return {"type": "object"}
    return {}


def _heading(lines: list[str], i: int) -> str | None:
    """The section name when line i starts a section (Google `Args:` or NumPy underlined)."""
    line = lines[i].strip()
    if i + 1 < len(lines) and line and re.fullmatch(r"-{3,}", lines[i + 1].strip()):
        return line.lower()
    found = _GOOGLE_HEAD.match(line)
    return found.group(1).lower() if found else None


def _doc_sections(doc: str) -> tuple[str, dict[str, str]]:
    """(summary, {param: description}) from a Google, NumPy or Sphinx style docstring."""
    lines, summary, params = doc.splitlines(), [], {}
    section, current, entry_indent, seen_section = None, None, None, False
    for i, raw in enumerate(lines):
        line, indent = raw.strip(), len(raw) - len(raw.lstrip())
        head = _heading(lines, i)
        sphinx = _SPHINX.match(line)
        if head is not None:
            section, current, entry_indent, seen_section = head, None, None, True
        elif re.fullmatch(r"-{3,}", line):
            continue
        elif sphinx:
            section, current, seen_section = None, sphinx.group(1), True
            params[current] = sphinx.group(2)
        elif line.startswith(":"):
            section, current, seen_section = None, None, True
        elif section in _PARAM_HEADS and line:
            entry_indent = indent if entry_indent is None else entry_indent
            found = re.match(r"^\*{0,2}(\w+)\s*(\([^)]*\))?\s*(:\s*(.*))?$", line)
            if indent <= entry_indent and found:
                current = found.group(1)
                numpy_type = " : " in f" {line} " and not found.group(2)
                params[current] = "" if numpy_type else (found.group(4) or "")
            elif current:
                params[current] = f"{params[current]} {line}".strip()
        elif current and line and section is None:
            params[current] = f"{params[current]} {line}".strip()   # a Sphinx continuation
        elif not seen_section:
            summary.append(line)
    paragraph = "\n".join(summary).strip().split("\n\n")[0]
    return " ".join(paragraph.split()), {k: " ".join(v.split()) for k, v in params.items()}


def schema_of(fn: Callable) -> tuple[str, dict]:
    """(description, parameters JSON schema) of a function, from its signature and docstring."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        raise ConfigError(f"cannot read the signature of {fn!r}; wrap it in a def with "
                          "named parameters") from None
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception:   # forward references that do not resolve: use the raw annotations
        hints = {k: p.annotation for k, p in sig.parameters.items()}
    summary, docs = _doc_sections(inspect.getdoc(fn) or "")
    props, required = {}, []
    for name, param in sig.parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        hint = hints.get(name, param.annotation)
        prop = _json_type(hint)
        if hint is inspect.Parameter.empty and param.default not in (inspect.Parameter.empty, None):
            prop = _json_type(type(param.default))
        if docs.get(name):
            prop["description"] = docs[name]
        if param.default is inspect.Parameter.empty:
            required.append(name)
        else:
            try:
                json.dumps(param.default)
                prop["default"] = param.default
            except (TypeError, ValueError):
                pass
        props[name] = prop
    schema = {"type": "object", "properties": props, "required": required}
    if not any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values()):
        schema["additionalProperties"] = False
    name = getattr(fn, "__name__", "tool")
    return summary or f"The Python function {name}.", schema


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

    `similarity` is a backend name of `flowmagic.model.similarity.get_similarity` or a callable
    `(labels_a, labels_b) -> matrix`; ties keep the given order.
    """
    tools = as_tools(tools)
    if not tools or top_n is None or len(tools) <= top_n:
        return tools
    if top_n <= 0:
        return []
    from ..model.similarity import get_similarity
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
def _arguments(t: Tool, arguments: Any) -> dict:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError as exc:
            raise ValueError(f"the arguments are not JSON ({exc}); send a JSON object") from None
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise ValueError(f"the arguments must be a JSON object, not {type(arguments).__name__}")
    props = t.parameters.get("properties", {})
    args = {k: _coerce(v, props.get(k, {})) for k, v in arguments.items()}
    try:
        hints = typing.get_type_hints(t.fn)
    except Exception:   # unresolvable annotations: pass the values as they are
        hints = {}
    for key, value in args.items():
        kind = hints.get(key)
        if isinstance(kind, type) and issubclass(kind, enum.Enum) and not isinstance(value, kind):
            try:
                args[key] = kind(value)
            except ValueError:
                raise ValueError(f"{key} must be one of {[m.value for m in kind]}") from None
    try:
        inspect.signature(t.fn).bind(**args)
    except TypeError as exc:
        raise ValueError(f"{exc}; parameters: {', '.join(props) or 'none'}") from None
    return args


def _coerce(value: Any, schema: dict) -> Any:
    """Small models send "3" for 3; convert strings the schema says are numbers or booleans."""
    kind = schema.get("type")
    if isinstance(value, str):
        try:
            if kind == "integer":
                return int(value.strip())
            if kind == "number":
                return float(value.strip())
        except ValueError:
            return value
        if kind == "boolean" and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
    return value


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
        args = _arguments(t, arguments)
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
