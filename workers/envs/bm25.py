"""Okapi BM25 over a small in-memory corpus: the local search index of the `search` environment.

score(q, d) = sum over query terms t of
    idf(t) * tf(t,d) * (k1 + 1) / (tf(t,d) + k1 * (1 - b + b * |d| / avgdl)),
idf(t) = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5)) (the always-positive variant of Lucene).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

TOKEN_RE = re.compile(r"[a-z0-9]+")


def terms(text: str) -> list[str]:
    return TOKEN_RE.findall(text.lower())


class BM25:
    def __init__(self, docs: Sequence[str], k1: float = 1.5, b: float = 0.75) -> None:
        self.docs = list(docs)
        self.k1, self.b = k1, b
        self.tf = [Counter(terms(d)) for d in self.docs]
        self.lengths = [sum(c.values()) for c in self.tf]
        self.avgdl = (sum(self.lengths) / len(self.lengths)) if self.lengths else 0.0
        df: Counter[str] = Counter()
        for c in self.tf:
            df.update(c.keys())
        n = len(self.docs)
        self.idf = {t: math.log(1.0 + (n - f + 0.5) / (f + 0.5)) for t, f in df.items()}

    def scores(self, query: str) -> list[float]:
        q = terms(query)
        out = []
        for tf, dl in zip(self.tf, self.lengths, strict=True):
            s = 0.0
            norm = self.k1 * (1.0 - self.b + self.b * dl / self.avgdl) if self.avgdl else self.k1
            for t in q:
                f = tf.get(t, 0)
                if f:
                    s += self.idf[t] * f * (self.k1 + 1.0) / (f + norm)
            out.append(s)
        return out

    def search(self, query: str, k: int = 3) -> list[tuple[int, float]]:
        """Top-k (doc index, score) with a positive score, best first; ties by index."""
        scored = [(i, s) for i, s in enumerate(self.scores(query)) if s > 0]
        scored.sort(key=lambda x: (-x[1], x[0]))
        return scored[:k]
