"""Where models live: endpoint resolution, named endpoints, model ids and prices.

Resolution of the default endpoint, first match wins: `configure(...)`;
FLOWMAGIC_BASE_URL / FLOWMAGIC_API_KEY / FLOWMAGIC_MODEL; the openai SDK's own
OPENAI_BASE_URL / OPENAI_API_KEY; a local server the user already runs (Ollama, LM Studio,
llama.cpp, vLLM on their usual ports, see discovery.py); else the embedded model (local.py).
Keys are held in memory only; `Endpoint.__repr__` and `describe()` never show them.

An endpoint is local (`Endpoint.self_hosted`: a server the user runs, slow by nature, with
a queue of its own) when it is the embedded model, or its address is this machine or the
private network: localhost, a `.local` name, a loopback, private or link-local IP (so a
discovered server is too). `configure(self_hosted=...)` says otherwise for one endpoint,
FLOWMAGIC_SELF_HOSTED=1/0 for every one but the embedded model. Any other is hosted.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import threading
from dataclasses import dataclass, field
from urllib.parse import urlparse, urlsplit

from ..errors import ConfigError
from ..store import add_secret_source

__all__ = [
    "Endpoint",
    "configure",
    "reset",
    "snapshot",
    "restore",
    "resolve",
    "embedding_model",
    "endpoints",
    "price_of",
    "cached_price_of",
    "set_prices",
    "PRICES",
    "CACHED_PRICES",
    "LOCAL_MODEL",
    "api_keys",
    "scrub",
    "check_model",
]

LOCAL_MODEL = "smollm2-135m-instruct"
OPENAI_URL = "https://api.openai.com/v1"
OPENAI_DEFAULT_MODEL = "gpt-4o-mini"

# USD per million (input, output) tokens; matched by the longest prefix of the model name.
PRICES: dict[str, tuple[float, float]] = {
    "gpt-4o-mini": (0.15, 0.60),
    "gpt-4o": (2.50, 10.00),
    "gpt-4.1-nano": (0.10, 0.40),
    "gpt-4.1-mini": (0.40, 1.60),
    "gpt-4.1": (2.00, 8.00),
    "gpt-5-nano": (0.05, 0.40),
    "gpt-5-mini": (0.25, 2.00),
    "gpt-5": (1.25, 10.00),
    "o3-mini": (1.10, 4.40),
    "o4-mini": (1.10, 4.40),
    "o3": (2.00, 8.00),
    "gpt-3.5-turbo": (0.50, 1.50),
    "deepseek-chat": (0.27, 1.10),
    "deepseek-reasoner": (0.55, 2.19),
    "text-embedding-3-small": (0.02, 0.0),
    "text-embedding-3-large": (0.13, 0.0),
    LOCAL_MODEL: (0.0, 0.0),
}
# USD per million input tokens the endpoint reports as served from its prompt cache
# (`usage.prompt_tokens_details.cached_tokens`), for the same keys as PRICES; a model
# without an entry here pays its input price for them.
CACHED_PRICES: dict[str, float] = {
    "gpt-4o-mini": 0.075,
    "gpt-4o": 1.25,
    "gpt-4.1-nano": 0.025,
    "gpt-4.1-mini": 0.10,
    "gpt-4.1": 0.50,
    "gpt-5-nano": 0.005,
    "gpt-5-mini": 0.025,
    "gpt-5": 0.125,
    "o3-mini": 0.55,
    "o4-mini": 0.275,
    "o3": 0.50,
    "deepseek-chat": 0.07,
    "deepseek-reasoner": 0.14,
    LOCAL_MODEL: 0.0,
}


@dataclass
class Endpoint:
    name: str
    base_url: str
    model: str | None
    api_key: str = field(default="", repr=False)
    key_env: str | None = None   # the environment variable the key came from, if any
    local: bool = False          # the embedded llama.cpp server
    concurrency: int | None = None  # requests it can serve at once (None: the LLM's limit)
    hosting: str | None = None   # "local", "hosted", or None: by FLOWMAGIC_SELF_HOSTED, the address

    @property
    def self_hosted(self) -> bool:
        """A server the user runs (see the module docstring): calls to it are streamed,
        timed on progress and queued on our side (llm.queue)."""
        if self.local:
            return True
        if self.hosting is not None:
            return self.hosting == "local"
        said = os.environ.get("FLOWMAGIC_SELF_HOSTED", "").strip().lower()
        if said in ("0", "1", "no", "yes", "false", "true"):
            return said in ("1", "yes", "true")
        return _nearby(self.base_url)

    @property
    def identity(self) -> str:
        """What the cache key uses: stable across ports for the embedded model."""
        return "local" if self.local else self.base_url.rstrip("/")

    def describe(self) -> dict:
        return {
            "name": self.name,
            "base_url": "embedded" if self.local else self.base_url,
            "model": self.model,
            "key": self.key_env or ("set" if self.api_key else "none"),
            "key_set": bool(self.api_key) or self.local,
        }


@functools.lru_cache(maxsize=256)
def _nearby(base_url: str) -> bool:
    """Whether an endpoint's address is this machine or the private network."""
    host = (urlsplit(base_url).hostname or "").lower()
    if host == "localhost" or host.endswith((".localhost", ".local")):
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    return ip.is_loopback or ip.is_private or ip.is_link_local


