"""The write-back promotion gate (issue 10): what may become a memory entry after a turn.

- **Explicit**: a user message that starts with "remember ..." (also "please remember that ...",
  "don't forget ...", "记住 ...") is always promoted, without a model call: source
  ``user_explicit``, weight ``EXPLICIT_WEIGHT``, its evidence the message itself.
- **Proposed**: one extra model call (``PROPOSE_PROMPT``) reads the turn (user messages, tool
  results, the reply) and the owner's related entries and answers candidates in a fixed JSON schema
  (``Proposal``). A candidate must cite evidence, ids of this turn's user messages or tool results,
  and the cited text must state it (``GROUNDING`` of its terms); otherwise it is dropped. A
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
from gateway.memory.terms import coverage, similarity, terms

log = logging.getLogger("gateway.memory")

EXPLICIT_WEIGHT = 2.0
PROPOSED_WEIGHT = 1.0
MAX_WEIGHT = 3.0
GROUNDING = 0.34
"""Least share of a proposed entry's terms that its cited evidence must contain."""
SAME = 0.85
"""Lexical similarity at which a new entry restates an existing one (reinforce, not add)."""

_EXPLICIT = re.compile(
    r"^\s*(?:please\s+)?(?:remember|memori[sz]e|keep in mind|don'?t forget|do not forget|note down)\b"
    r"(?:\s+that\b)?[\s:,\-–—]*(?P<what>.+)$", re.IGNORECASE | re.DOTALL)
_EXPLICIT_ZH = re.compile(r"^\s*(?:请)?(?:记住|记下)[:：,，\s]*(?P<what>.+)$", re.DOTALL)

_PREFERENCE = re.compile(r"\b(prefer|favou?rite|always|never|from now on|i like|i love|i hate|i don'?t like|"
                         r"use|call me|style|format)\b", re.IGNORECASE)
_DECISION = re.compile(r"\b(decided|decision|agreed|we will|we'll|going forward|plan is)\b", re.IGNORECASE)
_EPISODE = re.compile(r"\b(yesterday|last (week|month|year|time)|ago|happened|went to|visited|met)\b",
                      re.IGNORECASE)


_NO_CONTENT = re.compile(r"(?:that|this|it|these|those|the following)?[\s.!:;,…]*", re.IGNORECASE)
"""What follows "remember" when nothing is said: "please remember that", "remember this!"."""


def explicit_request(text: str) -> str | None:
    """What the user asked to be remembered (``"remember that I'm vegan"`` -> ``"I'm vegan"``), or
    ``None`` when ``text`` is not such a request (a question like "remember when ...?" is not) or
    says nothing to remember ("please remember that"). The text may be longer than an entry holds
    (``MAX_TEXT_CHARS``): the caller refuses it."""
    stripped = text.strip()
    match = _EXPLICIT.match(stripped) or _EXPLICIT_ZH.match(stripped)
    if match is None or stripped.endswith(("?", "？")):
        return None
    what = " ".join(match.group("what").split()).strip()
    if len(what) < 3 or _NO_CONTENT.fullmatch(what):
        return None
    return what[0].upper() + what[1:]


def guess_type(text: str) -> str:
    """The entry type of an explicit request's text, by its wording (``fact`` by default)."""
    if _DECISION.search(text):
        return "decision"
    if _PREFERENCE.search(text) or re.search(r"(喜欢|偏好|总是|不要|以后)", text):
        return "preference"
    if _EPISODE.search(text):
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
    "write each entry as one short standalone sentence. Skip small talk, one-off requests and anything "
    "already in the existing entries, unless it changed: then propose the new version and list the ids of "
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
    one id, every id is a user message or tool result of this turn, and together they contain at
    least ``GROUNDING`` of its terms."""
    if not candidate.evidence:
        return "cites no evidence"
    sources = {m.id: m for m in turn if m.role in ("user", "tool")}
    unknown = [i for i in candidate.evidence if i not in sources]
    if unknown:
        return f"cites {unknown}, not a user message or tool result of this turn"
    cited = terms(" ".join(sources[i].text for i in candidate.evidence))
    if coverage(terms(candidate.text), cited) < GROUNDING:
        return "its evidence does not state it"
    return None


def restated(text: str, existing: Sequence[Memory]) -> Memory | None:
    """The valid entry ``text`` restates (lexical similarity ≥ ``SAME``), if any."""
    mine = terms(text)
    best = max(existing, key=lambda m: similarity(mine, terms(m.text)), default=None)
    if best is not None and best.superseded_by is None and similarity(mine, terms(best.text)) >= SAME:
        return best
    return None
