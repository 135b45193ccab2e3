"""Embedding calls: one vector per text from an endpoint's `/embeddings`, each text cached on
its own, and an endpoint that cannot embed remembered as such."""

from __future__ import annotations

import asyncio
import time

from . import endpoints as _endpoints
from .cache_keys import cache_key
from .connections import Connections
from .endpoints import Endpoint, scrub
from .failures import EmbeddingsUnsupportedError, Retryable, retryable, status_message
from .usage import call_cost, checked_usage
from ..errors import EndpointError
from .._internal.aio import run_blocking

__all__ = ["Embeddings"]


# Statuses that mean "this endpoint does not embed" until it has embedded once: llama.cpp
# started without --embedding answers 500, chat-only servers 404/405/501, and a chat
# model named as the embedding model 400/422.
_NO_EMBEDDINGS = {400, 404, 405, 422, 500, 501}
_EMBED_BATCH = 256


class Embeddings(Connections):
    """The embedding half of `LLM`."""

    def embeddings_supported(self, model: str | None = None) -> bool | None:
        """Whether the endpoint of `model` embeds: True / False once known, None before."""
        endpoint, _ = _endpoints.resolve(model)
        return self._embeds.get(endpoint.identity)

    async def embed(self, texts: list[str] | str, *, model: str | None = None,
                    cache: bool = True, run_id: str | None = None,
                    purpose: str = "embed") -> list[list[float]]:
        """One vector per text from the endpoint's `/embeddings`, in order.

        Texts are cached one by one (endpoint, model, text), so only new ones are sent;
        each request is logged as a call, and a request answered wholly from the cache
        as one cached call. An endpoint that cannot embed raises
        `EmbeddingsUnsupportedError`, at once on later calls. Blank texts get [].
        """
        texts = [texts] if isinstance(texts, str) else [str(t) for t in texts]
        endpoint, model_name = _endpoints.resolve(model)
        where = "the embedded model" if endpoint.local else endpoint.base_url
        if self._embeds.get(endpoint.identity) is False:
            raise EmbeddingsUnsupportedError(f"{where} has no /embeddings; use TF-IDF similarity")
        if not model_name:
            model_name = await self._first_model(endpoint)
        keys = {t: cache_key(endpoint.identity, model_name, [t], {"embed": True})
                for t in texts if t.strip()}
        found: dict[str, list[float]] = {}
        hits = self.store.cache_get_many(list(keys.values())) if cache else []
        for text, hit in zip(keys, hits):
            if hit is not None:
                found[text] = hit["vector"]
        missing = [t for t in keys if t not in found]
        log = dict(endpoint=endpoint.identity, model=f"{endpoint.name}:{model_name}",
                   messages=[{"role": "input", "content": t} for t in missing or list(keys)],
                   params={"embed": True}, run_id=run_id, purpose=purpose)
        if not missing:
            self.store.log_call(**log, response={"vectors": len(keys)}, cached=True)
            return [found.get(t, []) for t in texts]
        started, tokens = time.perf_counter(), 0
        try:
            for i in range(0, len(missing), _EMBED_BATCH):
                batch = missing[i:i + _EMBED_BATCH]
                vectors, used = await self._embed_with_retries(endpoint, model_name, batch)
                found.update(zip(batch, vectors))
                tokens += used
        except EndpointError as exc:
            self.store.log_call(**log, error=str(exc), latency_s=time.perf_counter() - started)
            raise
        self._embeds[endpoint.identity] = True
        self.store.log_call(**log, response={"vectors": len(missing)}, input_tokens=tokens,
                            latency_s=time.perf_counter() - started,
                            cost_usd=call_cost(endpoint, model_name, tokens, 0))
        for text in missing if cache else ():
            self.store.cache_put(keys[text], {"vector": found[text]})
        return [found.get(t, []) for t in texts]

    def embed_sync(self, texts: list[str] | str, **kwargs) -> list[list[float]]:
        """`embed` for scripts and sync callers; inside a running loop it uses a worker thread."""
        return run_blocking(lambda: self.embed(texts, **kwargs), close=self.aclose)

    async def _embed_with_retries(self, endpoint: Endpoint, model: str, texts: list[str]):
        last: Exception | None = None
        for attempt in range(self.max_retries + 1):
            if attempt:
                await asyncio.sleep(self._backoff(attempt, last))
            try:
                return await self._embed_once(endpoint, model, texts)
            except Retryable as exc:
                last = exc
        where = "the embedded model" if endpoint.local else endpoint.base_url
        raise EndpointError(f"{where} /embeddings failed {self.max_retries + 1} times ({last}); "
                            "check that the server is up, or use TF-IDF similarity")

    async def _embed_once(self, endpoint: Endpoint, model: str, texts: list[str]):
        import openai

        client = await self._client(endpoint)
        try:
            async with self._slot(endpoint), asyncio.timeout(
                    None if endpoint.local else self.timeout):
                response = await client.embeddings.create(model=model, input=texts,
                                                          encoding_format="float")
        except TimeoutError:
            raise Retryable(f"no answer within {self.timeout:g} s") from None
        except openai.APIStatusError as exc:
            status = exc.status_code
            if status in _NO_EMBEDDINGS and not self._embeds.get(endpoint.identity):
                self._embeds[endpoint.identity] = False
                where = "the embedded model" if endpoint.local else endpoint.base_url
                raise EmbeddingsUnsupportedError(
                    f"{where} cannot embed with {model!r} (HTTP {status}: "
                    f"{' '.join(scrub(str(exc)).split())[:120]}); use TF-IDF similarity") from None
            raise retryable(exc, self.timeout) or EndpointError(
                status_message(endpoint, model, exc)) from None
        except (openai.APIConnectionError, openai.APIResponseValidationError, ValueError,
                AttributeError) as exc:
            raise retryable(exc, self.timeout) from None
        data = sorted(getattr(response, "data", None) or [], key=lambda d: d.index)
        if len(data) != len(texts):
            raise Retryable(f"{len(data)} vectors for {len(texts)} texts")
        used = checked_usage(endpoint, model, (getattr(getattr(response, "usage", None),
                                               "prompt_tokens", None), 0),
                             (sum(len(t) for t in texts), 0), self._by_size)[0]
        return [[float(x) for x in d.embedding] for d in data], used