_lock = threading.Lock()
_configured: dict[str, Endpoint] = {}


def _check_url(url: str, source: str) -> str:
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ConfigError(
            f"{source} {_without_userinfo(url)!r} is not an http(s) URL; use something like "
            "http://localhost:11434/v1 (Ollama) or https://api.openai.com/v1"
        )
    if "@" in parsed.netloc:   # user:password@host: a key there would be stored and logged
        host = parsed.netloc.rpartition("@")[2]
        raise ConfigError(
            f"{source} carries a user name or key before {host!r}; give the key as an API key "
            "(FLOWMAGIC_API_KEY, or configure(api_key=...)) and the URL without it"
        )
    return url.rstrip("/")


def _without_userinfo(url: str) -> str:
    head, sep, rest = url.partition("://")
    return f"{head}{sep}{rest.split('/', 1)[0].rpartition('@')[2]}" if sep else "(not a URL)"


# Shorter "keys" are placeholders ("ollama", "not-needed", "sk-test"): hiding them would
# garble ordinary text, and they guard nothing.
_MIN_SECRET = 12
_KEY_ENV = ("FLOWMAGIC_API_KEY", "OPENAI_API_KEY")


_keys_seen: tuple[tuple, list[str]] = ((), [])


def api_keys() -> list[str]:
    """Every API key flowmagic knows of (configured endpoints and the key variables).

    Every stored string is scrubbed with these, several times per model call: the list is
    rebuilt only when a key variable or a configured key has changed."""
    global _keys_seen
    env = os.environ
    with _lock:
        given = (env.get(_KEY_ENV[0], ""), env.get(_KEY_ENV[1], ""),
                 *[e.api_key for e in _configured.values()])
    if given == _keys_seen[0]:
        return list(_keys_seen[1])
    keys = {k.strip() for k in given if k and len(k.strip()) >= _MIN_SECRET}
    found = sorted(keys, key=len, reverse=True)
    _keys_seen = (given, found)
    return list(found)


def scrub(text: str) -> str:
    """`text` with every configured API key replaced by "[key hidden]".

    Used for what flowmagic stores, prints or sends back to a model: endpoint error
    bodies (some quote the request's headers), replies, messages; the store applies it to
    every string it writes (see store.add_secret_source)."""
    if not isinstance(text, str):
        return text
    for key in api_keys():
        if key in text:
            text = text.replace(key, "[key hidden]")
    return text


add_secret_source(api_keys)


