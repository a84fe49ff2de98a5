"""Pure inbound translation: a Slack Events API envelope -> ``InboundMessage`` or a reason to ignore it.

Rules (PLATFORMS.md §2.2, Slack Events API: ``message.im``, ``message.channels``, ``app_mention``):
- DMs (``channel_type: im``) are the user's conversation; everything else is a group chat;
- a top-level channel message is taken only when it mentions the bot (``app_mention``, or the
  ``message.channels`` twin of the same post); its session is a new thread rooted at its ``ts``;
- a message inside a thread (``thread_ts``) belongs to that thread's session; without a mention it
  is ``addressed=False`` (the gateway takes it only when the bot is already part of the thread);
- the message id is ``"<channel>:<ts>"``: Slack sends ``app_mention`` and ``message.channels`` for
  one post with different ``event_id``s, and this key makes them one turn;
- new user text only: no subtype, ``file_share`` or ``thread_broadcast``; edits, deletions, joins
  and other subtypes are ignored, and so is an event carrying ``edited`` (Slack sends
  ``app_mention`` again, with ``edited``, when a message is edited to mention the bot); the bot's
  own messages (user id or bot id) are ignored in every channel type, other bots by default;
- Slack markup is turned into plain text: the bot's mention removed, ``<@U…>`` replaced by the
  display names the caller resolved, ``<#C…|name>``, ``<!here>``, ``<url|label>`` made readable,
  ``&amp; &lt; &gt;`` unescaped (Slack: "Formatting text for app surfaces");
- a thread reply names its thread's parent as ``quoted`` (id only: Slack events do not carry the
  parent's text; the adapter reads it with ``conversations.replies`` when the turn needs it);
- with ``ambient`` (group context configured), a top-level channel message that does not mention
  the bot becomes a ``context_only`` message instead of being ignored.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.core.types import Attachment, ChatAddress, ContextMessage, InboundMessage, Sender

NEW_TEXT_SUBTYPES = frozenset({None, "file_share", "thread_broadcast"})
"""Message subtypes that carry new user text (PLATFORMS.md §2.2)."""

_MARKUP = re.compile(r"<([^<>]*)>")
_USER_MENTION = re.compile(r"<@([UW][A-Z0-9]+)(?:\|[^<>]*)?>")
_COMMAND = re.compile(r"^/([A-Za-z][A-Za-z0-9_]*)(?=\s|$)")
_SPACES = re.compile(r"[ \t]{2,}")


@dataclass(frozen=True, slots=True)
class Ignored:
    """Why an event produces no turn (``own_message``, ``from_bot``, ``subtype:message_changed``,
    ``not_addressed``, ``event:reaction_added``, ...)."""

    reason: str


@dataclass(frozen=True, slots=True)
class BotIdentity:
    """The app's own ids, from ``auth.test``: bot user ``U…``, bot ``B…`` and workspace ``T…``."""

    user_id: str
    bot_id: str
    team_id: str


def users_to_resolve(envelope: dict[str, Any], bot: BotIdentity) -> set[str]:
    """User ids whose display names ``to_inbound`` can use: the author and every ``<@U…>``
    mention except the bot's own. Empty for events that are not messages."""
    event = envelope.get("event")
    if not isinstance(event, dict):
        return set()
    found = set(_USER_MENTION.findall(str(event.get("text") or "")))
    if event.get("user"):
        found.add(str(event["user"]))
    found.discard(bot.user_id)
    return found


def _attachment(file: dict[str, Any]) -> Attachment:
    """A Slack file object (``files`` of a message event): ``url_private_download`` is where the
    bytes are (it needs the bot token); a voice clip (``subtype: "slack_audio"``) is ``voice``; a
    GIF is an ``animation``."""
    mime = str(file.get("mimetype") or "") or None
    major = (mime or "").split("/", 1)[0]
    kind = major if major in ("image", "audio", "video") else "document"
    if mime == "image/gif":
        kind = "animation"
    if file.get("subtype") == "slack_audio" or file.get("media_display_type") == "audio":
        kind = "voice"
    size = file.get("size")
    url = file.get("url_private_download") or file.get("url_private")
    width, height = file.get("original_w"), file.get("original_h")
    return Attachment(kind, str(file.get("id") or ""), file.get("name") or file.get("title"), mime,
                      int(size) if isinstance(size, int) else None, url=str(url) if url else None,
                      width=width if isinstance(width, int) else None,
                      height=height if isinstance(height, int) else None)


