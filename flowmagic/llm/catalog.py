"""Which models an endpoint serves: its GET /models list, checked before a model is chosen.

Every model choice (`configure(model=...)`, `%%flow --model`, `plan(model=...)`,
`Flow.downgrade`, the Downgrade dropdown) goes through `check_endpoint_model` (by a model id:
`endpoints.check_model`): a model the endpoint
does not list is refused with one line naming the ones it lists; an endpoint that cannot
list its models (no /models route, not reachable) cannot be checked, so the choice is
accepted with a one-line warning, said once per endpoint and model.

A list is kept per endpoint for the process; a name missing from it asks again once, so a
model pulled into Ollama a minute ago is found. FLOWMAGIC_CHECK_MODELS=0 turns the check off
(offline work; the test suite, whose loopback server answers any model name).
"""

from __future__ import annotations

import os
import threading
from typing import Any

from ..errors import ConfigError
from . import discovery
from .discovery import chat_models

__all__ = ["check_endpoint_model", "listed_models", "chat_models", "enabled", "forget", "warn"]

_SHOWN = 12

_lock = threading.Lock()
_lists: dict[str, list[str]] = {}
_warned: set[tuple[str, str]] = set()


def enabled() -> bool:
    return os.environ.get("FLOWMAGIC_CHECK_MODELS", "1").strip().lower() not in (
        "0", "no", "false", "off")


def forget() -> None:
    """Ask every endpoint again on the next check (tests, a server that changed)."""
    with _lock:
        _lists.clear()
        _warned.clear()


def _where(endpoint: Any) -> str:
    return "the embedded model" if endpoint.local else endpoint.base_url


def listed_models(endpoint: Any, *, fresh: bool = False,
                  timeout: float = 3.0) -> list[str] | None:
    """The model ids `endpoint` (an endpoints.Endpoint) lists (GET /models), or None when
    it cannot say; the embedded server serves its one model."""
    if endpoint.local:
        return [endpoint.model]
    key = endpoint.identity
    with _lock:
        if not fresh and key in _lists:
            return list(_lists[key])
    ids = discovery.list_models(endpoint.base_url, timeout, endpoint.api_key)
    if ids is not None:
        with _lock:
            _lists[key] = ids
    return ids


def _served(name: str, ids: list[str]) -> bool:
    # Ollama lists "llama3.2:latest" for what its users call "llama3.2".
    return name in ids or f"{name}:latest" in ids


def check_endpoint_model(endpoint: Any, name: str | None) -> str | None:
    """Refuse `name` when `endpoint` lists models and not this one (ConfigError, one line);
    the warning to show when the endpoint cannot be checked; None when it is served."""
    if not name or not enabled():
        return None
    ids = listed_models(endpoint)
    if ids is not None and not _served(name, ids):
        ids = listed_models(endpoint, fresh=True)   # listed since we last asked?
    if ids is None:
        return (f"cannot check the model {name!r}: {_where(endpoint)} does not list its models "
                "(GET /models failed); using it as given")
    if _served(name, ids):
        return None
    usable = chat_models(ids) or ids
    shown = ", ".join(usable[:_SHOWN]) + (f" (and {len(usable) - _SHOWN} more)"
                                          if len(usable) > _SHOWN else "")
    # (a base URL never carries a key: endpoints refuses user:key@host)
    raise ConfigError(f"{_where(endpoint)} does not serve a model {name!r}; it lists: "
                      f"{shown or '(no models)'}; choose one of those")


def warn(endpoint: Any, name: str | None, warning: str | None, say=print) -> None:
    """Say `warning` (one line) once per endpoint and model."""
    if warning is None:
        return
    with _lock:
        first = (endpoint.identity, str(name)) not in _warned
        _warned.add((endpoint.identity, str(name)))
    if first:
        say(f"flowmagic: {warning}")
