"""Words of a memory entry or a query, and how much two texts share (pure functions).

Words are lower-cased, split at anything that is not a letter or digit (``year-on-year`` ->
``year``, ``on``, ``year``), English stop words dropped and the rest stemmed with the Snowball
English stemmer (``reports``, ``reporting`` -> ``report``). Runs of CJK characters have no spaces
between words, so they count as overlapping character pairs (``喜欢茶`` -> ``喜欢``, ``欢茶``).
"""

from __future__ import annotations

import math
import re
import threading

import snowballstemmer

_WORD = re.compile(r"[^\W_]+")
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]+")

_STOPWORD_LIST = """
a about above after again against all am an and any are as at be because been before being below between both
but by can could did do does doing down during each few for from further had has have having he her here hers
herself him himself his how i if in into is it its itself just me more most my myself no nor not now of off on
once only or other our ours ourselves out over own same she should so some such than that the their theirs them
themselves then there these they this those through to too under until up very was we were what when where which
while who whom why will with would you your yours yourself yourselves also any anything please tell told know
remember say said ok okay thanks thank let lets us get got use used using want like really much many thing things
called named go goes going
"""
STOPWORDS = frozenset(_STOPWORD_LIST.split())
"""Words that carry no topic. ``like``, ``use``, ``remember``, ``called`` ... are here too: they say how, not what."""

_local = threading.local()


def _stemmer() -> snowballstemmer.stemmer:
    stemmer = getattr(_local, "stemmer", None)  # Snowball stemmers keep state: one per thread
    if stemmer is None:
        stemmer = _local.stemmer = snowballstemmer.stemmer("english")
    return stemmer


def words(text: str) -> list[str]:
    """The text's words, lower-cased, in order, stop words and single letters dropped (unstemmed:
    what a full-text engine is given to stem its own way)."""
    out: list[str] = []
    for word in _WORD.findall(text.lower()):
        if _CJK.search(word):
            out.extend(_cjk_pairs(word))
        elif word not in STOPWORDS and (len(word) > 1 or word.isdigit()):
            out.append(word)
    return out


def _cjk_pairs(word: str) -> list[str]:
    pairs: list[str] = []
    for part in re.split(f"({_CJK.pattern})", word):
        if not part:
            continue
        if _CJK.fullmatch(part):
            pairs.extend(part[i:i + 2] for i in range(max(1, len(part) - 1)))
        elif part not in STOPWORDS and len(part) > 1:
            pairs.append(part)
    return pairs


def terms(text: str) -> set[str]:
    """The stemmed words of ``text`` (a set)."""
    stemmer = _stemmer()
    return {w if _CJK.search(w) else stemmer.stemWord(w) for w in words(text)}


def similarity(query: set[str], entry: set[str]) -> float:
    """Lexical similarity in 0..1: the cosine of the two term sets seen as binary vectors,
    ``|Q ∩ E| / sqrt(|Q| * |E|)`` (0 when either is empty)."""
    if not query or not entry:
        return 0.0
    return len(query & entry) / math.sqrt(len(query) * len(entry))


def coverage(claim: set[str], evidence: set[str]) -> float:
    """Share of ``claim``'s terms found in ``evidence`` (0..1; 0 for an empty claim)."""
    return len(claim & evidence) / len(claim) if claim else 0.0
