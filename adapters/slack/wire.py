"""Typed shape of what Slack POSTs to the Events API URL, checked before Bolt or the gateway see it.

Slack Events API (https://api.slack.com/apis/events-api): the ``event_callback`` envelope
(``team_id``, ``event_id``, ``authorizations``, ``event``), ``url_verification`` (``challenge``);
message events (``message``, ``app_mention``: ``user``, ``channel``, ``ts``, ``thread_ts``, ``text``,
``files``); interactivity (``block_actions``, sent form-encoded as ``payload=<JSON>``); slash
commands (form fields, or a ``slash_commands`` Socket Mode payload). Ids are strings, ``ts``
values are strings like ``"1735689600.000100"``. Other event types are checked for their envelope
only: their ``user`` may be an object (``team_join``, ``user_change``).
"""

from __future__ import annotations

from typing import Any

from adapters.wire import Id, Label, Name, Text, WireModel, Word, check

MESSAGE_EVENTS = ("message", "app_mention")
Ts = Word


class File(WireModel):
    id: Id | None = None
    name: Text | None = None
    title: Text | None = None
    mimetype: Label | None = None
    size: int | None = None


class MessageEvent(WireModel):
    type: Name
    user: Id | None = None
    bot_id: Id | None = None
    subtype: Name | None = None
    text: Text | None = None
    channel: Id
    channel_type: Word | None = None
    ts: Ts
    thread_ts: Ts | None = None
    files: list[File] | None = None
    bot_profile: dict[str, Any] | None = None
    team: Id | None = None
    user_team: Id | None = None


class AnyEvent(WireModel):
    type: Name


class Envelope(WireModel):
    type: Name
    token: Text | None = None
    team_id: Id | None = None
    api_app_id: Id | None = None
    enterprise_id: Id | None = None
    event_id: Id | None = None
    event_time: int | None = None
    authorizations: list[dict[str, Any]] | None = None
    is_enterprise_install: bool | None = None
    is_ext_shared_channel: bool | None = None
    challenge: Text | None = None
    event: dict[str, Any] | None = None


class IdRef(WireModel):
    id: Id
    name: Text | None = None
    team_id: Id | None = None


class MessageRef(WireModel):
    ts: Ts | None = None
    thread_ts: Ts | None = None


class Action(WireModel):
    action_id: Label
    value: Text | None = None
    action_ts: Ts | None = None


class Interaction(WireModel):
    type: Name
    user: IdRef | None = None
    channel: IdRef | None = None
    team: IdRef | None = None
    container: dict[str, Any] | None = None
    message: MessageRef | None = None
    actions: list[Action] | None = None


class SlashCommand(WireModel):
    """A slash command (form fields over HTTP, the ``slash_commands`` frame's payload in Socket
    Mode): every field a string."""

    command: Name
    text: Text | None = None
    user_id: Id
    user_name: Text | None = None
    channel_id: Id
    channel_name: Text | None = None
    team_id: Id | None = None
    team_domain: Text | None = None
    enterprise_id: Id | None = None
    enterprise_name: Text | None = None
    api_app_id: Id | None = None
    is_enterprise_install: Word | None = None
    response_url: Label | None = None
    trigger_id: Label | None = None
    token: Text | None = None


def event_id_of(data: Any) -> str | None:
    """The envelope's ``event_id`` when it is a readable string (for logs), else ``None``."""
    value = data.get("event_id") if isinstance(data, dict) else None
    return value if isinstance(value, str) and len(value) <= 128 else None


def envelope_problem(data: Any) -> str | None:
    """``None`` when a decoded Events API body has the documented types, else a log-safe reason.

    ``event_callback`` needs an ``event`` object with a string ``type``; message events are checked
    field by field; ``url_verification`` needs a string ``challenge``."""
    problem = check(Envelope, data)
    if problem is not None:
        return problem
    if data["type"] == "url_verification" and not isinstance(data.get("challenge"), str):
        return "challenge: Input should be a valid string"
    event = data.get("event")
    if data["type"] == "event_callback" and event is None:
        return "event: Field required"
    if event is None:
        return None
    problem = check(AnyEvent, event)
    if problem is None and event["type"] in MESSAGE_EVENTS:
        problem = check(MessageEvent, event)
    return f"event.{problem}" if problem is not None else None


def slash_command_problem(data: Any) -> str | None:
    """``None`` when a slash command's fields have the documented types, else a log-safe reason."""
    return check(SlashCommand, data)


def interaction_problem(data: Any) -> str | None:
    """``None`` when a decoded interactivity ``payload`` has the documented types, else why not."""
    return check(Interaction, data)
