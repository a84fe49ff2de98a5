"""Interactive cards on Feishu/Lark: the messages the bot edits (streamed previews, the plan message,
the final text of a streamed reply) and the messages with command buttons (approvals), and what a
press on one of those buttons becomes. Pure: no I/O.

Why cards for everything edited (PLATFORMS.md §0.10 and §3.3; Feishu open API im/v1 "update message"
and "patch message card"): a text/post message can be edited (``PUT /open-apis/im/v1/messages/{id}``)
at most **20 times**, so a streamed answer would freeze after 20 edits and a long plan could not be
shown to its end. A card sent with ``config.update_multi: true`` (a shared card) is updated with
``PATCH /open-apis/im/v1/messages/{id}`` with no edit count, only ≤ 5 QPS per message and ≤ 14 days
of age. A message keeps its type, so the final text of a streamed reply is the last state of its
preview card (one message, delivered once), not a new post.

Shape (Feishu card JSON 2.0, as lark-oapi 1.7.5 ``lark_oapi.channel.card.CardBuilder`` builds it):
``{"schema": "2.0", "config": {"update_multi": true}, "body": {"elements": [...]}}``; markdown text is
a ``markdown`` element, plain text a ``div`` with ``plain_text``; buttons sit in one ``column_set``
row, each button's ``value`` an object that the ``card.action.trigger`` callback hands back as
``event.action.value``. Size: an interactive request body ≤ 30 KB (error 230025), so long text is
cut into several cards.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from adapters.feishu.format import BODY_OVERHEAD_BYTES, POST_LIMIT_BYTES, Part, encoded_size, split_text
from adapters.feishu.inbound import FEISHU_LANGUAGE
from gateway.core.types import ChatAddress, InboundMessage, Sender

CARD_ACTION_EVENT = "card.action.trigger"
COMMAND_KEY = "gw_cmd"
"""Key of a command button's ``value`` holding the command text (``/approve ID``)."""
_TAG_LIKE = re.compile(r"<(?=[A-Za-z/!])")


def _element(text: str, fmt: str) -> dict[str, Any]:
    if fmt == "markdown":
        # Card markdown reads tags (``<at id=all>`` pings everyone, ``<font>``...): model text never
        # becomes one.
        return {"tag": "markdown", "content": _TAG_LIKE.sub("&lt;", text)}
    return {"tag": "div", "text": {"tag": "plain_text", "content": text}}


def _buttons(buttons: tuple[tuple[str, str], ...], context: Mapping[str, Any]) -> dict[str, Any]:
    columns = [{"tag": "column", "width": "auto", "elements": [{
        "tag": "button", "text": {"tag": "plain_text", "content": label[:40]},
        "type": "primary" if index == 0 else "default",
        "value": {**context, COMMAND_KEY: command}}]} for index, (label, command) in enumerate(buttons)]
    return {"tag": "column_set", "columns": columns}


