"""Job requests -> validated job definitions, one set of rules for the chat commands, the agent's
``schedule_report`` tool and the CLI: the zone exists, the schedule parses and fires, the target
is a chat the requester may post to. Every error names the problem (it is shown to the user).
"""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass
from datetime import UTC, datetime

from gateway.core.errors import GatewayError
from gateway.core.types import ChatAddress, InboundMessage
from gateway.scheduler.store import Job, JobStore, NewJob
from gateway.scheduler.triggers import Schedule, ScheduleError, build_trigger, first_fire, parse_schedule, zone

MAX_PROMPT_CHARS = 4000
TARGET_FORMS = "here, platform:chat, platform:tenant:chat or platform:tenant:chat:thread (e.g. slack:T123:C456)"


class JobError(GatewayError):
    """A job request that cannot be accepted; the message says why, in words for the user."""


@dataclass(frozen=True, slots=True)
class Requester:
    """Who asks: a platform identity and the chat the request came from."""

    platform: str
    tenant: str
    user_id: str
    name: str
    chat: ChatAddress
    chat_type: str

    @property
    def key(self) -> str:
        """``platform:tenant:user_id`` (the job's ``owner``)."""
        return f"{self.platform}:{self.tenant}:{self.user_id}"

    @classmethod
    def of(cls, message: InboundMessage) -> Requester:
        """The sender of ``message``, in the chat it came from."""
        sender = message.sender
        return cls(message.platform, message.address.tenant, sender.user_id,
                   sender.display_name or sender.username or sender.user_id, message.address, message.chat_type)


