"""Per-chat settings at work: the ``chat_settings`` SQL, what a new session is created with, and the
admin commands ``/model``, ``/persona``, ``/busy``.

A chat's settings are the ``[[chats]]`` rules that apply to it (``gateway.core.chats``, precedence
there) with what an admin set in the chat over them. A session takes its route, toolset, skills and
persona once, when it is created (``sessions.settings``, and the persona inside its stored system
prompt): a change applies to the chat's next session, and the running one keeps its byte-identical
system prompt and tools (the prompt cache's prefix). The busy policy is no part of a session: a
change applies to the next message.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, select, update
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError

from agent.cache import AgentSpec
from agent.providers import Provider
from agent.skills import SkillLibrary, with_catalogue
from gateway.core.chats import BUSY_POLICIES, ChatSettings, resolve
from gateway.core.config import GatewayConfig
from gateway.core.i18n import N_, _
from gateway.core.providers import DEFAULT_ROUTE
from gateway.core.types import InboundMessage
from gateway.store.db import read_tx, write_tx
from gateway.store.fast import execute as run
from gateway.store.models import ChatSettingRow, table
from gateway.store.sql import Store, retry_locked
from gateway.tools.catalog import expand_toolset

_chat_settings = table(ChatSettingRow)

PERSONA_MAX_CHARS = 2000
"""Longest persona text ``/persona TEXT`` takes (it is sent with every request of the session)."""

OVERRIDABLE = ("route", "persona", "busy_policy")
"""The settings an admin may set in a chat."""

TEXTS = {
    "admin_only": N_("Only an admin can change this chat's settings."),
    "model_now": N_("Model of this chat: {route} ({targets}).\nChoose another with /model NAME: {allowed}."),
    "model_unknown": N_("There is no model named {name!r} here. Choose one of: {allowed}."),
    "model_set": N_("The model of this chat is now {route} ({targets}). It applies to the next conversation: "
                    "the current one keeps its model. Send /new to start the next one now."),
    "persona_now": N_("Persona of this chat: {persona}.\nSet one with /persona NAME or /persona TEXT "
                      "(named: {names}); /persona off removes it."),
    "persona_none": N_("none"),
    "persona_long": N_("A persona may be at most {limit} characters long (this one has {length})."),
    "persona_set": N_("The persona of this chat is now {persona}. It applies to the next conversation: "
                      "the current one keeps its instructions. Send /new to start the next one now."),
    "persona_off": N_("This chat has no persona any more. It applies to the next conversation: "
                      "the current one keeps its instructions. Send /new to start the next one now."),
    "busy_now": N_("While I am answering, new messages here are: {policy} ({meaning}).\n"
                   "Change it with /busy queue|merge|interrupt."),
    "busy_unknown": N_("Usage: /busy queue|merge|interrupt."),
    "busy_set": N_("From the next message on, messages sent while I am answering are: {policy} ({meaning})."),
    "busy_queue": N_("answered one by one, in order"),
    "busy_merge": N_("answered together once I am done"),
    "busy_interrupt": N_("stopping the answer in progress and answered instead"),
    "none_named": N_("none"),
}
"""Every text this module sends to users (one place, for translation)."""

OFF_WORDS = frozenset({"off", "none", "default", "-"})
"""``/persona off`` (or one of these) removes the chat's persona."""


_GET = select(*(getattr(_chat_settings.c, n) for n in OVERRIDABLE)).where(
    _chat_settings.c.platform == bindparam("b_platform"), _chat_settings.c.tenant == bindparam("b_tenant"),
    _chat_settings.c.chat_id == bindparam("b_chat"))

_GET_MANY = select(_chat_settings.c.chat_id, *(getattr(_chat_settings.c, n) for n in OVERRIDABLE)).where(
    _chat_settings.c.platform == bindparam("b_platform"), _chat_settings.c.tenant == bindparam("b_tenant"),
    _chat_settings.c.chat_id.in_(bindparam("b_chats", expanding=True)))
"""``_GET`` for several chats of one platform and tenant, each row with its ``chat_id``."""

CACHE_S = 1.0
"""How long a chat's settings read from the database are reused by this process (a message is
read about four times on its way: receive, lane, new session). A change made through this process
applies at once; one made through another instance within this long."""

CACHE_MAX = 10_000
"""Chats whose settings are cached at most (the oldest half is dropped beyond it)."""