def card(text: str, fmt: str = "markdown", buttons: tuple[tuple[str, str], ...] = (),
         context: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One shared card showing ``text`` (``fmt`` ``markdown`` | ``plain``) and, when given, one row of
    command ``buttons`` (``(label, command text)``) whose values also carry ``context`` (JSON-safe)."""
    elements = [_element(text or " ", fmt)]
    if buttons:
        elements.append(_buttons(buttons, context or {}))
    return {"schema": "2.0", "config": {"update_multi": True}, "body": {"elements": elements}}


_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")


def _open_fence(markdown: str) -> tuple[str, str] | None:
    """The code fence still open at the end of ``markdown`` (CommonMark fenced code blocks: a line of
    3+ backticks or tildes opens, one of the same character at least as long with nothing after it
    closes): ``(marker, opening line)``, or ``None``."""
    opened: tuple[str, str] | None = None
    for line in markdown.split("\n"):
        match = _FENCE.match(line)
        if not match:
            continue
        marker, rest = match.groups()
        if opened is None:
            if not (marker[0] == "`" and "`" in rest):  # a backtick fence's info string has no backtick
                opened = (marker, line.strip())
        elif marker[0] == opened[0][0] and len(marker) >= len(opened[0]) and not rest.strip():
            opened = None
    return opened


def _markdown_pieces(text: str, budget: int) -> list[str]:
    """``text`` cut into pieces of ≤ ``budget`` bytes (``split_text``); a code block cut between two
    pieces is closed at the end of the first and opened again, with its info string (the language),
    at the start of the next, so each card shows code as code."""
    fences = [line.strip() for line in text.split("\n") if _FENCE.match(line)]
    room = 2 * max((encoded_size(line) for line in fences), default=0) + 8 if fences else 0
    pieces, opened = [], None
    for piece in split_text(text, budget - room):
        if opened is not None:
            piece = f"{opened[1]}\n{piece}"
        opened = _open_fence(piece)
        if opened is not None:
            piece = f"{piece.rstrip(chr(10))}\n{opened[0]}"
        pieces.append(piece)
    return pieces


def card_parts(text: str, fmt: str = "markdown", buttons: tuple[tuple[str, str], ...] = (),
               context: Mapping[str, Any] | None = None, limit: int = POST_LIMIT_BYTES) -> list[Part]:
    """``text`` as ``interactive`` parts, each request body ≤ ``limit`` bytes; the buttons go on the
    last. Always at least one part (an empty text gives one blank card). Markdown is measured as it
    is sent (``<`` already ``&lt;``: it may quadruple an HTML answer) and cut with its code blocks
    closed and reopened (``_markdown_pieces``)."""
    shell = encoded_size(card("", fmt, buttons, context))
    budget = limit - BODY_OVERHEAD_BYTES - shell
    if fmt == "markdown":
        pieces = _markdown_pieces(_TAG_LIKE.sub("&lt;", text.strip()), budget) or [""]
    else:
        pieces = split_text(text.strip(), budget) or [""]
    last = len(pieces) - 1
    return [Part("interactive", json.dumps(card(piece, fmt, buttons if i == last else (), context),
                                           ensure_ascii=False)) for i, piece in enumerate(pieces)]


def plain_card_part(part: Part) -> Part:
    """The same card with each ``markdown`` element shown as plain text (a ``div`` with
    ``plain_text``, which Feishu does not parse): what is sent again when Feishu refuses the card's
    markdown (230099 "Failed to create card content", e.g. ErrCode 11310 "card table number over
    limit": at most five tables per card, Feishu card docs, table component; 230001). Buttons stay."""
    content = json.loads(part.content)
    for element in content.get("body", {}).get("elements", []):
        if element.get("tag") == "markdown":
            text = str(element.pop("content", "")).replace("&lt;", "<")
            element.clear()
            element.update(_element(text, "plain"))
    return Part("interactive", json.dumps(content, ensure_ascii=False))


def action_to_inbound(body: Mapping[str, Any], bot_open_id: str) -> InboundMessage | None:
    """A press on a command button (a ``card.action.trigger`` callback, schema 2.0) as the command it
    carries, sent by the presser in the chat of the card; ``None`` for any other event or press.

    Feishu card callback (lark-oapi ``P2CardActionTrigger``): ``event.operator.open_id`` is who pressed,
    ``event.action.value`` the button's value, ``event.context.open_message_id``/``open_chat_id`` the
    card and its chat; ``header.event_id`` is the same when Feishu pushes the callback again (the
    dedupe id). The card's thread and chat type come back in the value (``card(context=...)``), since
    the callback does not carry them.
    """
    header = body.get("header") or {}
    if header.get("event_type") != CARD_ACTION_EVENT:
        return None
    event = body.get("event") or {}
    value = (event.get("action") or {}).get("value")
    presser = str((event.get("operator") or {}).get("open_id") or "")
    context = event.get("context") or {}
    chat_id, card_id = str(context.get("open_chat_id") or ""), str(context.get("open_message_id") or "")
    if not isinstance(value, Mapping) or not presser or presser == bot_open_id or not chat_id:
        return None
    command = str(value.get(COMMAND_KEY) or "")
    if not command.startswith("/") or len(command) < 2:
        return None
    name, _, args = command[1:].partition(" ")
    thread_id = str(value.get("thread_id") or "") or None
    is_dm = value.get("chat_type") == "dm"
    tenant = str(header.get("tenant_key") or (event.get("operator") or {}).get("tenant_key") or "")
    try:
        received_at = int(header.get("create_time") or 0) / 1000.0
    except (TypeError, ValueError, OverflowError):  # not a number, or too large for a float
        received_at = 0.0
    return InboundMessage(
        address=ChatAddress("feishu", tenant, chat_id, thread_id),
        message_id=f"{card_id or chat_id}:action:{header.get('event_id') or event.get('token') or ''}",
        chat_type="dm" if is_dm else "group",
        sender=Sender(presser, "", None, False),
        text=args.strip(),
        reply_to_id=None if is_dm and thread_id is None else (card_id or None),
        command=name.lower(),
        received_at=received_at,
        event_id=str(header.get("event_id") or "") or None,
        language=FEISHU_LANGUAGE,
    )