def _unescape(text: str) -> str:
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def plain_text(text: str, bot_user_id: str, names: Mapping[str, str]) -> str:
    """Slack message markup -> readable text: the bot's mention removed, other mentions as
    ``@Name`` (``names`` maps user id -> display name; unknown ids stay ``@U…``), channels as
    ``#name``, special mentions as ``@here``, links as ``label (url)`` or ``url``; entities
    unescaped; runs of spaces left by removed mentions collapsed; trimmed."""

    def replace(match: re.Match[str]) -> str:
        inner = match.group(1)
        target, _, label = inner.partition("|")
        if target.startswith("@"):
            user = target[1:]
            return "" if user == bot_user_id else f"@{names.get(user) or label or user}"
        if target.startswith("#"):
            return f"#{label or target[1:]}"
        if target.startswith("!"):
            special = target[1:].split("^", 1)[0]
            if label:
                return label if special != "subteam" or label.startswith("@") else f"@{label}"
            return f"@{special}"
        url = _unescape(target)
        if not label:
            return url.removeprefix("mailto:")
        label = _unescape(label)
        return label if label in (url, url.removeprefix("mailto:")) else f"{label} ({url})"

    replaced = _MARKUP.sub(replace, text)
    return _SPACES.sub(" ", _unescape(replaced)).strip()


def to_inbound(envelope: dict[str, Any], bot: BotIdentity, names: Mapping[str, str] | None = None, *,
               allow_bots: bool = False, ambient: bool = False) -> InboundMessage | Ignored:
    """Normalizes one ``event_callback`` envelope. Pure: no I/O, no clock (``received_at`` is the
    message's own ``ts``).

    Args:
        envelope: the JSON body Slack POSTs (or a Socket Mode ``events_api`` payload).
        bot: the app's ids (``auth.test``).
        names: display names by user id, for the author and mentioned users (see
            ``users_to_resolve``); missing names fall back to the id.
        allow_bots: take messages from other bots (never from this one).
        ambient: return a top-level channel message that does not mention the bot as a
            ``context_only`` message (kept as group context) instead of ``Ignored("not_addressed")``.
    """
    names = names or {}
    if envelope.get("type") != "event_callback" or not isinstance(envelope.get("event"), dict):
        return Ignored("not_an_event")
    event: dict[str, Any] = envelope["event"]
    event_type = event.get("type")
    if event_type not in ("message", "app_mention"):
        return Ignored(f"event:{event_type}")
    profile = event.get("bot_profile")
    bot_profile: dict[str, Any] = profile if isinstance(profile, dict) else {}
    if event.get("user") == bot.user_id or bot.bot_id in (event.get("bot_id"), bot_profile.get("id")):
        return Ignored("own_message")
    subtype = event.get("subtype")
    if subtype not in NEW_TEXT_SUBTYPES and not (allow_bots and subtype == "bot_message"):
        return Ignored(f"subtype:{subtype}")
    if event.get("edited"):
        return Ignored("edited")  # an edit never starts a turn (also an edit that adds the mention)
    if (event.get("bot_id") or subtype == "bot_message") and not allow_bots:
        return Ignored("from_bot")
    user = str(event.get("user") or event.get("bot_id") or "")
    channel, ts = str(event.get("channel") or ""), str(event.get("ts") or "")
    if not user or not channel or not ts:
        return Ignored("incomplete_event")

    raw_text = str(event.get("text") or "")
    channel_type = event.get("channel_type") or ("im" if channel.startswith("D") else "channel")
    is_dm = channel_type == "im"
    mentions_bot = any(m == bot.user_id for m in _USER_MENTION.findall(raw_text))
    addressed = is_dm or event_type == "app_mention" or mentions_bot
    thread_ts = str(event["thread_ts"]) if event.get("thread_ts") else None
    if is_dm or thread_ts:
        thread_id = thread_ts  # a DM thread keeps the DM session; replies go into that thread
    elif addressed:
        thread_id = ts  # a top-level mention starts a thread rooted at itself
    elif ambient:
        thread_id = None  # channel chatter: at most group context
    else:
        return Ignored("not_addressed")

    text = plain_text(raw_text, bot.user_id, names)
    listed = event.get("files")
    files: list[Any] = listed if isinstance(listed, list) else []
    attachments = tuple(_attachment(f) for f in files if isinstance(f, dict) and f.get("id"))
    if not text and not attachments:
        return Ignored("empty")
    command_match = _COMMAND.match(text)
    if command_match:  # as on every platform: the command apart, its arguments as the text
        text = text[command_match.end():].strip()
    try:
        received_at = float(ts)
    except ValueError:
        received_at = 0.0
    return InboundMessage(
        address=ChatAddress("slack", str(envelope.get("team_id") or bot.team_id), channel, thread_id),
        message_id=f"{channel}:{ts}",
        chat_type="dm" if is_dm else "group",
        sender=Sender(user, names.get(user, ""), None, bool(event.get("bot_id"))),
        text=text,
        command=command_match.group(1).lower() if command_match else None,
        attachments=attachments,
        received_at=received_at,
        event_id=str(envelope["event_id"]) if envelope.get("event_id") else None,
        addressed=addressed,
        quoted=ContextMessage(f"{channel}:{thread_ts}") if thread_ts and thread_ts != ts else None,
        context_only=not is_dm and not thread_ts and not addressed,
        opens_thread=not is_dm and not thread_ts and addressed,
    )


