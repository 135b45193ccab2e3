"""How a call fails: the errors callers catch, the failures another attempt may cure
(`Retryable`), and the one line a user reads for each."""

from __future__ import annotations

from .endpoints import Endpoint, scrub
from ..errors import EndpointError, ModelOutputError, TruncatedError

__all__ = ["ToolsUnsupportedError", "EmbeddingsUnsupportedError", "Retryable", "retryable",
           "output_error", "status_message", "server_where", "refused", "RETRY_STATUS"]

RETRY_STATUS = {408, 409, 429, 500, 502, 503, 504}


class ToolsUnsupportedError(EndpointError):
    """The endpoint refused a request with `tools`; use a JSON action protocol instead."""


class EmbeddingsUnsupportedError(EndpointError):
    """The endpoint has no usable /embeddings (remembered per endpoint by `LLM.embed`)."""


class Retryable(Exception):
    """A failure that another attempt may not meet (the call's retries catch it)."""

    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


def retryable(exc: Exception, timeout: float) -> "Retryable | None":
    """The retryable form of a transport or HTTP failure, or None when retrying cannot help
    (a 4xx other than 408/409/429)."""
    import openai

    if isinstance(exc, openai.APIStatusError):
        if exc.status_code not in RETRY_STATUS:
            return None
        retry_after = exc.response.headers.get("retry-after")
        try:
            wait = float(retry_after) if retry_after else None
        except ValueError:
            wait = None
        return Retryable(f"HTTP {exc.status_code}", wait)
    if isinstance(exc, openai.APITimeoutError):
        return Retryable(f"no answer within {timeout:g} s")
    if isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__ or exc
        return Retryable(scrub(f"cannot connect: {type(cause).__name__}: {cause}"))
    return Retryable(scrub(f"malformed response: {exc}"))


def output_error(error: str, call_id, tokens_in: int, tokens_out: int, cost: float,
                  text: str = ""):
    """The error for an answer that was not the JSON asked for; it carries the call's
    id, usage and text, because the call happened, was paid for, and a cut-off answer
    can be continued."""
    exc = (TruncatedError if "cut off" in error else ModelOutputError)(error)
    exc.call_id, exc.input_tokens, exc.output_tokens, exc.cost_usd = (
        call_id, tokens_in, tokens_out, cost)
    exc.text = text
    return exc


def status_message(endpoint: Endpoint, model: str, exc) -> str:
    """The one line for an HTTP error that retrying cannot help."""
    where = "the embedded model" if endpoint.local else endpoint.base_url
    if exc.status_code in (401, 403):
        env = endpoint.key_env or "FLOWMAGIC_API_KEY"
        return f"{where} refused the API key (HTTP {exc.status_code}); check {env}"
    if exc.status_code == 404:
        return (f"{where} has no model {model!r} (HTTP 404); "
                "check the model name with `%flow models` or FLOWMAGIC_MODEL")
    # Some endpoints and proxies quote the request's headers back: the key leaves here.
    said = " ".join(scrub(str(exc)).split())
    return f"{where} rejected the request (HTTP {exc.status_code}): {said[:200]}"


def server_where(endpoint: Endpoint) -> str:
    return "the embedded model's server" if endpoint.local else f"the server at {endpoint.base_url}"


def refused(exc: Exception) -> bool:
    """Whether a connection error is a refused connection (somewhere in its causes)."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, ConnectionRefusedError) or "connection refused" in str(exc).lower():
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False
