"""The write-back promotion gate (issue 10): what may become a memory entry after a turn.

- **Explicit**: a user message that starts with "remember ..." (also "please remember that ...",
  "don't forget ..."; Chinese "记住…", "请记住…", "记得…", "帮我记一下…", "别忘了…"; Japanese
  "覚えて…", "覚えておいて…", or "…を覚えておいて" at the end) is always promoted, without a model
  call: source ``user_explicit``, weight ``EXPLICIT_WEIGHT``, its evidence the message itself.
  A question ("记得我说过什么吗？", "覚えていますか") is not a request.
- **Proposed**: one extra model call (``PROPOSE_PROMPT``) reads the turn (user messages, tool
  results, the reply) and the owner's related entries and answers candidates in a fixed JSON schema
  (``Proposal``). A candidate must cite evidence, ids of this turn's user messages or tool results,
  and the cited text must state it (``ungrounded``: ``GROUNDING`` of its words, Chinese and
  Japanese ones as character pairs, and every number it writes in digits); otherwise it is dropped. A
  candidate restating a valid entry reinforces that entry instead of adding another; one that
  contradicts older entries names them in ``supersedes`` and they are linked to it, not deleted.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gateway.memory.store import MAX_TEXT_CHARS, Memory
from gateway.memory.terms import grounding, numbers, pair_terms, similarity

log = logging.getLogger("gateway.memory")

EXPLICIT_WEIGHT = 2.0
PROPOSED_WEIGHT = 1.0
MAX_WEIGHT = 3.0
GROUNDING = 0.34
"""Least share of a proposed entry's words (``pair_terms``) that its cited evidence must contain."""
SAME = 0.85
"""Lexical similarity at which a new entry restates an existing one (reinforce, not add)."""

_EXPLICIT = re.compile(
    r"^\s*(?:please\s+)?(?:remember|memori[sz]e|keep in mind|don'?t forget|do not forget|note down)\b"
    r"(?:\s+that\b)?[\s:,\-–—]*(?P<what>.+)$", re.IGNORECASE | re.DOTALL)
_EXPLICIT_ZH = re.compile(  # simplified and traditional: (please) (help me) remember / note down / don't forget
    r"^\s*(?:请|請)?(?:你|您)?(?:帮我|幫我)?(?:记住|記住|记下|記下|记一下|記一下|记得|記得|别忘了|別忘了|不要忘了|不要忘记|不要忘記)"
    r"(?:一下)?[:：,，、\s]*(?P<what>.+)$", re.DOTALL)
_REMEMBER_JA = r"(?>(?:覚え(?:ておいて|といて|て)|忘れないで)(?:ください|下さい)?(?:ね|よ)?)"
"""Japanese "remember" / "don't forget", each form whole (atomic: "覚えておいて" is never "覚えて" + "おいて")."""
_EXPLICIT_JA_HEAD = re.compile(rf"^\s*{_REMEMBER_JA}[:：,，、。\s]*(?P<what>.+)$", re.DOTALL)
_EXPLICIT_JA_TAIL = re.compile(  # the verb last: "誕生日は3月14日だと覚えておいて"
    rf"^\s*(?P<what>.+?)[、,，\s]*(?:ということを|ということ|ってことを|ってこと|だって|だと|って|と|ことを|のを|を)?"
    rf"[、,，\s]*{_REMEMBER_JA}[。.!！\s]*$", re.DOTALL)
_QUESTION_END = re.compile(r"(?:[?？]|[吗嗎][。.!！]*|(?:ます|です|てる|てた|いる)か[。.!！]*)\s*$")
"""How a question ends: "?", "？", Chinese "吗", Japanese "…ますか"."""
_CJK_CHAR = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af]")

_PREFERENCE = re.compile(r"\b(prefer|favou?rite|always|never|from now on|i like|i love|i hate|i don'?t like|"
                         r"use|call me|style|format)\b", re.IGNORECASE)
_PREFERENCE_CJK = re.compile(r"喜欢|喜歡|最爱|最愛|讨厌|討厭|偏好|首选|首選|总是|總是|不要|别给|別給|以后|以後|"
                             r"好き|嫌い|いつも|苦手")
