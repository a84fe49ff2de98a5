"""Approvals in the chat (issue 9): which tool calls need a person's yes, and the waiting.

A turn's ``ChatApprover`` runs on the turn's worker thread: for a call the ``ApprovalPolicy``
flags, it stores a pending approval, queues a prompt to the chat ("/approve ID" or "/deny ID")
and polls the row until it is decided, the turn is stopped, or the timeout passes (denied).
The lane stays held meanwhile, but ``/approve`` and ``/deny`` are control commands: handled on
receipt by any instance (``decide_reply``), outside the lane, like ``/stop``.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agent.context import RunContext
from agent.errors import CallSuspended
from agent.tools import Tool
from gateway.core.i18n import N_, _
from gateway.core.types import ChatAddress, OutboundMessage
from gateway.tools.approvals_store import Approvals

PROMPT = N_("🔐 Approval needed: I want to run {tool}.\n{summary}\n"
          "Reply /approve {id} to allow it or /deny {id} to refuse (I wait {timeout}).")
"""``{id}`` is filled in by the store once the approval exists. Shown to people, so translated where
it is sent (``_(PROMPT)``, the turn's locale); the tool results below are for the model (English)."""
ADMIN_PROMPT = N_("🔐 Approval needed: I want to run {tool}.\n{summary}\n"
                "On this bot only an admin can allow that for you: an admin replies /approve {id} (or uses the "
                "admin pages); /deny {id} refuses (I wait {timeout}).")
"""The prompt for a requester who may not decide it (open access, not an approved user)."""
NO_ADMIN = ("Refused: {tool} needs an admin's approval on this bot (open access: the user is not an approved "
            "user) and no admin is configured, so it did not run and nobody was asked. Do not retry it; tell "
            "the user an operator can give them access.")


@dataclass(frozen=True)
class ApprovalPolicy:
    """Which calls need approval.

    Attributes:
        require_for: side effects (``write``, ``external`` ...) that need approval.
        dangerous_shell: ``run_shell`` commands matching one of these need approval even when
            its side effect is not in ``require_for``.
        timeout_s: how long a turn waits for a decision (then the call is denied).
        poll_s: how often the waiting turn reads the decision from the database.
        admin_reachable: an admin can decide requests (``access.admins`` is set, or the admin
            pages are on); without one, a request only an admin may decide is refused at once.
    """

    require_for: frozenset[str] = frozenset({"write", "external"})
    dangerous_shell: tuple[re.Pattern[str], ...] = ()
    timeout_s: float = 300.0
    poll_s: float = 0.25
    admin_reachable: bool = True

    def needs(self, tool: Tool, args: dict[str, Any]) -> bool:
        """``tool.needs_approval`` when set, else by side effect and dangerous shell patterns."""
        if tool.needs_approval is not None:
            return tool.needs_approval
        if tool.side_effect in self.require_for:
            return True
        command = str(args.get("command", "")) if tool.name == "run_shell" else ""
        return any(p.search(command) for p in self.dangerous_shell)


SUMMARY_MAX_CHARS = 2000
"""Longest argument summary a person is asked to approve (well inside one chat message: Telegram
Bot API sendMessage, 4096 UTF-16 units). A call whose arguments are longer is denied without
asking: nobody can approve what the prompt would have to cut (a command padded past the cut hid
its tail from the approver)."""

_WHITESPACE_RUN = re.compile(r"\s{4,}")


def summarize(tool: Tool, args: dict[str, Any], redact: Callable[[str], str]) -> str | None:
    """What the person approves: the arguments as JSON, redacted, each run of 4 or more blanks
    shown as ``⟨N blanks⟩`` (padding cannot push text out of view); ``None`` when that is longer
    than ``SUMMARY_MAX_CHARS`` (the call is then denied, never shown cut)."""
    text = redact(json.dumps(args, ensure_ascii=False, default=str))
    text = _WHITESPACE_RUN.sub(lambda m: f" ⟨{len(m.group())} blanks⟩ ", text)
    return text if len(text) <= SUMMARY_MAX_CHARS else None


@dataclass
class ChatApprover:
    """The ``RunContext.approver`` of one turn.

    Attributes:
        approvals: the approval rows.
        policy: which calls need approval.
        address: the chat the prompt goes to (``None``: no chat, e.g. a scheduled run: deny).
        session_key, turn_id, requested_by: stored with the approval.
        wake: tells delivery a reply was queued (thread-safe).
        redact: applied to the summary shown in the chat.
        trusted: whether the requester may decide their own requests (``gateway.inbound.access.
            may_run_guarded_tools``: in open access only admins and approved users); asked at the
            first call that needs approval. If not, the prompt says an admin must decide
            (``ADMIN_PROMPT``), ``decide_reply`` refuses the requester's ``/approve``, and without
            a reachable admin the call is refused at once (``NO_ADMIN``).
    """

    approvals: Approvals
    policy: ApprovalPolicy
    address: ChatAddress | None
    session_key: str
    turn_id: str
    requested_by: str | None
    wake: Callable[[], None] = lambda: None
    redact: Callable[[str], str] = field(default=lambda text: text)
    reply_to_id: str | None = None
    trusted: Callable[[], bool] = lambda: True
    suspend: Callable[[], bool] = lambda: False
    _trust: bool | None = field(default=None, init=False, repr=False)

    def __call__(self, ctx: RunContext, tool: Tool, args: dict[str, Any]) -> str | None:
        if not self.policy.needs(tool, args):
            return None
        if self.address is None:
            return f"Denied: {tool.name} needs a person's approval and nobody can be asked in this run."
        trusted = self._trusted()
        if not trusted and not self.policy.admin_reachable:
            return NO_ADMIN.replace("{tool}", tool.name)
        timeout = self.policy.timeout_s
        summary = summarize(tool, args, self.redact)
        if summary is None:
            return (f"Denied: the arguments of {tool.name} are longer than {SUMMARY_MAX_CHARS} characters, too long "
                    "for a person to check in an approval request, so it did not run. Make the call shorter "
                    "(e.g. write a script file first and run that).")
        prompt = (_(PROMPT if trusted else ADMIN_PROMPT).replace("{tool}", tool.name)
                  .replace("{timeout}", f"{timeout:g} s")
                  .replace("{summary}", summary.replace("{id}", "{ id}")))
        earlier = self.approvals.of_call(self.session_key, self.turn_id, ctx.call_id) if ctx.resumed else None
        if earlier is not None:  # asked before the restart: the same request (and button) still counts
            approval_id, deadline = earlier.id, time.monotonic() + max(0.0, earlier.expires_at - time.time())
        else:
            approval_id = self.approvals.request(
                session_key=self.session_key, turn_id=self.turn_id, call_id=ctx.call_id,
                requested_by=self.requested_by, tool=tool.name, summary=prompt, timeout_s=timeout,
                prompt=OutboundMessage(self.address, "", idempotency_key="", reply_to_id=self.reply_to_id),
                prompt_text=prompt)
            self.wake()
            deadline = time.monotonic() + timeout
        while True:
            status = self.approvals.status(approval_id)
            if status == "approved":
                return None
            if status == "denied":
                return f"Denied: the user refused to let you run {tool.name}. Do not retry it; ask what they want."
            if status in ("expired", "cancelled") and earlier is not None:  # closed while the turn was stopped
                return _expired(tool.name, timeout) if status == "expired" else _cancelled(tool.name)
            if status != "cancelled" and ctx.should_stop is not None and ctx.should_stop() \
                    and ctx.depth == 0 and self.suspend():
                raise CallSuspended(approval_id)  # a restart: the request stays open for the resumed turn
            if status == "cancelled" or (ctx.should_stop is not None and ctx.should_stop()):
                self.approvals.decide(approval_id, "cancelled", None)
                return _cancelled(tool.name)
            if time.monotonic() >= deadline:
                if self.approvals.decide(approval_id, "expired", None):
                    return _expired(tool.name, timeout)
                continue  # decided at the last moment: read the decision
            time.sleep(self.policy.poll_s)

    def awaiting(self, call_id: str) -> bool:
        """``RunContext.awaiting``: whether this turn's call ``call_id`` made a request that was not
        approved (pending, denied, expired or cancelled: the call never ran, so the resumed turn
        asks about it again and the approver answers from that request)."""
        earlier = self.approvals.of_call(self.session_key, self.turn_id, call_id)
        # Not "approved": an approved call may have run before the process died (run it once only).
        return earlier is not None and earlier.status != "approved"

    def _trusted(self) -> bool:
        if self._trust is None:  # parallel tool calls may ask twice: the answer is the same
            self._trust = bool(self.trusted())
        return self._trust


def _expired(tool: str, timeout: float) -> str:
    return (f"Denied: nobody approved {tool} within {timeout:g} s, so it did not run. "
            "Do not retry it unless the user asks.")


def _cancelled(tool: str) -> str:
    return f"Cancelled: the turn was stopped before {tool} was approved."


def decide_reply(approvals: Approvals, command: str, args: str, user_id: str, is_admin: bool,
                 trusted: bool = True) -> str:
    """Handles ``/approve ID`` and ``/deny ID`` (any instance, outside the lane); returns the answer.

    The requester or an admin may decide; a requester who is not ``trusted`` (open access, not an
    approved user: ``gateway.inbound.access.may_run_guarded_tools``) may deny their request but not approve it.
    """
    approval_id = args.split()[0].lower() if args.split() else ""
    if not approval_id:
        return _("Usage: /{command} ID (the ID is in the approval request).", command=command)
    approval = approvals.get(approval_id)
    if approval is None:
        return _("No approval request has the ID {id}.", id=approval_id)
    if approval.requested_by not in (None, user_id) and not is_admin:
        return _("Only the person who asked (or an admin) can decide this request.")
    if command == "approve" and not is_admin and not trusted:
        return _("Only an admin can approve this request (on this bot you are not an approved user).")
    status = "approved" if command == "approve" else "denied"
    if not approvals.decide(approval.id, status, user_id):
        return _("Request {id} is already closed ({status}).", id=approval.id, status=approvals.status(approval.id))
    if status == "approved":
        return _("Approved: running {tool}.", tool=approval.tool)
    return _("Denied: {tool} will not run.", tool=approval.tool)
