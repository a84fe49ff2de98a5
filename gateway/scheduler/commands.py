"""Chat commands for scheduled reports, answered by the gateway without the model (like ``/help``):

    /schedule "0 9 * * 1-5" Asia/Shanghai [--to slack:T123:C456] Summarise yesterday's sales
    /jobs                 your jobs with their last and next fire
    /unschedule ID        remove a job
    /run ID               fire a job now

They run in the chat's lane on a worker thread (``TurnRunner``), and are idempotent: a redelivered
``/schedule`` finds the job it created (keyed by the message), a redelivered ``/run`` claims the
same run (keyed by the message's timestamp), so neither acts twice.
"""

from __future__ import annotations

import logging
import re

from gateway.core.i18n import N_, _, sentences
from gateway.core.types import InboundMessage
from gateway.scheduler.planner import (
    TARGET_FORMS,
    JobError,
    JobPlanner,
    Requester,
    format_address,
    job_schedule,
    local_time,
    next_fire_of,
)
from gateway.scheduler.service import PushService
from gateway.scheduler.store import Job, JobRun, JobStore

log = logging.getLogger("gateway.scheduler.planner")

JOB_COMMANDS = frozenset({"schedule", "jobs", "unschedule", "run"})

USAGE = N_('Usage: `/schedule "CRON" ZONE [--to TARGET] WHAT TO REPORT`, e.g.\n'
           '`/schedule "0 9 * * 1-5" Asia/Shanghai Summarise yesterday\'s sales`\n'
           "Schedules: a crontab line (0 and 7 = Sunday), @daily, every 2h, at 2026-12-01 09:00.\n"
           "Targets: {targets}.")
"""Translated where sent: ``usage()``."""


def usage() -> str:
    """``USAGE`` in the current locale."""
    return _(USAGE, targets=TARGET_FORMS)

_QUOTES = {'"': '"', "“": "”", "„": "“", "”": "”", "'": "'", "‘": "’", "’": "’", "«": "»", "`": "`"}
_LEADING_COMMAND = re.compile(r"^/[A-Za-z][A-Za-z0-9_]*(@\S+)?\s*")
_EVERY = re.compile(r"^(every\s+\d+\s*[A-Za-z]+)\s*(.*)$", re.I | re.S)
_AT = re.compile(r"^(at\s+\d{4}-\d{2}-\d{2}[ T]\d{1,2}:\d{2})\s*(.*)$", re.I | re.S)
_TO = re.compile(r"^(?:--|—|–)to(?:=|\s+)(\S+)\s*(.*)$", re.S)


def command_args(message: InboundMessage) -> str:
    """The text after the command (Telegram strips the command already; Slack keeps it)."""
    return _LEADING_COMMAND.sub("", message.text.strip(), count=1).strip()


def split_schedule_args(text: str) -> tuple[str, str, str | None, str]:
    """Splits ``/schedule`` arguments into ``(schedule, zone, target, prompt)``.

    The schedule is quoted (straight or typographic quotes, as phone keyboards send them), or
    written bare as 5 crontab fields, ``@daily``, ``every 2h`` or ``at YYYY-MM-DD HH:MM``. A
    ``--to TARGET`` (also ``—to``, as autocorrect turns ``--``) may follow the zone.

    Raises:
        JobError: with the usage when a part is missing.
    """
    text = text.strip()
    if not text:
        raise JobError(usage())
    if text[0] in _QUOTES:
        end = text.find(_QUOTES[text[0]], 1)
        if end < 0 and _QUOTES[text[0]] != text[0]:
            end = text.find(text[0], 1)
        if end < 0:
            raise JobError(_("the schedule's closing quote is missing") + "\n" + usage())
        schedule, rest = text[1:end].strip(), text[end + 1:].strip()
    elif match := (_EVERY.match(text) or _AT.match(text)):
        schedule, rest = match.group(1), match.group(2)
    elif text.startswith("@"):
        schedule, _sep, rest = text.partition(" ")
    else:
        parts = text.split(None, 5)
        if len(parts) < 6:
            raise JobError(usage())
        schedule, rest = " ".join(parts[:5]), parts[5]
    zone_name, _sep, rest = rest.strip().partition(" ")
    if not zone_name:
        raise JobError(_("the time zone is missing") + "\n" + usage())
    target = None
    if match := _TO.match(rest.strip()):
        target, rest = match.group(1), match.group(2)
    prompt = rest.strip()
    if not prompt:
        raise JobError(_("say what the report should contain") + "\n" + usage())
    return schedule, zone_name, target, prompt