_DECISION = re.compile(r"\b(decided|decision|agreed|we will|we'll|going forward|plan is)\b", re.IGNORECASE)
_DECISION_CJK = re.compile(r"决定|決定|定了|商定|约定|約定|同意|決めた")
_EPISODE = re.compile(r"\b(yesterday|last (week|month|year|time)|ago|happened|went to|visited|met)\b",
                      re.IGNORECASE)
_EPISODE_CJK = re.compile(r"昨天|前天|上周|上個?月|上个月|去年|上次|去过|去過|昨日|先週|先月|去年|行った")


_NO_CONTENT = re.compile(r"(?:that|this|it|these|those|the following)?[\s.!:;,…]*"
                         r"|(?:了|这个|這個|这些|這些|这件事|這件事|以下|下面|これ|それ|このこと)?[\s。.!！:：;；,，、…]*",
                         re.IGNORECASE)
"""What follows "remember" when nothing is said: "please remember that", "remember this!", "记住了"."""


def explicit_request(text: str) -> str | None:
    """What the user asked to be remembered (``"remember that I'm vegan"`` -> ``"I'm vegan"``,
    ``"请记住我住在杭州"`` -> ``"我住在杭州"``, ``"誕生日は3月14日だと覚えておいて"`` -> ``"誕生日は3月14日だ"``),
    or ``None`` when ``text`` is not such a request (a question like "remember when ...?" or
    "记得我说过什么吗" is not) or says nothing to remember ("please remember that", "记住了").
    The text may be longer than an entry holds (``MAX_TEXT_CHARS``): the caller refuses it."""
    stripped = text.strip()
    match = (_EXPLICIT.match(stripped) or _EXPLICIT_ZH.match(stripped) or _EXPLICIT_JA_HEAD.match(stripped)
             or _EXPLICIT_JA_TAIL.match(stripped))
    if match is None or _QUESTION_END.search(stripped):
        return None
    what = " ".join(match.group("what").split()).strip()
    short = len(what) < (2 if _CJK_CHAR.search(what) else 3)
    if short or _NO_CONTENT.fullmatch(what):
        return None
    return what[0].upper() + what[1:]


def guess_type(text: str) -> str:
    """The entry type of an explicit request's text, by its wording (``fact`` by default)."""
    if _DECISION.search(text) or _DECISION_CJK.search(text):
        return "decision"
    if _PREFERENCE.search(text) or _PREFERENCE_CJK.search(text):
        return "preference"
    if _EPISODE.search(text) or _EPISODE_CJK.search(text):
        return "episode"
    return "fact"


class Candidate(BaseModel):
    """One proposed entry (the fixed JSON schema; unknown keys are errors)."""

    model_config = ConfigDict(extra="forbid")

    text: str = Field(min_length=3, max_length=MAX_TEXT_CHARS)
    """The conclusion or constraint in one sentence, never a transcript."""
    type: Literal["preference", "fact", "decision", "episode"]
    evidence: list[int] = Field(default_factory=list, max_length=10)
    """Ids of this turn's user messages or tool results that state it."""
    confidence: float = Field(default=0.7, ge=0.0, le=1.0)
    supersedes: list[int] = Field(default_factory=list, max_length=10)
    """Ids of existing entries it contradicts (they stay, linked to it)."""


class Proposal(BaseModel):
    """The model's whole answer: ``{"memories": [Candidate, ...]}`` (empty when nothing is worth keeping)."""

    model_config = ConfigDict(extra="forbid")

    memories: list[Candidate] = Field(default_factory=list, max_length=10)


