"""Words of a memory entry or a query, and how much two texts share (pure functions).

Text is first NFKC-normalised (full-width ``ＶＳ３`` -> ``VS3``, half-width katakana -> full
width: what Elasticsearch's ``cjk_width`` filter does) and lower-cased.

**Scripts with spaces between words** (Latin, Cyrillic, ...): split at anything that is not a
letter or digit (``year-on-year`` -> ``year``, ``on``, ``year``), English stop words dropped and
the rest stemmed with the Snowball English stemmer (``reports``, ``reporting`` -> ``report``).

**Chinese and Japanese** have no spaces between words, and a full-text engine's default
tokenizer (SQLite FTS5 ``unicode61``, PostgreSQL's parser) keeps a whole run of such characters as
one token, so "茶" or "喜欢" never found "我喜欢喝乌龙茶". Dictionary-free analysis, in the way of
Lucene's ``CJKBigramFilter`` and Elasticsearch's ``cjk`` analyzer:

1. a run of CJK characters is cut at stop words (``CJK_STOPWORDS``: pronouns, particles, the
   copula, question words, "very"/"most", and the how-not-what verbs the English list has:
   "remember", "called", "please"), so "我最喜欢的颜色是什么" -> "喜欢", "颜色"; "the user"
   (``CJK_WORDS``) is cut out as a word of its own;
2. each piece is cut where the script changes (Han | kana | Hangul: "好きな" -> "好", "きな");
3. a Han (Chinese character, kanji) piece gives its **characters** as terms: most Chinese words
   are one or two characters, and a shared character is a partial word matched ("茶" finds
   "乌龙茶"); a kana or Hangul piece gives **overlapping pairs** (a kana is a sound, not a
   morpheme: "コーヒー" -> "コー", "ーヒ", "ヒー"), and a lone hiragana (okurigana, a particle
   left over) is dropped.

The choice, measured on the recall benchmark's 55 Chinese facts and questions
(``tests/memory_facts.py``, ``recall.rescore`` over all of them): characters after stop words,
precision 0.931 / recall 0.982; pairs with a lone character kept (``CJKBigramFilter``'s default)
0.904 / 0.855: a question's one-character word ("车", "书") never meets the fact's longer one;
pairs and characters 0.945 / 0.945: a three-character word counts five times and outweighs the
topic; characters without stop words 0.491 / 1.0; whole runs (the default tokenizers) 1.0 / 0.055.
Trigram indexes (SQLite FTS5 ``trigram``, PostgreSQL ``pg_trgm``) were the other option: they
cannot index the one- and two-character words most Chinese words are (FTS5 3.40 returns no row
for ``LIKE '%茶%'``, so those need an unindexed scan), and ``pg_trgm`` ignores CJK characters in a
database whose ``LC_CTYPE`` is ``C``. Pairs still decide whether one text states another
(``pair_terms``, ``grounding``: the evidence check, restatements), where a shared character is
not a shared word.

The full-text index is given ``index_text``: the text with every CJK character standing alone,
so both engines index single characters with their default tokenizers (FTS5 ``unicode61``, the
``english`` configuration on PostgreSQL), and ``words`` is what a query searches them for.
"""

from __future__ import annotations

import functools
import math
import re
import threading
import unicodedata

import snowballstemmer

_WORD = re.compile(r"[^\W_]+")
_HAN = "\u3005\u3007\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f"
_KANA = "\u3041-\u309f\u30a1-\u30fa\u30fc-\u30ff"
_HANGUL = "\u1100-\u11ff\u3131-\u318e\uac00-\ud7af"
_CJK = re.compile(f"[{_HAN}{_KANA}{_HANGUL}]+")
_CJK_CHAR = re.compile(f"[{_HAN}{_KANA}{_HANGUL}]")
_SCRIPT = re.compile(f"(?P<han>[{_HAN}]+)|(?P<kana>[{_KANA}]+)|(?P<hangul>[{_HANGUL}]+)")
_HIRAGANA = re.compile("[\u3041-\u309f]")
_DIGITS = re.compile(r"[0-9]+")

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

