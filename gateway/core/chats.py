"""Per-chat settings (``[[chats]]``): which route, persona, toolset, skills and busy policy a chat gets.

```toml
[personas]
pirate = "Answer like a friendly pirate."

[[chats]]                                   # every Slack chat
platform = "slack"
route = "local-first"

[[chats]]                                   # one Telegram group, one of its forum topics
platform = "telegram"
chat = "-1001234567890"
thread = "42"
persona = "pirate"                          # a name from [personas], or the text itself
toolset = ["files", "web_fetch"]            # tools and [tools.toolsets] names
skills = ["daily-report"]                   # the only skills its new sessions list and load
busy_policy = "interrupt"
models = ["default", "local-first"]         # what /model may choose there (unset: every route)
```

**Matching.** A rule applies to a message when every key it sets among ``platform``, ``chat``,
``thread`` and ``user`` equals the message's (``chat`` is the platform's chat id, ``thread`` the
thread or forum topic id, ``user`` the sender's platform user id). Every applying rule contributes
the settings it gives; where two give the same setting, the more specific rule wins: ``thread``
(weight 8) beats ``chat`` (4) beats ``user`` (2) beats ``platform`` (1), weights adding up (a rule
with ``chat`` and ``user`` = 6 beats one with only ``chat`` = 4); between rules of equal weight the
later one in the file wins. Settings an admin set in the chat (``/model``, ``/persona``, ``/busy``;
``gateway.sessions.chat_settings``) win over every rule.

Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, model_validator

BusyPolicy = Literal["queue", "merge", "interrupt"]
BUSY_POLICIES: tuple[str, ...] = ("queue", "merge", "interrupt")

WEIGHTS = {"thread": 8, "chat": 4, "user": 2, "platform": 1}
"""How much each match key adds to a rule's specificity (module doc)."""


class ChatRule(BaseModel):
    """One ``[[chats]]`` entry: what it matches and the settings it gives (unset: not given)."""

    model_config = ConfigDict(extra="forbid")

    platform: Literal["telegram", "slack", "feishu", "web", "local"] | None = None
    """``telegram``, ``slack``, ``feishu`` (Lark too), ``web``, ``local``: a typo is a start-up error,
    not a rule that never matches."""
    chat: str | None = None
    """The platform's chat id (``-1001234567890``, ``C0123``, ``oc_…``)."""
    thread: str | None = None
    """A thread or forum topic id in ``chat`` (Slack thread ``ts``, Telegram ``message_thread_id``)."""
    user: str | None = None
    """The sender's platform user id (``5550001``, ``U0123``, ``ou_…``)."""
    route: str | None = None
    """A route name: ``default`` (``llm.route``) or one of ``[llm.routes.NAME]``."""
    persona: str | None = None
    """Added to the system prompt of new sessions: a name from ``[personas]``, or the text itself."""
    toolset: list[str] | None = None
    """Tools mounted for its new sessions (tool names and ``tools.toolsets`` names); unset:
    ``agent.toolset``."""
    skills: list[str] | None = None
    """The only skills its new sessions' catalogue lists and ``load_skill`` loads (unset: every
    skill; ``[]``: none)."""
    busy_policy: BusyPolicy | None = None
    """``queue``, ``merge`` or ``interrupt`` (unset: ``bus.busy_policy``)."""
    models: list[str] | None = None
    """The routes ``/model`` may choose in this chat (unset: every route)."""

    @model_validator(mode="after")
    def _check(self) -> ChatRule:
        if self.thread is not None and self.chat is None:
            raise ValueError("a rule with thread needs chat too (thread ids are unique only within a chat)")
        if self.chat is not None and self.platform is None:
            raise ValueError("a rule with chat needs platform too (chat ids are unique only per platform)")
        if self.user is not None and self.platform is None:
            raise ValueError("a rule with user needs platform too (user ids are unique only per platform)")
        return self

    def weight(self) -> int:
        """Its specificity (``WEIGHTS``)."""
        return sum(w for name, w in WEIGHTS.items() if getattr(self, name) is not None)

    def applies(self, platform: str, chat: str, thread: str | None, user: str) -> bool:
        """Whether every match key it sets equals the message's."""
        return ((self.platform is None or self.platform == platform) and (self.chat is None or self.chat == chat)
                and (self.thread is None or self.thread == thread) and (self.user is None or self.user == user))


SETTINGS = ("route", "persona", "toolset", "skills", "busy_policy", "models")
"""The keys a rule (or a chat's override) may give."""


@dataclass(frozen=True)
class ChatSettings:
    """The settings a chat gets, every field resolved or ``None`` for the gateway's default.

    Attributes:
        route: route name (``None``: ``default``).
        persona: persona name or text, as configured (``None``: none).
        toolset: tool and toolset names (``None``: ``agent.toolset``).
        skills: skill names in the catalogue (``None``: every skill).
        busy_policy: ``queue`` / ``merge`` / ``interrupt`` (``None``: ``bus.busy_policy``).
        models: the routes ``/model`` may choose (``None``: every route).
    """

    route: str | None = None
    persona: str | None = None
    toolset: tuple[str, ...] | None = None
    skills: tuple[str, ...] | None = None
    busy_policy: str | None = None
    models: tuple[str, ...] | None = None


def resolve(rules: list[ChatRule], platform: str, chat: str, thread: str | None, user: str,
            overrides: dict[str, str] | None = None) -> ChatSettings:
    """The settings of a message in ``platform``/``chat``/``thread`` from ``user``: the applying
    ``rules`` by specificity (module doc), then ``overrides`` (``route``, ``persona``, ``busy_policy``
    set in the chat) over them."""
    ordered = sorted((r for r in rules if r.applies(platform, chat, thread, user)), key=lambda r: r.weight())
    found: dict[str, object] = {}
    for rule in ordered:  # stable sort: equal weights keep file order, so the later one wins
        for name in SETTINGS:
            value = getattr(rule, name)
            if value is not None:
                found[name] = tuple(value) if isinstance(value, list) else value
    for name, value in (overrides or {}).items():
        if name in SETTINGS and value is not None:
            found[name] = value
    return ChatSettings(**found)  # type: ignore[arg-type]
