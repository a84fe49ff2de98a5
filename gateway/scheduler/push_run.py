"""One push (DESIGN §8): a claimed fire of a job, run on a worker thread.

The agent answers the job's prompt in the run's own session (fresh per run, tied to the job by
its key ``job:<id>``; a run taken over after a crash resumes that session's transcript), with the
turn runner's model, limits and system prompt. The answer is queued in the outbox for the job's
target in the same transaction that moves the run to ``delivering``, with the files the run sent
with ``send_file`` from its own workspace (the run session's folder). No session lane is held: a
push into a chat whose session is busy is delivered anyway (the outbox keeps only per-chat order).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from agent.context import RunContext
from agent.loop import run_turn
from agent.model import ModelError, Usage
from agent.tools import ToolRegistry
from gateway.bus.context import render_history
from gateway.bus.turns import TurnRunner
from gateway.core.types import OutboundMessage
from gateway.delivery.files import REPLY_TARGET, transcript_refs
from gateway.delivery.progress import resumed_state
from gateway.scheduler.planner import job_schedule, local_time
from gateway.scheduler.store import Job, JobStore, RunClaim
from gateway.store.sql import StoredMessage, UsageEntry

log = logging.getLogger("gateway.scheduler.push_run")

PUSH_NOTE = (
    "\n\nThis conversation is a scheduled report: nobody is waiting for a reply in real time. "
    "Your final answer is posted as the report into the target chat, so answer with the report itself. "
    "If the Skills list has a procedure for reports (daily-report), load it first and follow it."
)
"""Appended to the configured system prompt for push sessions (stored per session, once)."""


class PushRunner:
    """Runs claimed pushes to the point where the answer is in the outbox.

    Args:
        turns: the chat turn runner whose model, bridge, limits, window and system prompt pushes reuse.
        toolsets: tool registries by job ``toolset`` name (chat-only tools are left out).
    """

    def __init__(self, *, turns: TurnRunner, jobs: JobStore, toolsets: Mapping[str, ToolRegistry]) -> None:
        self.turns = turns
        self.jobs = jobs
        self.toolsets = dict(toolsets)

    def run(self, claim: RunClaim, lost: Callable[[], bool]) -> str:
        """Runs the push held by ``claim``; returns the run's status after this step:
        ``delivering`` | ``failed`` | ``skipped`` | ``lost`` (the claim passed to another instance;
        nothing was written). ``lost()`` is checked at every agent step.

        Raises only on database faults (the claim then expires and another instance takes over).
        """
        job = self.jobs.get_job(claim.job_id)
        if job is None or (not job.enabled and claim.trigger == "schedule"):
            done = self.jobs.finish_run(claim, status="skipped", error="the job was removed or disabled")
            return "skipped" if done else "lost"
        once = job.schedule_kind == "once" and claim.trigger == "schedule"  # retired after its fire
        tools = self.toolsets.get(job.toolset)
        if tools is None:
            return self._fail(claim, f"unknown toolset {job.toolset!r}", once)
        session_id = self.jobs.run_session(claim, self.turns.prompt() + PUSH_NOTE)
        if session_id is None:
            return "lost"
        turn_id = f"run{claim.run_id}"
        window = self.turns.store.load_window(session_id, self.turns.history_window)
        if not any(m.turn_id == turn_id and m.role == "user" for m in window):
            content, meta = self._request(job, claim), {"time": time.time()}
            row_id = self.turns.store.append_message(session_id, turn_id, "user", content, meta=meta)
            window.append(StoredMessage(row_id, turn_id, "user", content, None, None, None, meta))

        final: list[int] = []  # the row id of the latest answer without tool calls

        chat_key = f"{job.target.platform}:{job.target.tenant}:{job.target.chat_id}"

        children: list[UsageEntry] = []  # sub-agents' model calls, stored with the next message
        children_lock = threading.Lock()

        def child_usage(usage: Usage, meta: dict[str, Any]) -> None:
            entry = self.turns.usage_entry(usage, meta, user_id=None, chat_key=chat_key, session_key=f"job:{job.id}",
                                           platform=job.target.platform)
            with children_lock:
                children.append(entry)

        def record(msg: dict[str, Any], usage: Usage | None, meta: dict[str, Any] | None) -> None:
            entries = [] if usage is None else [self.turns.usage_entry(  # counted, under no user
                usage, meta, user_id=None, chat_key=chat_key, session_key=f"job:{job.id}",
                platform=job.target.platform)]
            with children_lock:
                entries += children
                children.clear()
            row_id = self.turns.store.append_message(
                session_id, turn_id, msg["role"], msg.get("content"), usage=entries,
                tool_calls=msg.get("tool_calls"), tool_call_id=msg.get("tool_call_id"), meta=meta,
                prompt_tokens=usage.prompt_tokens if usage else None,
                completion_tokens=usage.completion_tokens if usage else None,
            )
            if msg["role"] == "assistant" and not msg.get("tool_calls"):
                final[:] = [row_id]

        model = self.turns.agents.get(self.turns.spec).model
        target = REPLY_TARGET.set(job.target)  # send_file posts into the report's chat
        try:
            outcome = run_turn(system_prompt=self.jobs.session_prompt(session_id), history=render_history(window),
                               model=model, tools=tools, bridge=self.turns.bridge,
                               limits=self.turns.limits, record=record, should_stop=lost,
                               context=RunContext(session_id=session_id, turn_id=turn_id,
                                                  approver=self._deny_unattended, redact=self.turns.redact,
                                                  state=resumed_state(window, turn_id), on_child_usage=child_usage))
        except ModelError as exc:
            log.warning("push run %s of job %s failed: %s", claim.run_id, job.id, exc)
            return self._fail(claim, exc.user_message, once)
        finally:
            REPLY_TARGET.reset(target)
        if outcome.stop_reason == "cancelled":
            log.warning("push run %s of job %s: claim lost; another instance runs it", claim.run_id, job.id)
            return "lost"
        files = self.turns.files.for_turn(session_id, turn_id) if self.turns.files is not None else []
        text = outcome.reply.strip() or ("" if files else "(no answer)")
        if files and final:  # the report's answer names the files it carries (admin transcript)
            self.turns.store.add_meta(final[0], {"attachments": transcript_refs(files)})
        reply = OutboundMessage(job.target, text, idempotency_key=f"push:{claim.run_id}", attachments=tuple(files))
        if not self.jobs.finish_run(claim, reply=reply, disable_job=once):
            return "lost"
        log.info("push run %s of job %s: answer queued for %s", claim.run_id, job.id, job.target.platform)
        return "delivering"

    def _deny_unattended(self, ctx: RunContext, tool: Any, args: dict[str, Any]) -> str | None:
        """Scheduled runs deny by default: nobody is there to approve a call that needs approval."""
        if self.turns.policy.needs(tool, args) or getattr(tool, "needs_approval", False):
            return (f"Denied: {tool.name} needs a person's approval, and a scheduled report runs "
                    "unattended. Report what you would have done instead.")
        return None

    def _fail(self, claim: RunClaim, error: str, once: bool) -> str:
        done = self.jobs.finish_run(claim, status="failed", error=error, disable_job=once)
        return "failed" if done else "lost"

    @staticmethod
    def _request(job: Job, claim: RunClaim) -> str:
        due = datetime.fromtimestamp(claim.scheduled_at, UTC)
        kind = "run now on request" if claim.trigger == "manual" else f"due {local_time(due, job.timezone)}"
        return (f"[Scheduled report {job.id}, {job_schedule(job).describe()} in {job.timezone}; {kind}]\n"
                f"{job.prompt}")