ACTION_PREFIX = "gw_cmd_"
"""``action_id`` prefix of the gateway's command buttons (the button's ``value`` is the command)."""


def command_blocks(text: str, buttons: tuple[tuple[str, str], ...]) -> list[dict[str, Any]]:
    """Block Kit for a message with command buttons: the mrkdwn text, then one actions row.

    Slack Block Kit: a section's text holds at most 3,000 characters; a button's ``value`` at most
    2,000; an actions block at most 25 elements.
    """
    section_text = text if len(text) <= 3000 else text[:2990] + "…"
    elements = [{"type": "button", "text": {"type": "plain_text", "text": label[:75]},
                 "action_id": f"{ACTION_PREFIX}{i}", "value": command[:2000]}
                for i, (label, command) in enumerate(buttons[:25])]
    return [{"type": "section", "text": {"type": "mrkdwn", "text": section_text}},
            {"type": "actions", "elements": elements}]


def action_to_inbound(body: Mapping[str, Any], bot: BotIdentity) -> InboundMessage | Ignored:
    """A pressed command button (``block_actions`` payload) becomes that command sent by the
    presser, in the chat (and thread) of the message carrying the button. Pure.

    Slack interactivity: ``user.id`` is who pressed, ``channel.id`` where, ``message.thread_ts``
    the thread of the pressed message, ``actions[0].value`` the button's value, ``action_ts`` a
    per-press timestamp (the dedupe id: Slack may redeliver an interaction).
    """
    actions = body.get("actions") or []
    if body.get("type") != "block_actions" or not actions or not isinstance(actions[0], Mapping):
        return Ignored("unsupported_interaction")
    action = actions[0]
    value = str(action.get("value") or "")
    user = str((body.get("user") or {}).get("id") or "")
    channel = str((body.get("channel") or {}).get("id") or (body.get("container") or {}).get("channel_id") or "")
    if not str(action.get("action_id", "")).startswith(ACTION_PREFIX) or not value.startswith("/") \
            or not user or not channel or user == bot.user_id:
        return Ignored("unsupported_interaction")
    name, _, args = value[1:].partition(" ")
    message = body.get("message") or {}
    thread = message.get("thread_ts")
    team = str((body.get("team") or {}).get("id") or bot.team_id)
    return InboundMessage(
        address=ChatAddress("slack", team, channel, str(thread) if thread else None),
        message_id=f"{channel}:action:{action.get('action_ts') or message.get('ts')}:{user}",
        chat_type="dm" if channel.startswith("D") else "group",
        sender=Sender(user, str((body.get("user") or {}).get("name") or ""), None, False),
        text=args.strip(),
        command=name.lower(),
        received_at=float(action.get("action_ts") or 0.0),
    )