_CJK_STOPWORD_LIST = """
的 了 是 我 你 您 他 她 它 们 們 咱 吗 嗎 呢 吧 啊 呀 嘛 在 和 与 與 跟 也 很 最 把 被 这 這 那 哪 谁 誰 几 幾
什么 什麼 怎么 怎麼 怎样 怎樣 多少 还是 還是 这个 這個 那个 那個 哪个 哪個 一个 一個
叫 请 請 记住 記住 记得 記得 告诉 告訴 知道
の は が を に で と も へ や か ね よ から まで より です でした ます ました ください
私 僕 俺 あなた 何 なに 誰 だれ どこ いつ どう どの どれ どんな これ それ あれ この その あの 覚えて 教えて
"""
CJK_STOPWORDS = frozenset(_CJK_STOPWORD_LIST.split())
"""Chinese (simplified and traditional) and Japanese words that carry no topic: pronouns
("我", "私"), particles ("的", "了", "吗", "の", "は"), the copula ("是", "です"), question words
("什么", "哪", "何"), degree words ("很" very, "最" most), and the verbs the English list has
("记住" remember, "叫" called, "请" please). Kept small: a word listed here is cut out of every
longer word that holds it too (both the query and the entry, so they still meet)."""
CJK_WORDS = frozenset({"用户", "用戶", "ユーザー"})
"""Words cut out of a run and kept whole: "the user", as a model writes about them in an entry
("用户住在杭州"), is a word like English "user", neither glued to the next character ("户住") nor
dropped."""
_CJK_STOP = re.compile("(" + "|".join(map(re.escape, sorted(CJK_WORDS))) + ")|"
                       + "|".join(re.escape(w) for w in sorted(CJK_STOPWORDS, key=len, reverse=True)))

_local = threading.local()
STEMS_CACHED = 50_000
"""Distinct words whose stems are remembered (some 10 MB at most)."""


def _stemmer() -> snowballstemmer.stemmer:
    stemmer = getattr(_local, "stemmer", None)  # Snowball stemmers keep state: one per thread
    if stemmer is None:
        stemmer = _local.stemmer = snowballstemmer.stemmer("english")
    return stemmer


@functools.lru_cache(maxsize=STEMS_CACHED)
def _stem(word: str) -> str:
    """``word``'s Snowball stem, remembered: a turn stems every Latin word of its message for
    recall, and the words of a chat repeat (a stem costs 5-40 µs, a remembered one 0.1 µs)."""
    return _stemmer().stemWord(word)


def normalize(text: str) -> str:
    """``text`` NFKC-normalised and lower-cased (what every function here reads)."""
    return unicodedata.normalize("NFKC", text).lower()


def index_text(text: str) -> str:
    """What the full-text index holds for an entry (``memories.search_text``): the NFKC text with
    spaces around every CJK character (``"乌龙茶 3月"`` -> ``" 乌  龙  茶  3 月 "``), the rest
    unchanged for the engine to tokenize and stem its way. Stop words stay: they are dropped from
    queries, so the index need not change when the list does."""
    return _CJK_CHAR.sub(lambda m: f" {m.group()} ", unicodedata.normalize("NFKC", text))


def _pieces(text: str) -> list[tuple[str, str]]:
    """``(kind, piece)`` of the normalised text in order: ``latin`` (a word, stop words and single
    letters dropped), ``digits``, ``word`` (one of ``CJK_WORDS``), or ``han`` / ``kana`` /
    ``hangul`` (a CJK piece between stop words)."""
    out: list[tuple[str, str]] = []
    for word in _WORD.findall(normalize(text)):
        if not _CJK.search(word):
            if word not in STOPWORDS and (len(word) > 1 or word.isdigit()):
                out.append(("latin", word))
            continue
        for part in re.split(f"({_CJK.pattern})", word):
            if not part:
                continue
            if not _CJK.fullmatch(part):
                out += [("digits" if p.isdigit() else "latin", p) for p in _WORD.findall(part)
                        if p.isdigit() or (len(p) > 1 and p not in STOPWORDS)]
                continue
            for segment in _CJK_STOP.split(part):
                if segment in CJK_WORDS:
                    out.append(("word", segment))
                elif segment:
                    out += [(m.lastgroup or "han", m.group()) for m in _SCRIPT.finditer(segment)]
    return out


