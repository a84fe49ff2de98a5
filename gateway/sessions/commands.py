"""Slash commands answered by the gateway itself, without the model (DESIGN §4).

Control commands (``/stop``) bypass the session's lane: they act while a turn is running.
Session commands run in the lane (after the turn in progress), on a worker thread.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from agent.skills import SkillLibrary
from gateway.core.i18n import N_, _, translate
from gateway.core.types import InboundMessage
from gateway.sessions.directory import CodeError, Directory
from gateway.skills.commands import plan_lines, skills_reply
from gateway.store.sql import Store

if TYPE_CHECKING:
    from gateway.sessions.chat_settings import ChatSetup

HELP: tuple[str, ...] = (
    N_("I am an AI assistant. Write to me in a DM, or mention me (or reply to me) in a group."),
    N_("Commands:"),
    N_("/new - start a fresh conversation (the old one stays in /sessions)"),
    N_("/sessions - your conversations"),
    N_("/resume ID - continue one of them"),
    N_("/status - model, conversation, usage, queue, the current plan"),
    N_("/usage - what you spent today and this month, and your limits"),
    N_("/skills - the procedures I can load, and their versions"),
    N_("/link - get a code to join another account of yours (Telegram, Slack, Feishu)"),
    N_("/link CODE - join this account to the one that made CODE"),
    N_("/unlink - detach this account again"),
    N_("/stop - stop the answer in progress"),
    N_('/schedule "0 9 * * 1-5" Asia/Shanghai [--to slack:T123:C456] WHAT TO REPORT - schedule a report'),
    N_("/jobs - your scheduled reports; /run ID - fire one now; /unschedule ID - remove one"),
    N_("/approve ID, /deny ID - allow or refuse an action I asked about"),
    N_("/memory - what I remember about you (/memory export: all of it as JSON); /forget ID - delete an entry"),
    N_("/files - how many files you sent I keep; /forget_files - delete them all"),
    N_("/model, /persona, /busy - this chat's model, persona and busy policy (admins change them: /model NAME, "
       "/persona NAME or TEXT, /busy queue|merge|interrupt)"),
    N_("/language - the language of my messages: /language zh, /language en, /language auto"),
    N_("/help - this message"),
)
"""The lines of ``/help`` (``help_text`` translates and joins them)."""


def help_text() -> str:
    """``/help`` in the current locale."""
    return "\n".join(_(line) for line in HELP)


MENU: tuple[tuple[str, str, frozenset[str]], ...] = (
    ("new", N_("Start a fresh conversation"), frozenset({"dm", "group"})),
    ("sessions", N_("List your conversations"), frozenset({"dm"})),
    ("resume", N_("Continue a conversation: /resume ID"), frozenset({"dm"})),
    ("status", N_("Model, conversation and usage"), frozenset({"dm", "group"})),
    ("usage", N_("Your spend today and this month, and your limits"), frozenset({"dm", "group"})),
    ("skills", N_("Skills and their versions"), frozenset({"dm", "group"})),
    ("link", N_("Link another account of yours"), frozenset({"dm"})),
    ("unlink", N_("Unlink this account"), frozenset({"dm"})),
    ("schedule", N_("Schedule a report: /schedule \"0 9 * * 1-5\" Zone what to report"), frozenset({"dm", "group"})),
    ("jobs", N_("Your scheduled reports"), frozenset({"dm", "group"})),
    ("run", N_("Fire a scheduled report now: /run ID"), frozenset({"dm", "group"})),
    ("unschedule", N_("Remove a scheduled report: /unschedule ID"), frozenset({"dm", "group"})),
    ("stop", N_("Stop the answer in progress"), frozenset({"dm", "group"})),
    ("approve", N_("Allow an action: /approve ID"), frozenset({"dm", "group"})),
    ("deny", N_("Refuse an action: /deny ID"), frozenset({"dm", "group"})),
    ("memory", N_("What I remember (about you, or this group)"), frozenset({"dm", "group"})),
    ("forget", N_("Delete a memory entry: /forget ID"), frozenset({"dm", "group"})),
    ("files", N_("The files of yours I keep"), frozenset({"dm", "group"})),
    ("forget_files", N_("Delete every file you sent me"), frozenset({"dm", "group"})),
    ("approve_user", N_("Approve a pairing code: /approve_user CODE"), frozenset({"admin"})),
    ("model", N_("This chat's model (admins: /model NAME)"), frozenset({"dm", "group"})),
    ("persona", N_("This chat's persona (admins: /persona NAME or TEXT)"), frozenset({"dm", "group"})),
    ("busy", N_("Messages sent while I answer (admins: /busy queue|merge|interrupt)"), frozenset({"dm", "group"})),
    ("language", N_("Language of my messages: /language zh|en|auto"), frozenset({"dm", "group"})),
    ("help", N_("What this bot can do"), frozenset({"dm", "group"})),
)
"""Every command of the native menu, once, with where it is offered: ``dm`` (private chats),
``group`` (group chats; commands that answer "in a DM" or would show a link code to the group are
left out) and ``admin`` (the DMs of admins, when pairing is on). Names follow Telegram's
setMyCommands rules: unique, 1-32 characters of ``a-z``, ``0-9`` and ``_``; descriptions 1-256
characters."""


def command_menu(audience: str, locale: str | None = None) -> list[tuple[str, str]]:
    """``(name, description)`` pairs of the native menu for ``audience``: ``"dm"``, ``"group"``, or
    ``"admin"`` (an admin's DM: every DM command plus the admin ones), in ``MENU`` order, the
    descriptions in ``locale`` (``None``: English)."""
    wanted = {"dm", "admin"} if audience == "admin" else {audience}
    return [(name, translate(locale, text)) for name, text, where in MENU if where & wanted]


CONTROL_COMMANDS = frozenset({"stop", "approve", "deny", "status", "language"})
"""Handled on receipt, outside the lane (``/status`` shows a running turn's plan while it runs;
``/language`` only writes ``users.language``)."""

LANE_COMMANDS = frozenset({"start", "help", "new", "sessions", "resume", "skills", "link", "unlink",
                           "approve_user", "approve-user"})
"""Answered by the gateway in the lane, without the model."""


def control_reply(command: str, was_running: bool) -> str:
    """The answer to a control command, in the current locale."""
    if command == "stop":
        return _("Stopped.") if was_running else _("Nothing is running; nothing to stop.")
    raise ValueError(f"not a control command: {command}")


@dataclass(frozen=True)
class CommandContext:
    """What a session command acts on: the message, its lane key and its sender's user."""

    message: InboundMessage
    key: str
    user_id: str | None
    is_dm: bool
    is_admin: bool
    model: str


class Commands:
    """Runs lane commands against the store and directory.

    Args:
        build_system_prompt: builds the system prompt of a new session (stored once).
        skills: the skill library ``/skills`` lists (``None``: skills are off).
        skill_tools: the tool names chat turns mount now (``/skills`` lists what the catalogue
            offers for them; ``None``: no tool check).
        chats: per-chat settings: ``/new`` creates the session the chat's settings describe
            (``None``: every session gets ``build_system_prompt()``).
    """

    def __init__(self, store: Store, directory: Directory, build_system_prompt: Callable[[], str],
                 skills: SkillLibrary | None = None,
                 skill_tools: Callable[[], Iterable[str]] | None = None, chats: ChatSetup | None = None) -> None:
        self.chats = chats
        self.skills = skills
        self.skill_tools = skill_tools
        self.store = store
        self.directory = directory
        self.build_system_prompt = build_system_prompt

    def run(self, ctx: CommandContext) -> str | None:
        """The reply to ``ctx.message``'s command, or ``None`` when it is not ours (the agent answers);
        in the current locale (``gateway.core.i18n.using``)."""
        command, args = ctx.message.command, ctx.message.text.strip()
        if command in ("start", "help"):
            return help_text()
        if command == "new":
            owner = ctx.user_id if ctx.is_dm else None
            if self.chats is not None:
                made = self.chats.new_session(ctx.message)
                self.store.new_session(ctx.key, made.system_prompt, owner, made.settings)
            else:
                self.store.new_session(ctx.key, self.build_system_prompt(), owner)
            return _("Started a new conversation. The previous one is listed in /sessions.")
        if command == "status":
            return self._status(ctx)
        if command == "skills":
            return skills_reply(self.skills, self.store, self.store.current_session_id(ctx.key),
                                self.skill_tools() if self.skill_tools is not None else None)
        if ctx.user_id is None:
            return None
        if command == "sessions":
            return self._sessions(ctx)
        if command == "resume":
            return self._resume(ctx, args)
        if command == "link":
            return self._link(ctx, args)
        if command == "unlink":
            unlinked = self.directory.unlink(ctx.message)
            return _("This account is unlinked; it starts a conversation of its own.") if unlinked else \
                _("This account is not linked to another one.")
        if command in ("approve_user", "approve-user"):
            if not ctx.is_admin:
                return _("Only an admin can approve users.")
            try:
                self.directory.approve(args)
            except CodeError as exc:
                return str(exc)
            return _("Approved: that user can talk to me now.")
        return None

    def _status(self, ctx: CommandContext) -> str:
        session_id = self.store.current_session_id(ctx.key)
        model = ctx.model
        if self.chats is not None and session_id is not None:  # the conversation's own, for its life
            model = self.chats.spec(self.store.session_settings(session_id)).model
        lines = [_("Model: {model}", model=model)]
        if session_id is None:
            lines.append(_("Conversation: none yet"))
        else:
            usage = self.directory.session_usage(session_id)
            cached = _(" ({n} of them cached)", n=usage.cached_tokens) if usage.cached_tokens else ""
            lines.append(_("Conversation: {id} ({n} messages)", id=session_id[:8], n=usage.messages))
            lines.append(_("Tokens used: {prompt} in{cached}, {completion} out", prompt=usage.prompt_tokens,
                           cached=cached, completion=usage.completion_tokens))
            if usage.cost_usd:
                lines.append(_("Cost so far: ${cost:.4f}", cost=usage.cost_usd))
            lines += plan_lines(self.store, session_id)
        lines.append(_("Waiting messages: {n}", n=self.directory.pending_count(ctx.key)))
        return "\n".join(lines)

    def _sessions(self, ctx: CommandContext) -> str:
        if not ctx.is_dm:
            return _("Your conversations are listed in a DM with me.")
        assert ctx.user_id is not None
        sessions = self.directory.sessions(ctx.user_id, ctx.key)
        if not sessions:
            return _("No conversations yet.")
        lines = [_("Your conversations (newest first); continue one with /resume ID:")]
        for s in sessions:
            when = datetime.fromtimestamp(s.last_used_at, UTC).strftime("%Y-%m-%d %H:%M UTC")
            mark = _(" (current)") if s.current else ""
            lines.append(f"{s.id[:8]} - {s.title or _('(untitled)')} - {when}{mark}")
        return "\n".join(lines)

    def _resume(self, ctx: CommandContext, args: str) -> str:
        if not ctx.is_dm:
            return _("Conversations can be resumed in a DM with me.")
        assert ctx.user_id is not None
        if not args:
            return _("Usage: /resume ID (see /sessions).")
        session_id = self.directory.owned_session(ctx.user_id, args.split()[0])
        if session_id is None:  # the same answer for someone else's session and for none at all
            return _("No conversation of yours has that ID. See /sessions.")
        self.store.switch_session(ctx.key, session_id)
        return _("Resumed conversation {id}.", id=session_id[:8])

    def _link(self, ctx: CommandContext, args: str) -> str:
        assert ctx.user_id is not None
        if not args:
            if not ctx.is_dm:
                return _("Ask me for a link code in a DM.")
            try:
                code = self.directory.new_code(ctx.user_id, "link")
            except CodeError as exc:
                return str(exc)
            return _("Your link code: {code}\nSend /link {code} from your other account (Telegram, Slack or "
                     "Feishu) within 10 minutes. It works once.", code=code)
        try:
            self.directory.link(args, ctx.user_id)  # "ABCDE-FGHJK", "abcde fghjk": the same code
        except CodeError as exc:
            return str(exc)
        return _("Linked. In DMs, this account now continues the same conversation as your other account.")


CommandHandler = Callable[[InboundMessage], "str | None"]
"""Answers a gateway command message, or ``None`` when it is not its command."""


def first_answer(handlers: Sequence[CommandHandler]) -> CommandHandler:
    """One command handler asking ``handlers`` in order; the first answer that is not ``None`` wins."""

    def handle(message: InboundMessage) -> str | None:
        for handler in handlers:
            answer = handler(message)
            if answer is not None:
                return answer
        return None

    return handle