class JobCommands:
    """Answers the job commands (``handle``) on a worker thread.

    Args:
        service: the running push service (fires ``/run``, reloads after changes); ``None`` when
            the scheduler is turned off, and the commands then say so.
    """

    def __init__(self, *, jobs: JobStore, planner: JobPlanner, service: PushService | None) -> None:
        self.jobs = jobs
        self.planner = planner
        self.service = service

    def handle(self, message: InboundMessage) -> str | None:
        """The reply to a job command, or ``None`` when ``message`` is not one."""
        if message.command not in JOB_COMMANDS:
            return None
        if self.service is None:
            return _("Scheduled reports are turned off on this gateway.")
        requester = Requester.of(message)
        args = command_args(message)
        try:
            if message.command == "schedule":
                return self._schedule(message, requester, args)
            if message.command == "jobs":
                return self._list(requester)
            job = self._owned_job(requester, args, message.command)
            if message.command == "unschedule":
                self.jobs.delete_job(job.id)
                self.service.job_changed()
                return _("Removed scheduled report `{id}`.", id=job.id)
            self.service.fire_soon(job.id, message.received_at, "manual")
            return _("Running `{id}` now; the report goes to {target}.", id=job.id, target=format_address(job.target))
        except JobError as exc:
            return f"⚠️ {exc}"

    def _schedule(self, message: InboundMessage, requester: Requester, args: str) -> str:
        schedule, zone_name, target, prompt = split_schedule_args(args)
        new = self.planner.plan(schedule=schedule, timezone=zone_name, prompt=prompt, target=target,
                                requester=requester,
                                source=f"{message.platform}:{message.address.tenant}:{message.message_id}")
        job, created = self.jobs.create_job(new)
        if created:
            log.info("job %s created by %s for %s", job.id, job.owner, job.target.platform)
            self.service.job_changed()  # type: ignore[union-attr]
        return _("Scheduled report `{id}`: `{schedule}` in {zone} to {target}.\nNext: {next}. "
                 "Run it now with /run {id}; remove it with /unschedule {id}.", id=job.id,
                 schedule=job_schedule(job).describe(), zone=job.timezone, target=format_address(job.target),
                 next=local_time(next_fire_of(job), job.timezone))

    def _list(self, requester: Requester) -> str:
        jobs = self.jobs.list_jobs(requester.key)
        if not jobs:
            return sentences(_("You have no scheduled reports."), usage().splitlines()[0])
        last = self.jobs.last_runs([job.id for job in jobs])
        return _("Your scheduled reports:") + "\n" + "\n".join(describe_job(job, last.get(job.id)) for job in jobs)

    def _owned_job(self, requester: Requester, args: str, command: str) -> Job:
        job_id = args.split()[0] if args.split() else ""
        if not job_id:
            raise JobError(_("Usage: /{command} ID (see /jobs)", command=command))
        job = self.jobs.get_job(job_id)
        if job is None or not self.planner.may_manage(requester, job):
            raise JobError(_("no scheduled report {id} of yours (see /jobs)", id=repr(job_id)))
        return job


def describe_job(job: Job, last: JobRun | None) -> str:
    """Two lines for ``/jobs``: id, schedule, zone, target, prompt; last run (``last``) and next fire."""
    last_text = f"{local_time(last.scheduled_at, job.timezone)} ({last.status})" if last else _("never")
    prompt = job.prompt if len(job.prompt) <= 80 else job.prompt[:77] + "..."
    state = "" if job.enabled else _(" [finished]")
    return (f"• `{job.id}` `{job_schedule(job).describe()}` {job.timezone} → {format_address(job.target)}{state}: "
            f"{prompt}\n  " + _("last: {last} · next: {next}", last=last_text,
                                 next=local_time(next_fire_of(job), job.timezone)))
