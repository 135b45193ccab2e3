"""A tool function's JSON schema and the check of a model's arguments, both from its signature.

pydantic reads the type hints (one `TypeAdapter` per parameter), `_ToolSchema` writes the JSON
schema in the form tool specs have always had (no titles, no "type" beside an enum, Optional[X]
as X, {} for a type with no JSON form): specs are in prompts, so in cache keys and exported
replays, and must not change. Descriptions come from the docstring (Google, NumPy or Sphinx
style). The same adapters check and convert what a model sends ("3" -> 3, "red" -> an enum).
"""

from __future__ import annotations

import collections.abc
import copy
import dataclasses
import enum
import functools
import inspect
import json
import operator
import re
import types
import typing
from dataclasses import dataclass
from typing import Any, Callable

import pydantic
from pydantic.json_schema import GenerateJsonSchema
from pydantic_core import core_schema

from ..errors import ConfigError

__all__ = ["schema_of", "check_arguments"]
_PARAM_HEADS = ("args", "arguments", "parameters", "params", "keyword args",
                "keyword arguments", "other parameters")
_GOOGLE_HEAD = re.compile(r"^(Args|Arguments|Parameters|Params|Keyword Args|Keyword Arguments|"
                          r"Other Parameters|Returns?|Yields?|Raises|Examples?|Notes?|See Also|"
                          r"Attributes|Warnings?|References|Todo):$")
_SPHINX = re.compile(r"^:param\s+(?:[^:]*\s)?(\w+)\s*:\s*(.*)$")
_SIMPLE = (str, int, float, bool)
_FORWARD = {"str": str, "int": int, "float": float, "bool": bool}
_UNSTATED = "flowmagic-unstated"   # a bare `list` or `dict`: no "items" / "additionalProperties"
_ABC_ARRAYS = (collections.abc.Sequence, collections.abc.Iterable, collections.abc.Collection)
_PYDANTIC_EXTRAS = ("pydantic_js_functions", "pydantic_js_updates")
_CONFIG = pydantic.ConfigDict(arbitrary_types_allowed=True, coerce_numbers_to_str=True)


class _Unstated:
    """The items of a bare container: any value, as `Any`, but marked so the schema omits them."""

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> core_schema.CoreSchema:
        return core_schema.any_schema(metadata={_UNSTATED: True})


@dataclass(frozen=True)
class _Note:
    """A plain string in `Annotated[int, "how many"]`: the description of that value."""
    text: str

    def __get_pydantic_json_schema__(self, schema: Any, handler: Any) -> dict:
        return {**handler(schema), "description": self.text}


def _spell(tp: Any) -> Any:
    """The type hint as pydantic should read it for a tool's schema: a bare container's items
    are `_Unstated`, the first string note of an `Annotated` is a `_Note`, a `Collection` reads
    as a `Sequence`, and a class with no JSON form in our specs (a Path, a DataFrame) says so."""
    if isinstance(tp, (str, typing.ForwardRef)):   # unresolved: only the plain names, at the top
        return _FORWARD.get(tp, Any) if isinstance(tp, str) else Any
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated:
        notes = [a for a in args[1:] if isinstance(a, str)]
        return typing.Annotated[(_spell(args[0]), *[a for a in args[1:] if not isinstance(a, str)],
                                 *([_Note(notes[0])] if notes else []))]
    if origin is typing.Literal or tp is Any or tp in _SIMPLE or tp is type(None):
        return tp
    if origin in (typing.Union, types.UnionType):
        return functools.reduce(operator.or_, [_spell(a) for a in args])
    base = origin or tp
    if base in (list, set, frozenset) or base in _ABC_ARRAYS:
        base = collections.abc.Sequence if base is collections.abc.Collection else base
        return base[_spell(args[0]) if args else _Unstated]
    if base is tuple:
        return tuple[tuple(a if a is Ellipsis else _spell(a) for a in args)] if args \
            else tuple[_Unstated, ...]
    if base in (dict, collections.abc.Mapping):
        return base[(_spell(args[0]), _spell(args[1])) if args else (_Unstated, _Unstated)]
    if isinstance(tp, type) and (issubclass(tp, enum.Enum) or dataclasses.is_dataclass(tp)):
        return tp
    return typing.Annotated[tp, pydantic.WithJsonSchema({})]


