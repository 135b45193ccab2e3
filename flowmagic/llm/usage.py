"""What a call used and cost: token counts as an endpoint reported them when they could be
true, else the call's size; its price in USD, cached input tokens at their own rate."""

from __future__ import annotations

import json
import sys
from typing import Any

from .endpoints import Endpoint, cached_price_of, price_of

__all__ = ["checked_usage", "request_chars", "call_cost", "cached_count"]

_MAX_TOKENS_REPORTED = 10**9   # more than any context window; beyond it the count is a lie
_CHARS_PER_TOKEN = 4           # the size estimate (Flow.estimate's too)
# No tokenizer averages more than ~8 characters a token over a text: a count below a
# sixteenth of the characters is not one an endpoint could really have used.
_MOST_CHARS_PER_TOKEN = 16


def _token_count(value: Any, chars: int) -> int | None:
    """A usage count as the endpoint reported it when it could be true for `chars`
    characters: a whole number (not a bool, float or text) from chars / 16 to 10**9. Else
    None: the caller prices the call by its size, so a hostile or careless endpoint
    (negative, absurd, missing counts) can neither lower the spent budget nor abort the run."""
    if type(value) is not int or not chars // _MOST_CHARS_PER_TOKEN <= value <= _MAX_TOKENS_REPORTED:
        return None
    return value


def _by_size(chars: int) -> int:
    return -(-chars // _CHARS_PER_TOKEN)


def request_chars(messages: list[dict]) -> int:
    """The size of a request: the characters of its messages' texts and tool calls (the
    JSON around them is not what a model reads)."""
    chars = 0   # (a loop, not a generator: this runs on every call)
    for m in messages:
        for k, v in m.items():
            if k != "role" and v:
                chars += len(v) if isinstance(v, str) else len(json.dumps(v))
    return chars


def call_cost(endpoint: Endpoint, model: str, tokens_in: int, tokens_out: int,
          cached_in: int = 0) -> float | None:
    """USD of a call, or None when the model has no known price (logged as unknown, never
    as free: configure(prices=...) gives it one). `cached_in` of the input tokens are paid
    at the model's cached-input rate."""
    price = price_of(model, local=endpoint.local)
    if not price:
        return None
    cached_rate = cached_price_of(model, local=endpoint.local) if cached_in else 0.0
    return ((tokens_in - cached_in) * price[0] + cached_in * cached_rate
            + tokens_out * price[1]) / 1_000_000


def cached_count(value: Any, tokens_in: int, by_size: bool) -> int:
    """The cached input tokens an endpoint reported when they could be true: a whole number
    from 0 to the call's input tokens as reported. Else 0: a call priced by its size, or a
    count that would price more tokens at the cached rate than were sent, is paid in full."""
    if by_size or type(value) is not int or not 0 <= value <= tokens_in:
        return 0
    return value


def checked_usage(endpoint: Endpoint, model: str, reported: tuple, chars: tuple[int, int],
                  said: set[str]) -> tuple[int, int, bool]:
    """(input tokens, output tokens, priced by size): each reported count when it could
    be true (`_token_count`), else the request's or the answer's characters / 4; said
    once per model (`said` holds the models told of) when that is what prices its calls."""
    counts = [_token_count(reported[0], chars[0]), _token_count(reported[1], chars[1])]
    if None not in counts:
        return counts[0], counts[1], False
    model_id = f"{endpoint.name}:{model}"
    price = price_of(model, local=endpoint.local)
    if price and any(price) and model_id not in said:
        said.add(model_id)
        print(f"flowmagic: {model_id} reported usage that is not a count of tokens "
              f"(prompt_tokens={reported[0]!r:.30}, completion_tokens={reported[1]!r:.30}): "
              "its calls are priced by their size (characters / 4) instead", file=sys.stderr)
    return (*(_by_size(c) if n is None else n for n, c in zip(counts, chars)), True)
