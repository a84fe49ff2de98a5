"""The agent's ``schedule_report`` tool: the model creates a job for the user it is talking to.

The same validation as ``/schedule`` (``JobPlanner``): the zone exists, the schedule parses and
fires, the target is one the user may post to. Who asks and from which chat comes from the turn
being answered (``gateway.core.types.CURRENT_MESSAGE``); outside a chat turn (e.g. in a push) the tool
refuses.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable

from agent.tools import Tool
from gateway.core.types import CURRENT_MESSAGE
from gateway.scheduler.planner import (
    TARGET_FORMS,
    JobError,
    JobPlanner,
    Requester,
    format_address,
    local_time,
    next_fire_of,
)
from gateway.scheduler.store import JobStore

NAME = "schedule_report"

PARAMETERS = {
    "type": "object",
    "properties": {
        "schedule": {"type": "string", "description": (
            "Crontab line 'minute hour day-of-month month day-of-week' (day of week: 0 or 7 = Sunday, "
            "1 = Monday), e.g. '0 9 * * 1-5' for weekdays at 09:00; or '@daily', 'every 2h', "
            "'at 2026-12-01 09:00' (once).")},
        "timezone": {"type": "string", "description": "IANA time zone the schedule is read in, e.g. 'Asia/Shanghai'."},
        "prompt": {"type": "string", "description": "What each report should contain (the instruction run each time)."},
        "target": {"type": "string", "description": f"Where to post: {TARGET_FORMS}. Default: here (this chat)."},
    },
    "required": ["schedule", "timezone", "prompt"],
    "additionalProperties": False,
}


def schedule_report_tool(jobs: JobStore, planner: JobPlanner, on_created: Callable[[], None]) -> Tool:
    """Builds the tool. ``on_created`` is called after a new job is stored (reloads the scheduler)."""

    def schedule_report(schedule: str, timezone: str, prompt: str, target: str | None = None) -> str:
        message = CURRENT_MESSAGE.get()
        if message is None:
            return "Error: schedule_report can only be used while answering a user in a chat."
        args = json.dumps([schedule, timezone, prompt, target], ensure_ascii=False)
        digest = hashlib.sha256(args.encode()).hexdigest()[:16]
        try:
            new = planner.plan(schedule=schedule, timezone=timezone, prompt=prompt, target=target,
                               requester=Requester.of(message),
                               source=f"tool:{message.platform}:{message.address.tenant}:{message.message_id}:{digest}")
        except JobError as exc:
            return f"Error: {exc}. Nothing was scheduled."
        job, created = jobs.create_job(new)
        if created:
            on_created()
        return (f"Scheduled report {job.id} created: '{schedule}' in {job.timezone}, posted to "
                f"{format_address(job.target)}; next run {local_time(next_fire_of(job), job.timezone)}. "
                f"The user can list jobs with /jobs and remove this one with /unschedule {job.id}.")

    return Tool(
        name=NAME,
        description=("Schedule a recurring (or one-off) report: at each fire the assistant answers `prompt` and the "
                     "answer is posted to the target chat. Use it only when the user asks for a scheduled or "
                     "repeated report; confirm the time zone if the user did not give one."),
        parameters=PARAMETERS,
        fn=schedule_report,
        side_effect="write",
        idempotent=True,  # keyed by the message and the arguments: a repeat finds the same job
    )