class _ToolSchema(GenerateJsonSchema):
    """pydantic's JSON schema generator, writing the schemas our tool specs have always had."""
    _KEEP = {"union", "nullable", "default", "definitions", "definition-ref", "json-or-python",
             "function-before", "function-after", "function-wrap", "lax-or-strict", "chain"}

    def build_schema_type_to_method(self) -> dict:
        mapping = super().build_schema_type_to_method()
        own = {name for name in vars(_ToolSchema) if name.endswith("_schema")}
        return {key: (method if key in self._KEEP or f"{key.replace('-', '_')}_schema" in own
                      else self.no_json_form) for key, method in mapping.items()}

    def no_json_form(self, schema: Any) -> dict:
        return {}

    def generate_inner(self, schema: Any) -> dict:
        if schema.get("metadata") and not schema.get("metadata", {}).get(_UNSTATED):
            # pydantic's own additions (a class's name as title, its docstring, a Path's
            # "format") are not ours; a `_Note` (an annotation function) is
            schema = {**schema, "metadata": {k: v for k, v in schema["metadata"].items()
                                             if k not in _PYDANTIC_EXTRAS}}
        return super().generate_inner(schema)

    def sort(self, value: Any, parent_key: Any = None) -> Any:
        return value   # our keys keep their order ("type" first), as the specs always had

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False

    def handle_invalid_for_json_schema(self, schema: Any, error_info: str) -> dict:
        return {}

    def any_schema(self, schema: Any) -> dict:
        return {}

    def none_schema(self, schema: Any) -> dict:
        return {"type": "null"}

    def bool_schema(self, schema: Any) -> dict:
        return {"type": "boolean"}

    def int_schema(self, schema: Any) -> dict:
        return {"type": "integer"}

    def float_schema(self, schema: Any) -> dict:
        return {"type": "number"}

    def str_schema(self, schema: Any) -> dict:
        return {"type": "string"}

    def enum_schema(self, schema: Any) -> dict:
        return {"enum": [m.value for m in schema["members"]]}

    def literal_schema(self, schema: Any) -> dict:
        return {"enum": [v.value if isinstance(v, enum.Enum) else v for v in schema["expected"]]}

    def nullable_schema(self, schema: Any) -> dict:
        return self.generate_inner(schema["schema"])

    def union_schema(self, schema: Any) -> dict:
        options = [self.generate_inner(choice) for choice in core_schema.iter_union_choices(schema)]
        options = [o for o in options if o != {"type": "null"}]
        return options[0] if len(options) == 1 else {"anyOf": options}

    def _array(self, items: list) -> dict:
        """An array; its "items" only when every stated item has the same schema (None: unstated)."""
        if items and None not in items and all(i == items[0] for i in items):
            return {"type": "array", "items": items[0]}
        return {"type": "array"}

    def list_schema(self, schema: Any) -> dict:
        unstated = schema["items_schema"].get("metadata", {}).get(_UNSTATED)
        return self._array([None if unstated else self.generate_inner(schema["items_schema"])])

    set_schema = frozenset_schema = generator_schema = list_schema

    def tuple_schema(self, schema: Any) -> dict:
        return self._array([None if s.get("metadata", {}).get(_UNSTATED) else self.generate_inner(s)
                            for s in schema["items_schema"]])

    def dict_schema(self, schema: Any) -> dict:
        values = schema["values_schema"]
        if values.get("metadata", {}).get(_UNSTATED):
            return {"type": "object"}
        return {"type": "object", "additionalProperties": self.generate_inner(values)}

    def dataclass_schema(self, schema: Any) -> dict:
        return {"type": "object"}


def _inline(schema: Any, defs: dict) -> Any:
    """The schema with each `$ref` to `$defs` replaced by its definition (specs have no $defs)."""
    if isinstance(schema, list):
        return [_inline(s, defs) for s in schema]
    if not isinstance(schema, dict):
        return schema
    if "$ref" in schema:
        rest = {k: v for k, v in schema.items() if k != "$ref"}
        return _inline({**defs[schema["$ref"].rsplit("/", 1)[-1]], **rest}, defs)
    return {k: _inline(v, defs) for k, v in schema.items()}


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


@dataclass(frozen=True)
class _Parameter:
    """One parameter of a tool: its hint, read by pydantic for its schema and its validation."""
    name: str
    param: inspect.Parameter
    adapter: pydantic.TypeAdapter | None
    guessed: bool   # untyped: the type is a guess from the default

    @property
    def lenient(self) -> bool:
        """A value that does not fit is passed on as it is (as before pydantic checked them) when
        the type is a guess, or has no JSON form a model could have written (a DataFrame)."""
        return self.guessed or not self.schema

    @functools.cached_property
    def schema(self) -> dict:
        if self.adapter is None:   # no hint, or one pydantic cannot read
            return {}
        try:
            out = self.adapter.json_schema(schema_generator=_ToolSchema)
        except Exception:   # noqa: BLE001 - a type pydantic cannot write has no JSON form
            return {}
        return _inline(out, out.pop("$defs", {}))