def _cjk_terms(kind: str, piece: str, pairs: bool) -> list[str]:
    if kind == "han" and not (pairs and len(piece) > 1):
        return list(piece)
    if len(piece) == 1:
        return [] if _HIRAGANA.fullmatch(piece) else [piece]
    return [piece[i:i + 2] for i in range(len(piece) - 1)]


def words(text: str) -> list[str]:
    """What the full-text index is searched for, in order (duplicates possible): the text's words
    unstemmed (the engine stems them its own way), stop words and single letters dropped, and the
    characters of its CJK terms (the index holds single characters: ``index_text``).
    ``"我最喜欢的颜色是什么? colours"`` -> ``["最", "喜", "欢", "颜", "色", "colours"]``."""
    out: list[str] = []
    for kind, piece in _pieces(text):
        if kind in ("latin", "digits"):
            out.append(piece)
        elif kind == "word":
            out.extend(piece)
        else:
            out.extend(ch for term in _cjk_terms(kind, piece, False) for ch in term)
    return out


def terms(text: str) -> set[str]:
    """The text's terms for scoring (a set): stemmed words and numbers, Han characters, kana and
    Hangul pairs (see the module doc). ``terms("我喜欢喝乌龙茶")`` -> ``{"喜", "欢", "喝", "乌", "龙", "茶"}``."""
    return _terms(text, pairs=False)


def pair_terms(text: str) -> set[str]:
    """``terms`` with each Han piece as its overlapping pairs instead of its characters (a lone
    character stays: ``CJKBigramFilter``'s default), ``"我喜欢喝乌龙茶"`` -> ``{"喜欢", "欢喝", "喝乌",
    "乌龙", "龙茶"}``: word-like units, for deciding whether one text states another (evidence,
    restatement), where sharing characters ("小红", "小米") is not enough."""
    return _terms(text, pairs=True)


def _terms(text: str, pairs: bool) -> set[str]:
    out: set[str] = set()
    for kind, piece in _pieces(text):
        if kind == "latin":
            out.add(_stem(piece))
        elif kind in ("digits", "word"):
            out.add(piece)
        else:
            out.update(_cjk_terms(kind, piece, pairs))
    return out


def numbers(text: str) -> set[str]:
    """The numbers written in digits in ``text`` (full-width digits too), leading zeros dropped:
    ``"4.2M EUR, 09:30"`` -> ``{"4", "2", "9", "30"}``."""
    return {n.lstrip("0") or "0" for n in _DIGITS.findall(unicodedata.normalize("NFKC", text))}


def similarity(query: set[str], entry: set[str]) -> float:
    """Lexical similarity in 0..1: the cosine of the two term sets seen as binary vectors,
    ``|Q ∩ E| / sqrt(|Q| * |E|)`` (0 when either is empty)."""
    if not query or not entry:
        return 0.0
    return len(query & entry) / math.sqrt(len(query) * len(entry))


def coverage(claim: set[str], evidence: set[str]) -> float:
    """Share of ``claim``'s terms found in ``evidence`` (0..1; 0 for an empty claim)."""
    return len(claim & evidence) / len(claim) if claim else 0.0


def grounding(claim: str, evidence: str) -> float:
    """Share (0..1) of ``claim``'s words (``pair_terms``) that ``evidence`` states: the same term,
    or, for a one-character Chinese or Japanese word, that character anywhere in the evidence (a
    word inside a longer run: "狗" in "我家狗狗", "住" in "住杭州"). 0 for a claim without words."""
    mine, theirs = pair_terms(claim), pair_terms(evidence)
    if not mine:
        return 0.0
    text = normalize(evidence)
    found = [t for t in mine if t in theirs or (len(t) == 1 and _CJK_CHAR.fullmatch(t) and t in text)]
    return len(found) / len(mine)
