"""Label similarity, the arithmetic: which label of one list means which of the other (a
plan's nodes against a gold graph's, a subtask against tools, a failure against its repairs).

A backend is a callable `(labels_a, labels_b) -> matrix` of values in [0, 1]: TF-IDF
cosine (plain Python, deterministic), cosine of vectors from any `embed(texts)` function.
Nothing here loads a model: `llm.similarity.get_similarity` picks a backend by name (MiniLM
among them, loaded there); `flowmagic.evaluate` re-exports these names, so plan-vs-gold
callers keep using `flowmagic.evaluate.get_similarity`.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Callable, Sequence

from ..errors import ModelOutputError

__all__ = ["SIMILARITIES", "TfidfSimilarity", "EmbeddingSimilarity", "similarity_matrix"]

SIMILARITIES = ("auto", "tfidf", "embeddings", "minilm")

Matrix = list[list[float]]


_WORD = re.compile(r"[^\W_]+")
# A handful of function words: without them two unrelated steps ("Add to your
# dish", "Take your cat to a vet") look alike to a bag of words.
_STOP = frozenset(
    "a an and are as at be by for from in is it its of on or that the this to "
    "your you with".split()
)


def _tokens(text: str) -> list[str]:
    words = _WORD.findall(text.casefold())
    kept = [w for w in words if w not in _STOP]
    return kept or words


def _unit(vec: dict) -> dict:
    norm = math.sqrt(sum(x * x for x in vec.values()))
    return {k: x / norm for k, x in vec.items()} if norm else vec


def _dot(u: dict, v: dict) -> float:
    return sum(w * v.get(k, 0.0) for k, w in u.items())


class TfidfSimilarity:
    """TF-IDF cosine over lowercase word tokens, fitted on both label lists.

    Plain Python, no model, deterministic. Smoothed idf (log((1+N)/(1+df)) + 1)
    keeps words that occur in every label from vanishing when N is tiny.
    """

    name = "tfidf"

    def __call__(self, a: Sequence[str], b: Sequence[str]) -> Matrix:
        docs = [Counter(_tokens(t)) for t in [*a, *b]]
        df = Counter(w for d in docs for w in d)
        n = len(docs)
        idf = {w: math.log((1 + n) / (1 + c)) + 1.0 for w, c in df.items()}
        vecs = [_unit({w: c * idf[w] for w, c in d.items()}) for d in docs]
        left, right = vecs[: len(a)], vecs[len(a) :]
        return [[_dot(u, v) for v in right] for u in left]


class EmbeddingSimilarity:
    """Cosine similarity of vectors from `embed(texts) -> list of vectors`."""

    def __init__(self, embed: Callable[[list[str]], Sequence], name: str = "embeddings"):
        self.embed = embed
        self.name = name

    def __call__(self, a: Sequence[str], b: Sequence[str]) -> Matrix:
        texts = list(dict.fromkeys([*a, *b]))  # embed each distinct text once
        if not texts:
            return [[] for _ in a]
        vectors = list(self.embed(texts))
        if len(vectors) != len(texts):
            raise ModelOutputError(
                f"the {self.name} backend returned {len(vectors)} vectors for "
                f"{len(texts)} texts; check the embedding endpoint or use similarity='tfidf'"
            )
        unit = {t: _unit(dict(enumerate(map(float, v)))) for t, v in zip(texts, vectors)}
        return [[_dot(unit[x], unit[y]) for y in b] for x in a]


def _canon(text: str) -> str:
    return " ".join(text.casefold().split())


def similarity_matrix(similarity, a: list[str], b: list[str]) -> Matrix:
    """similarity(a, b) clamped into [0, 1], equal texts exactly 1."""
    raw = similarity(a, b) if a and b else [[] for _ in a]
    # Equal texts are exactly 1 so that identical graphs score exactly 1, not
    # 0.9999999999999998; everything else is clamped into [0, 1].
    return [
        [1.0 if _canon(x) == _canon(y) else min(1.0, max(0.0, float(s))) for y, s in zip(b, row)]
        for x, row in zip(a, raw)
    ]