PROPOSE_PROMPT = (
    "You maintain the long-term memory of an assistant about one user (or one group chat). "
    "Read the turn below and propose entries worth remembering across conversations: stable preferences, "
    "facts about the user and their work, decisions, and conclusions of tasks. Never copy the transcript; "
    "write each entry as one short standalone sentence, in the language of the user's messages. "
    "Skip small talk, one-off requests and anything already in the existing entries, unless it changed: "
    "then propose the new version and list the ids of "
    "the old entries it contradicts in \"supersedes\". Every entry must cite in \"evidence\" the ids of the "
    "user messages or tool results (never assistant messages) that state it; an entry without evidence is "
    "discarded. Answer with JSON only, exactly this schema: "
    '{"memories": [{"text": str, "type": "preference"|"fact"|"decision"|"episode", "evidence": [int], '
    '"confidence": number 0..1, "supersedes": [int]}]}. Answer {"memories": []} when nothing qualifies.'
)

TRANSCRIPT_CHARS = 1500
"""Characters of one message shown to the proposing model (head kept)."""


@dataclass(frozen=True)
class TurnMessage:
    """A transcript message of the turn as the gate sees it: id, role (``user`` | ``assistant`` |
    ``tool``), text."""

    id: int
    role: str
    text: str


def proposal_request(turn: Sequence[TurnMessage], existing: Sequence[Memory]) -> list[dict[str, str]]:
    """The chat messages of the proposing call."""
    known = "\n".join(f"#{m.id} ({m.type}) {m.text}" for m in existing) or "(none)"
    lines = []
    for message in turn:
        shown = message.text if len(message.text) <= TRANSCRIPT_CHARS else message.text[:TRANSCRIPT_CHARS] + " […]"
        lines.append(f"[m{message.id} {message.role}] {shown}")
    body = f"Existing entries:\n{known}\n\nThe turn (evidence ids are the numbers after m):\n" + "\n".join(lines)
    return [{"role": "system", "content": PROPOSE_PROMPT}, {"role": "user", "content": body}]


def parse_proposal(content: str | None) -> Proposal:
    """The model's answer as a ``Proposal`` (a JSON code fence around it is tolerated).

    Raises:
        ValueError: not JSON, or not the schema (the message says where).
    """
    raw = (content or "").strip()
    fenced = re.fullmatch(r"```(?:json)?\s*(.*?)\s*```", raw, re.DOTALL)
    if fenced:
        raw = fenced.group(1)
    try:
        return Proposal.model_validate(json.loads(raw))
    except (ValueError, ValidationError) as exc:
        raise ValueError(f"memory proposal is not the expected JSON: {str(exc)[:300]}") from None


def evidence_problem(candidate: Candidate, turn: Sequence[TurnMessage]) -> str | None:
    """Why ``candidate`` fails the evidence check, or ``None`` when it passes: it cites at least
    one id, every id is a user message or tool result of this turn, and together they state it
    (``ungrounded``)."""
    if not candidate.evidence:
        return "cites no evidence"
    sources = {m.id: m for m in turn if m.role in ("user", "tool")}
    unknown = [i for i in candidate.evidence if i not in sources]
    if unknown:
        return f"cites {unknown}, not a user message or tool result of this turn"
    problem = ungrounded(candidate.text, "\n".join(sources[i].text for i in candidate.evidence))
    return f"its evidence does not state it ({problem})" if problem else None


def ungrounded(claim: str, evidence: str) -> str | None:
    """Why ``evidence`` does not state ``claim`` (``None`` when it does): it must state at least
    ``GROUNDING`` of the claim's words (``gateway.memory.terms.grounding``: a Chinese or Japanese
    word counts as its character pairs, so "小红" is not grounded by "小米") and contain every number
    the claim writes in digits (a changed number is the commonest made-up detail: "5月20日" for
    "3月14日")."""
    if grounding(claim, evidence) < GROUNDING:
        return "too few of its words"
    missing = sorted(numbers(claim) - numbers(evidence))
    if missing:
        return "not the number " + ", ".join(missing)
    return None


def restated(text: str, existing: Sequence[Memory]) -> Memory | None:
    """The valid entry ``text`` restates (``pair_terms`` similarity ≥ ``SAME``), if any."""
    mine = pair_terms(text)
    best = max(existing, key=lambda m: similarity(mine, pair_terms(m.text)), default=None)
    if best is not None and best.superseded_by is None and similarity(mine, pair_terms(best.text)) >= SAME:
        return best
    return None