def configure(base_url: str | None = None, api_key: str | None = None,
              model: str | None = None, *, name: str = "default",
              prices: dict[str, tuple[float, float]] | None = None,
              concurrency: int | None = None,
              self_hosted: bool | None = None) -> Endpoint | None:
    """Register an endpoint (the default one unless `name` is given) and/or prices.

    `configure(base_url="http://localhost:11434/v1", model="llama3.2")` points every call
    at Ollama; `configure(name="cheap", base_url=..., model=...)` adds a second endpoint
    that nodes can use as `model="cheap"` or `"cheap:other-model"`. `concurrency` is how
    many requests the server runs at once (a local server's is learned when not given);
    `self_hosted` says whether it is a server you run (None: by its address).
    """
    if prices:
        set_prices(prices)
    if base_url is None and api_key is None and model is None:
        return None
    if ":" in name or not name:
        raise ConfigError(f"endpoint name {name!r} must be a non-empty word without ':'")
    if base_url is None:
        base_url = OPENAI_URL if api_key else None
    if base_url is None and model is not None and name == "default":
        # Only a model: keep the endpoint resolution, override the model.
        current = resolve_default(ignore_configured=True)
        endpoint = Endpoint(name, current.base_url, model, current.api_key,
                            current.key_env, current.local, current.concurrency,
                            current.hosting)
    elif base_url is None:
        raise ConfigError(f"endpoint {name!r} needs a base_url (or an api_key for OpenAI)")
    else:
        endpoint = Endpoint(name, _check_url(base_url, "base_url"), model, api_key or "",
                            concurrency=concurrency)
    if concurrency is not None:
        if not isinstance(concurrency, int) or isinstance(concurrency, bool) or concurrency < 1:
            raise ConfigError(f"concurrency {concurrency!r} must be a whole number of at least 1")
        endpoint.concurrency = concurrency
    if self_hosted is not None:
        endpoint.hosting = "local" if self_hosted else "hosted"
    from . import catalog   # a model the endpoint does not list is refused before it is kept

    warning = catalog.check_endpoint_model(endpoint, model)
    with _lock:
        _configured[name] = endpoint
    catalog.warn(endpoint, model, warning)
    return endpoint


def snapshot() -> dict[str, Endpoint]:
    """The configured endpoints by name, a copy (to hand to another process, see `restore`)."""
    with _lock:
        return dict(_configured)


def restore(configured: dict[str, Endpoint]) -> None:
    """Make `configured` (what `snapshot` returned) the configured endpoints."""
    with _lock:
        _configured.clear()
        _configured.update(configured)


def reset() -> None:
    """Forget every configure() call (tests, or a fresh start in a notebook)."""
    with _lock:
        _configured.clear()


def resolve_default(*, ignore_configured: bool = False) -> Endpoint:
    if not ignore_configured:
        with _lock:
            if "default" in _configured:
                return _configured["default"]
    env = os.environ
    if env.get("FLOWMAGIC_BASE_URL") or env.get("FLOWMAGIC_API_KEY"):
        url = env.get("FLOWMAGIC_BASE_URL") or OPENAI_URL
        return Endpoint("default", _check_url(url, "FLOWMAGIC_BASE_URL"),
                        env.get("FLOWMAGIC_MODEL") or None, env.get("FLOWMAGIC_API_KEY", ""),
                        "FLOWMAGIC_API_KEY" if env.get("FLOWMAGIC_API_KEY") else None)
    if env.get("OPENAI_BASE_URL") or env.get("OPENAI_API_KEY"):
        url = env.get("OPENAI_BASE_URL") or OPENAI_URL
        model = env.get("FLOWMAGIC_MODEL") or (OPENAI_DEFAULT_MODEL if url == OPENAI_URL else None)
        return Endpoint("default", _check_url(url, "OPENAI_BASE_URL"), model,
                        env.get("OPENAI_API_KEY", ""),
                        "OPENAI_API_KEY" if env.get("OPENAI_API_KEY") else None)
    return _discovered() or _local()


def _discovered() -> Endpoint | None:
    """The first local server found running with a chat model (said once per process)."""
    from . import discovery

    server = discovery.chosen()
    return Endpoint("default", server.base_url, server.model) if server else None


def endpoints() -> list[Endpoint]:
    """Every endpoint a model id can name: the default first, then the named ones."""
    default = resolve_default()
    with _lock:
        named = [e for n, e in _configured.items() if n != "default"]
    return [default, *named]


def _local() -> Endpoint:
    return Endpoint("local", "embedded", LOCAL_MODEL, local=True, concurrency=1)