def _adapter(hint: Any) -> pydantic.TypeAdapter | None:
    if hint is inspect.Parameter.empty:
        return None
    try:
        try:
            return pydantic.TypeAdapter(_spell(hint), config=_CONFIG)
        except pydantic.PydanticUserError:   # a dataclass or model carries its own config
            return pydantic.TypeAdapter(_spell(hint))
    except Exception:   # noqa: BLE001 - a hint pydantic cannot read: any value, no schema
        return None


def _parameters(fn: Callable) -> tuple[inspect.Signature, list[_Parameter]]:
    """The signature and the named parameters (no *args, **kwargs) of a tool function."""
    try:
        hash(fn)
    except TypeError:   # a callable object that defines __eq__ but no __hash__
        return _read_parameters(fn)
    return _parameters_cached(fn)


def _read_parameters(fn: Callable) -> tuple[inspect.Signature, list[_Parameter]]:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        raise ConfigError(f"cannot read the signature of {fn!r}; wrap it in a def with "
                          "named parameters") from None
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception:   # forward references that do not resolve: use the raw annotations
        hints = {k: p.annotation for k, p in sig.parameters.items()}
    out = []
    for name, param in sig.parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        hint = hints.get(name, param.annotation)
        guessed = hint is inspect.Parameter.empty and param.default not in (param.empty, None)
        out.append(_Parameter(name, param, _adapter(type(param.default) if guessed else hint),
                              guessed))
    return sig, out


_parameters_cached = functools.lru_cache(maxsize=512)(_read_parameters)


def schema_of(fn: Callable) -> tuple[str, dict]:
    """(description, parameters JSON schema) of a function, from its signature and docstring."""
    sig, params = _parameters(fn)
    summary, docs = _doc_sections(inspect.getdoc(fn) or "")
    props, required = {}, []
    for p in params:
        prop = copy.deepcopy(p.schema)   # the cached one stays as pydantic wrote it
        if docs.get(p.name):
            prop["description"] = docs[p.name]
        if p.param.default is inspect.Parameter.empty:
            required.append(p.name)
        else:
            try:
                json.dumps(p.param.default)
                prop["default"] = p.param.default
            except (TypeError, ValueError):
                pass
        props[p.name] = prop
    schema = {"type": "object", "properties": props, "required": required}
    if not any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values()):
        schema["additionalProperties"] = False
    name = getattr(fn, "__name__", "tool")
    return summary or f"The Python function {name}.", schema


# ---------------------------------------------------------------------------- arguments
def check_arguments(fn: Callable, arguments: Any, parameters: dict) -> dict:
    """The model's arguments checked against the signature by pydantic, converted ("3" -> 3,
    "red" -> Colour.RED); a ValueError of one line, for the model, when they do not fit."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError as exc:
            raise ValueError(f"the arguments are not JSON ({exc}); send a JSON object") from None
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise ValueError(f"the arguments must be a JSON object, not {type(arguments).__name__}")
    sig, params = _parameters(fn)
    try:
        sig.bind(**arguments)
    except TypeError as exc:
        names = ", ".join(parameters.get("properties", {})) or "none"
        raise ValueError(f"{exc}; parameters: {names}") from None
    args = dict(arguments)
    for p in params:
        if p.name not in args or p.adapter is None:
            continue
        try:
            args[p.name] = p.adapter.validate_python(args[p.name])
        except pydantic.ValidationError as exc:
            if not p.lenient:
                raise ValueError(_one_line(p.name, exc, parameters)) from None
    return args


def _one_line(name: str, exc: pydantic.ValidationError, schema: dict) -> str:
    """pydantic's first complaint about one argument, in one line."""
    error = exc.errors(include_url=False)[0]
    choices = schema.get("properties", {}).get(name, {}).get("enum")
    if error["type"] in ("enum", "literal_error") and not error["loc"] and choices:
        return f"{name} must be one of {choices}"
    where = "".join(f"[{part!r}]" for part in error["loc"])
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{name}{where}: {error['msg']}{more}"