class JobPlanner:
    """Validates job requests into ``NewJob``s.

    Permission rule (interim, until linked identities exist): a user may target a chat only if
    they have written to the bot from that chat themselves, i.e. the inbox holds a message from
    that chat address (any thread) whose sender is that user on that platform account. The chat
    a command comes from always qualifies. Operators (``scheduler.operators``: ``platform:user_id``
    or ``platform:tenant:user_id``) may target any chat the bot has received a message from, on
    any platform. Jobs added from the CLI (no requester) are trusted.

    Args:
        platforms: platforms this gateway can deliver to (enabled adapters).
        toolsets: names accepted for a job's toolset.
    """

    def __init__(self, jobs: JobStore, *, platforms: Collection[str], operators: Collection[str] = (),
                 toolsets: Collection[str] = ("default",)) -> None:
        self.jobs = jobs
        self.platforms = set(platforms)
        self.operators = set(operators)
        self.toolsets = set(toolsets)

    def is_operator(self, requester: Requester | None) -> bool:
        """CLI (``None``) and configured operators."""
        return requester is None or bool(
            {f"{requester.platform}:{requester.user_id}", requester.key} & self.operators)

    def may_manage(self, requester: Requester | None, job: Job) -> bool:
        """The job's owner and operators may run or remove it."""
        return self.is_operator(requester) or (requester is not None and job.owner == requester.key)

    def plan(self, *, schedule: str, timezone: str, prompt: str, target: str | None,
             requester: Requester | None, source: str | None = None, toolset: str = "default",
             owner_dm: ChatAddress | None = None, now: float | None = None) -> NewJob:
        """Checks a request and returns the job to store.

        Args:
            schedule: user text (``0 9 * * 1-5``, ``@daily``, ``every 2h``, ``at 2026-12-01 09:00``).
            timezone: IANA zone name.
            target: ``None``/``here`` for the requester's chat, else see ``TARGET_FORMS``.
            source: dedupe key of the request (a redelivered command finds its job).
            owner_dm: where failures are reported for CLI jobs (chat jobs: the requester's DM).

        Raises:
            JobError: naming what is wrong (zone, schedule, target, permission, prompt, toolset).
        """
        now = time.time() if now is None else now
        try:
            zone(timezone)
            parsed = parse_schedule(schedule)
            trigger = build_trigger(parsed, timezone, anchor=now)
        except ScheduleError as exc:
            raise JobError(str(exc)) from None
        first = first_fire(trigger, datetime.fromtimestamp(now, UTC))
        if first is None:
            raise JobError(f"the schedule {parsed.describe()!r} never fires (in {timezone}): "
                           "check the day and month, or the one-shot time is in the past")
        prompt = prompt.strip()
        if not prompt:
            raise JobError("say what the report should contain (the prompt is empty)")
        if len(prompt) > MAX_PROMPT_CHARS:
            raise JobError(f"the prompt is too long ({len(prompt)} characters; at most {MAX_PROMPT_CHARS})")
        if toolset not in self.toolsets:
            raise JobError(f"unknown toolset {toolset!r} (known: {', '.join(sorted(self.toolsets))})")
        address = self.resolve_target(target, requester)
        self.check_target(requester, address)
        if requester is not None:
            owner, owner_name = requester.key, requester.name
            owner_dm = (ChatAddress(requester.chat.platform, requester.chat.tenant, requester.chat.chat_id)
                        if requester.chat_type == "dm"
                        else self.jobs.dm_address(requester.platform, requester.tenant, requester.user_id))
        else:
            owner, owner_name = "cli", "operator"
        return NewJob(owner=owner, owner_name=owner_name, owner_dm=owner_dm, target=address,
                      schedule_kind=parsed.kind, schedule=parsed.expr, timezone=timezone, prompt=prompt,
                      toolset=toolset, source=source, next_fire_at=first.timestamp())

    def resolve_target(self, text: str | None, requester: Requester | None) -> ChatAddress:
        """Parses a target (see ``TARGET_FORMS``); ``platform:chat`` takes the tenant from the inbox.

        Raises:
            JobError: malformed, unknown platform, or an unknown/ambiguous chat.
        """
        if text is None or text.strip().lower() in ("", "here"):
            if requester is None:
                raise JobError("a target is required (" + TARGET_FORMS + ")")
            return requester.chat
        parts = text.strip().split(":")
        if len(parts) < 2 or len(parts) > 4 or not all(parts):
            raise JobError(f"bad target {text!r}: use {TARGET_FORMS}")
        platform = parts[0].lower()
        if platform not in self.platforms:
            known = ", ".join(sorted(self.platforms)) or "none"
            raise JobError(f"bad target {text!r}: platform {platform!r} is not enabled here (enabled: {known})")
        if len(parts) == 2:
            tenants = self.jobs.tenants_of_chat(platform, parts[1])
            if requester is not None and requester.platform == platform and requester.tenant not in tenants:
                tenants.append(requester.tenant)
            if len(tenants) != 1:
                problem = "no message from that chat has reached me" if not tenants else "it exists in several accounts"
                raise JobError(f"cannot resolve target {text!r}: {problem}; write it as "
                               f"{platform}:TENANT:{parts[1]}")
            return ChatAddress(platform, tenants[0], parts[1])
        return ChatAddress(platform, parts[1], parts[2], parts[3] if len(parts) == 4 else None)

    def check_target(self, requester: Requester | None, target: ChatAddress) -> None:
        """Raises ``JobError`` unless ``requester`` may post to ``target`` (see the class rule)."""
        if requester is None:
            return
        if (target.platform, target.tenant, target.chat_id) == (
                requester.chat.platform, requester.chat.tenant, requester.chat.chat_id):
            return
        if self.is_operator(requester):
            if self.jobs.chat_seen(target.platform, target.tenant, target.chat_id):
                return
            raise JobError(f"target {format_address(target)} is not a chat I have received a message from")
        if (target.platform, target.tenant) == (requester.platform, requester.tenant) and \
                self.jobs.has_written_from(target.platform, target.tenant, requester.user_id, target.chat_id):
            return
        raise JobError(f"you may not post to {format_address(target)}: schedule reports only into chats you "
                       "have written to me from")


def format_address(address: ChatAddress) -> str:
    """``platform:tenant:chat[:thread]`` (the target syntax)."""
    text = f"{address.platform}:{address.tenant}:{address.chat_id}"
    return f"{text}:{address.thread_id}" if address.thread_id else text


def job_schedule(job: Job) -> Schedule:
    """The job's schedule as the scheduler reads it."""
    return Schedule(job.schedule_kind, job.schedule)


def next_fire_of(job: Job, now: float | None = None) -> datetime | None:
    """When ``job`` fires next (UTC), computed from its trigger; ``None`` if never (or disabled)."""
    if not job.enabled:
        return None
    try:
        trigger = build_trigger(job_schedule(job), job.timezone, anchor=job.created_at)
    except ScheduleError:
        return None
    return first_fire(trigger, datetime.fromtimestamp(time.time() if now is None else now, UTC))


def local_time(epoch: float | datetime | None, timezone: str) -> str:
    """``2026-12-01 09:00 Asia/Shanghai`` (or ``-``)."""
    if epoch is None:
        return "-"
    moment = epoch if isinstance(epoch, datetime) else datetime.fromtimestamp(epoch, UTC)
    try:
        return moment.astimezone(zone(timezone)).strftime("%Y-%m-%d %H:%M ") + timezone
    except ScheduleError:
        return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")