class ChatOverrides:
    """The ``chat_settings`` table: what admins set in chats, one row per chat (all its threads)."""

    def __init__(self, engine: Engine, cache_s: float = CACHE_S) -> None:
        self.engine = engine
        self.cache_s = cache_s
        self._cache: dict[tuple[str, str, str], tuple[float, dict[str, str]]] = {}
        self._lock = threading.Lock()

    def get(self, platform: str, tenant: str, chat_id: str, conn: Connection | None = None) -> dict[str, str]:
        """The settings set in the chat (``route``, ``persona``, ``busy_policy``; unset ones left out);
        a read at most ``cache_s`` old (see ``CACHE_S``). ``conn``: read in the caller's transaction
        (the inbox write of a message to the chat) rather than one of its own."""
        key = (platform, tenant, chat_id)
        now = time.monotonic()
        cached = self._cache.get(key)
        if cached is not None and now - cached[0] < self.cache_s:
            return dict(cached[1])
        if conn is not None:
            row = run(conn, _GET, {"b_platform": platform, "b_tenant": tenant, "b_chat": chat_id}).first()
        else:
            with read_tx(self.engine) as own:
                row = run(own, _GET, {"b_platform": platform, "b_tenant": tenant, "b_chat": chat_id}).first()
        found = {} if row is None else {n: v for n, v in zip(OVERRIDABLE, row, strict=True) if v is not None}
        self._remember({key: found}, now)
        return dict(found)

    def _remember(self, read: dict[tuple[str, str, str], dict[str, str]], now: float) -> None:
        """Caches chats' settings as read at ``now`` (the oldest half dropped past ``CACHE_MAX``)."""
        with self._lock:
            if len(self._cache) + len(read) > CACHE_MAX:
                for old in list(self._cache)[: CACHE_MAX // 2]:
                    del self._cache[old]
            for key, settings in read.items():
                self._cache[key] = (now, settings)

    def prime(self, conn: Connection, chats: Sequence[tuple[str, str, str]]) -> None:
        """Reads the settings of the ``(platform, tenant, chat_id)`` not cached (or cached too
        long ago) in the caller's transaction ``conn``, one statement per platform and tenant, and
        caches them, so the ``get`` of each that follows reads nothing (the admit of a batch of
        messages: one read instead of one a chat)."""
        now = time.monotonic()
        wanted: dict[tuple[str, str], list[str]] = {}
        for platform, tenant, chat_id in chats:
            cached = self._cache.get((platform, tenant, chat_id))
            if cached is None or now - cached[0] >= self.cache_s:
                ids = wanted.setdefault((platform, tenant), [])
                if chat_id not in ids:
                    ids.append(chat_id)
        for (platform, tenant), ids in wanted.items():
            found: dict[tuple[str, str, str], dict[str, str]] = {(platform, tenant, chat_id): {} for chat_id in ids}
            for row in run(conn, _GET_MANY, {"b_platform": platform, "b_tenant": tenant, "b_chats": ids}):
                found[(platform, tenant, row.chat_id)] = {n: v for n, v in zip(OVERRIDABLE, row[1:], strict=True)
                                                          if v is not None}
            self._remember(found, now)

    @retry_locked
    def set(self, platform: str, tenant: str, chat_id: str, name: str, value: str | None, by: str) -> None:
        """Sets (``None``: unsets) one of ``OVERRIDABLE`` for the chat; ``by`` is ``platform:user id``.

        Raises:
            ValueError: ``name`` is not one of ``OVERRIDABLE``.
        """
        if name not in OVERRIDABLE:
            raise ValueError(f"not a chat setting: {name}")
        with self._lock:
            self._cache.pop((platform, tenant, chat_id), None)
        where = (_chat_settings.c.platform == platform, _chat_settings.c.tenant == tenant,
                 _chat_settings.c.chat_id == chat_id)
        values = {name: value, "updated_by": by, "updated_at": time.time()}
        try:
            with write_tx(self.engine) as conn:
                if not conn.execute(update(_chat_settings).where(*where).values(**values)).rowcount:
                    conn.execute(_chat_settings.insert().values(platform=platform, tenant=tenant, chat_id=chat_id,
                                                                **values))
        except IntegrityError:  # another instance inserted the chat's row meanwhile: ours goes over it
            with write_tx(self.engine) as conn:
                conn.execute(update(_chat_settings).where(*where).values(**values))
        finally:
            with self._lock:
                self._cache.pop((platform, tenant, chat_id), None)


@dataclass(frozen=True)
class NewSessionSetup:
    """What a chat's next session is created with: its system prompt and ``sessions.settings``."""

    system_prompt: str
    settings: dict[str, Any] | None


class ChatSetup:
    """Resolves a message's chat settings and builds what its new sessions and their turns use.

    Args:
        config: the configuration (``chats``, ``personas``, ``agent.system_prompt``, ``bus.busy_policy``,
            ``llm`` routes, ``tools.toolsets``).
        overrides: the settings admins set in chats.
        providers: the configured providers (``LlmConfig.build_providers``), for route specs.
        default_spec: the chat turns' agent now (its toolset grows when MCP tools are discovered).
        skills: the skill library (``None``: skills are off).
    """

    def __init__(self, config: GatewayConfig, overrides: ChatOverrides, providers: Mapping[str, Provider],
                 default_spec: Callable[[], AgentSpec], skills: SkillLibrary | None) -> None:
        self.config = config
        self.overrides = overrides
        self.providers = providers
        self.default_spec = default_spec
        self.skills = skills

    def settings(self, message: InboundMessage, conn: Connection | None = None) -> ChatSettings:
        """The chat's settings for ``message`` (rules, then the chat's overrides; one DB read, in
        ``conn``'s transaction when given)."""
        address = message.address
        overrides = self.overrides.get(address.platform, address.tenant, address.chat_id, conn)
        return resolve(self.config.chats, address.platform, address.chat_id, address.thread_id,
                       message.sender.user_id, overrides)

    def prime(self, messages: Sequence[InboundMessage], conn: Connection) -> None:
        """The settings of the chats of ``messages`` read together in ``conn`` and cached, ahead of
        ``settings`` for each (``ChatOverrides.prime``)."""
        self.overrides.prime(conn, [(m.address.platform, m.address.tenant, m.address.chat_id) for m in messages])

    def busy_policy(self, message: InboundMessage, conn: Connection | None = None) -> str:
        """``queue``, ``merge`` or ``interrupt`` for a message to this chat now (``conn``: see
        ``settings``)."""
        return self.settings(message, conn).busy_policy or self.config.bus.busy_policy

    def persona_text(self, persona: str | None) -> str:
        """A configured persona's text (a name of ``[personas]``), or ``persona`` itself."""
        if not persona:
            return ""
        return self.config.personas.get(persona, persona)

    def toolset(self, names: list[str] | tuple[str, ...] | None) -> tuple[str, ...]:
        """The tools a session mounts (``None``: the default agent's)."""
        if names is None:
            return self.default_spec().toolset
        return tuple(expand_toolset(list(names), self.config.tools.toolsets))

    def system_prompt(self, settings: ChatSettings | None = None) -> str:
        """A new session's system prompt: ``agent.system_prompt``, the persona, then the skill
        catalogue (the skills it allows, for the tools it mounts) as it is on disk now. Without
        settings, byte for byte what sessions got before per-chat settings."""
        settings = settings or ChatSettings()
        toolset = self.toolset(settings.toolset)
        prompt = self.config.agent.system_prompt
        persona = self.persona_text(settings.persona)
        if persona:
            prompt = f"{prompt}\n\n{persona}"
        catalogue = self.skills.catalogue(toolset, settings.skills) \
            if self.skills is not None and "load_skill" in toolset else ""
        return with_catalogue(prompt, catalogue)

    def new_session(self, message: InboundMessage | None) -> NewSessionSetup:
        """What the next session of ``message``'s chat is created with (``None``: the defaults)."""
        settings = self.settings(message) if message is not None else ChatSettings()
        stored = {name: list(v) if isinstance(v, tuple) else v
                  for name in ("route", "toolset", "skills", "persona")
                  if (v := getattr(settings, name)) is not None}
        return NewSessionSetup(self.system_prompt(settings), stored or None)

    def spec(self, stored: dict[str, Any] | None) -> AgentSpec:
        """The agent of a session created with ``stored`` (``sessions.settings``; ``None``: the default
        one). A route no longer configured falls back to the default route."""
        default = self.default_spec()
        if not stored:
            return default
        route = stored.get("route") or DEFAULT_ROUTE
        toolset = self.toolset(stored.get("toolset")) if stored.get("toolset") is not None else default.toolset
        if route == DEFAULT_ROUTE or route not in self.config.llm.route_names():
            return AgentSpec(model=default.model, base_url=default.base_url, api_key=default.api_key,
                             toolset=toolset, route=default.route)
        targets = self.config.llm.targets(self.providers, route)
        primary = targets[0]
        return AgentSpec(model=primary.model, base_url=primary.provider.base_url, api_key=primary.provider.api_key,
                         toolset=toolset, route=tuple(t.name for t in targets))

    def window_tokens(self, stored: dict[str, Any] | None) -> int | None:
        """The context window of a session's route when it is not the default one (``None``: default)."""
        route = (stored or {}).get("route")
        if not route or route == DEFAULT_ROUTE or route not in self.config.llm.route_names():
            return None
        return self.config.llm.route_window(route)

    def describe_route(self, route: str) -> str:
        """``provider:model`` entries of ``route``, primary first, for the replies."""
        return ", ".join(f"{p}:{m}" for p, m in self.config.llm.route_entries(route))


def session_skills(store: Store, session_id: str) -> list[str] | None:
    """The skills a session may load (its ``settings["skills"]``; ``None``: every skill). Blocking."""
    if not session_id:
        return None
    settings = store.session_settings(session_id)
    skills = (settings or {}).get("skills")
    return list(skills) if skills is not None else None


class ChatCommands:
    """``/model``, ``/persona``, ``/busy``: an admin's changes to the chat's settings (answered in the
    lane, without the model). Everyone may ask for the current value (no argument).

    Args:
        setup: the chat settings.
        is_admin: whether the sender of a message is an admin (``access.admins``).
    """

    COMMANDS = frozenset({"model", "persona", "busy"})

    def __init__(self, setup: ChatSetup, is_admin: Callable[[InboundMessage], bool]) -> None:
        self.setup = setup
        self.is_admin = is_admin

    def handle(self, message: InboundMessage) -> str | None:
        """The reply to one of ``COMMANDS``, or ``None`` for another message (blocking: DB)."""
        if message.command not in self.COMMANDS:
            return None
        args = message.text.strip()
        if args and not self.is_admin(message):
            return _(TEXTS["admin_only"])
        settings = self.setup.settings(message)
        if message.command == "model":
            return self._model(message, settings, args)
        if message.command == "persona":
            return self._persona(message, settings, args)
        return self._busy(message, settings, args)

    def _set(self, message: InboundMessage, name: str, value: str | None) -> None:
        address = message.address
        self.setup.overrides.set(address.platform, address.tenant, address.chat_id, name, value,
                                 f"{message.platform}:{message.sender.user_id}")

    def _model(self, message: InboundMessage, settings: ChatSettings, args: str) -> str:
        allowed = list(settings.models) if settings.models is not None else self.setup.config.llm.route_names()
        current = settings.route or DEFAULT_ROUTE
        if not args:
            return _(TEXTS["model_now"], route=current, targets=self.setup.describe_route(current),
                                             allowed=", ".join(allowed))
        name = args.split()[0]
        if name not in allowed:
            return _(TEXTS["model_unknown"], name=name, allowed=", ".join(allowed))
        self._set(message, "route", name)
        return _(TEXTS["model_set"], route=name, targets=self.setup.describe_route(name))

    def _persona(self, message: InboundMessage, settings: ChatSettings, args: str) -> str:
        names = ", ".join(self.setup.config.personas) or _(TEXTS["none_named"])
        if not args:
            return _(TEXTS["persona_now"], persona=_shown(settings.persona), names=names)
        if args.lower() in OFF_WORDS:
            self._set(message, "persona", None)
            return _(TEXTS["persona_off"])
        if len(args) > PERSONA_MAX_CHARS:
            return _(TEXTS["persona_long"], limit=PERSONA_MAX_CHARS, length=len(args))
        self._set(message, "persona", args)
        return _(TEXTS["persona_set"], persona=_shown(args))

    def _busy(self, message: InboundMessage, settings: ChatSettings, args: str) -> str:
        if not args:
            policy = settings.busy_policy or self.setup.config.bus.busy_policy
            return _(TEXTS["busy_now"], policy=policy, meaning=_(TEXTS[f"busy_{policy}"]))
        policy = args.split()[0].lower()
        if policy not in BUSY_POLICIES:
            return _(TEXTS["busy_unknown"])
        self._set(message, "busy_policy", policy)
        return _(TEXTS["busy_set"], policy=policy, meaning=_(TEXTS[f"busy_{policy}"]))


def _shown(persona: str | None) -> str:
    """A persona as the replies quote it (a long text is cut)."""
    if not persona:
        return _(TEXTS["persona_none"])
    return f'"{persona[:80]}…"' if len(persona) > 80 else f'"{persona}"'