def resolve(model: str | None = None) -> tuple[Endpoint, str | None]:
    """(endpoint, model name) for a model id; the model may be None (ask the endpoint)."""
    if model in (None, "", "default"):
        endpoint = resolve_default()
        return endpoint, endpoint.model
    if model in ("local", "embedded") or model.startswith("local:"):
        return _local(), LOCAL_MODEL
    prefix, sep, rest = model.partition(":")
    with _lock:
        named = _configured.get(prefix) if prefix != "default" else None
    if named is not None:
        return named, rest or named.model
    if prefix == "default" and sep:
        return resolve_default(), rest
    # A plain model name (it may contain ':' itself, as Ollama's "llama3.2:1b" does).
    return resolve_default(), model


def check_model(model: str | None, *, say=print) -> None:
    """Check a model id as `resolve` reads it ("name", "endpoint:name") against what its
    endpoint lists (see catalog.py): refused with one line when not listed; accepted with one
    warning (said to `say`, once) when the endpoint cannot list its models."""
    from . import catalog

    if model in (None, "", "default"):
        return
    endpoint, name = resolve(model)   # a malformed id is refused even with the check off
    catalog.warn(endpoint, name, catalog.check_endpoint_model(endpoint, name), say)


def set_prices(prices: dict[str, tuple[float, ...]]) -> None:
    """Add or change prices: {model name or prefix: (USD per 1M input, per 1M output)}, or
    (input, output, cached input) for an endpoint that bills its prompt cache's tokens
    at a rate of their own."""
    for name, pair in prices.items():
        if len(pair) not in (2, 3) or any(not isinstance(p, (int, float)) or isinstance(p, bool)
                                          or not 0 <= p < float("inf") for p in pair):
            raise ConfigError(f"price for {name!r} must be (input, output) or (input, output, "
                              "cached input) USD per million tokens")
        PRICES[name] = (float(pair[0]), float(pair[1]))
        if len(pair) == 3:
            CACHED_PRICES[name] = float(pair[2])
        else:   # a new input price: an old cached rate would no longer be its share
            CACHED_PRICES.pop(name, None)


def price_of(model: str | None, *, local: bool = False) -> tuple[float, float] | None:
    """(input, output) USD per million tokens, or None when the model is not priced."""
    if local:
        return (0.0, 0.0)
    best = _price_key(model)
    return PRICES[best] if best else None


def cached_price_of(model: str | None, *, local: bool = False) -> float | None:
    """USD per million cached input tokens: the cached rate of the price table's entry
    that prices `model`, or its input price when that entry has none (None: unpriced)."""
    if local:
        return 0.0
    best = _price_key(model)
    if not best:
        return None
    return CACHED_PRICES.get(best, PRICES[best][0])


def _price_key(model: str | None) -> str | None:
    """The price table's key for `model`: its longest matching prefix."""
    if not model:
        return None
    name = model.rsplit("/", 1)[-1].lower()
    global _price_index
    known = tuple(PRICES)   # PRICES is public and may be edited: re-index when its keys change
    if _price_index[0] != known:
        _price_index = (known, {})
    matches = _price_index[1]
    if name not in matches:
        matches[name] = max((k for k in known if name.startswith(k.lower())), key=len,
                            default=None)
    return matches[name]


# (the price table's keys, {lower-case model name: its longest matching key}) - one scan
# of the table per model name, not one per call
_price_index: tuple[tuple, dict[str, str | None]] = ((), {})


def embedding_model(model: str | None, embed_model: str | None = None) -> str | None:
    """The model asked for vectors: `embed_model`, else $FLOWMAGIC_EMBED_MODEL, else OpenAI's
    small embedding model on api.openai.com, else `model` itself (llama.cpp, vLLM and the
    loopback embed with the model they serve)."""
    import os

    chosen = embed_model or os.environ.get("FLOWMAGIC_EMBED_MODEL")
    if chosen:
        return chosen
    endpoint, _ = resolve(model)
    if endpoint.base_url.rstrip("/") == OPENAI_URL:
        return ("" if endpoint.name == "default" else f"{endpoint.name}:") + "text-embedding-3-small"
    return model
