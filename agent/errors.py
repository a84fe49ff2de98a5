"""Errors of the agent package. Tool errors are data for the model; only infrastructure escapes."""

from __future__ import annotations


class ToolRetry(Exception):
    """Raised by a tool for a transient failure worth trying again (rate limit, flaky upstream).

    The executor retries the call up to the tool's ``retries`` (default ``Limits.tool_retries``)
    with a short backoff; after the last attempt the message goes to the model as the tool result.
    Any other exception is answered to the model at once, without a retry.
    """


class CallSuspended(Exception):
    """Raised by an approver when the turn stops for a restart while the call waits for a
    person's decision. The call did not run and gets no result now (``ToolOutcome.suspended``);
    the turn ends as stopped, and when it is resumed the call is asked again
    (``RunContext.awaiting``, ``RunContext.resumed``), finding the same request still open.
    """
