"""Fitting a turn's context into the model's window, summarising older turns (DESIGN §5).

The request a turn sends is a projection: stored system prompt + tool schemas (stable order) +
the session's stored summary of older turns + the recent turns loaded after that summary's cut +
the new message. ``Compressor.project`` builds it before the turn's first model call, on the
turn's worker thread:

1. Estimate the request (``agent.tokens``) from the window rendered once, as it would be sent: the
   images it leaves out (``media.history_images``) count as the lines describing them. Under
   ``threshold`` of the window, and with the loaded rows well inside the row limit, that rendering
   is sent as it is.
2. Otherwise the turns are split at turn boundaries (a user message starts a turn; an assistant
   ``tool_calls`` message and its results are always in the same turn): the newest turns that fit
   ``keep_ratio`` of the window stay verbatim (the current turn always does), the older ones are
   summarised by one call to the same model (``SUMMARY_PROMPT``: keep facts, decisions, names,
   numbers), folding in the previous summary. The summary is stored (``summaries``) with the id of
   the last message it covers, so later turns load it plus only the messages after the cut.
3. If the summary call fails the turn goes on with the plain window: the oldest turns are left
   out until the request is under ``threshold`` (the previous summary, if any, is still sent,
   and nothing is stored, so a later try can still summarise them); the session's next try waits
   ``retry_after_s``.
4. Should the kept turns plus the summary still exceed ``threshold`` (huge tool results), the
   oldest kept turns are dropped too; the current turn is always sent whole. Between
   ``threshold`` and ``1 - reserve_ratio`` there is room for the turn's own tool steps.

The summary goes in as a user message right after the system prompt, marked ``SUMMARY_HEADER``;
the system prompt bytes never change. Every projection ends in ``render_history``, whose
``agent.sequence.repair`` guarantees a valid tool-call sequence.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agent.model import ChatModel, ModelError, ModelReply, OnText
from agent.tokens import message_tokens, request_tokens, text_tokens
from gateway.bus.context import render_history, render_user
from gateway.core.window import WindowPolicy
from gateway.media.render import ImagePolicy
from gateway.store.sql import Store, StoredMessage, Summary, UsageEntry

log = logging.getLogger("gateway.bus.compression")

SUMMARY_HEADER = "Summary of the earlier conversation (older turns, condensed; the messages after this are verbatim):"

SUMMARY_PROMPT = (
    "You condense chat transcripts so a model can continue the conversation without them. "
    "Write one summary covering the previous summary (if any) and the new transcript part. "
    "Keep every fact, decision, name, number, date, identifier, preference, promise and open task, "
    "and who said what when it matters; drop greetings and small talk. Plain text, no preamble, "
    "at most {words} words."
)

TRANSCRIPT_CONTENT_CHARS = 2000
"""Characters of one message shown to the summariser (head kept, the rest noted)."""


@dataclass(frozen=True)
class Projection:
    """What a turn sends after the system prompt: ``history`` (wire messages, oldest first),
    its estimated request tokens (system prompt and tools included), the summary sent
    (``None``: none) and whether this turn wrote a new summary."""

    history: list[dict[str, Any]]
    tokens: int
    summary: str | None
    compressed: bool


def split_turns(window: Sequence[StoredMessage]) -> list[list[StoredMessage]]:
    """Rows grouped into turns, oldest first: each group starts at a user message and runs to
    the next one. Rows before the first user message (a window cut mid-turn) are left out, so a
    cut never separates tool calls from their results."""
    turns: list[list[StoredMessage]] = []
    for row in window:
        if row.role == "user":
            turns.append([row])
        elif turns:
            turns[-1].append(row)
    return turns


def turn_parts(rendered: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """A rendered window (``render_history`` of whole turns) cut into its turns' parts: each
    starts at a user message and runs to the next one (rendering keeps every user message, in
    order, and adds an interrupted tool call's result inside its own turn)."""
    parts: list[list[dict[str, Any]]] = []
    for message in rendered:
        if message.get("role") == "user" or not parts:
            parts.append([message])
        else:
            parts[-1].append(message)
    return parts


def protected_from(turns: list[list[StoredMessage]]) -> int:
    """Index of the first turn that must stay verbatim: the newest turn, and any turn holding a
    message not yet written (id 0: a merged batch's user messages)."""
    unwritten = [i for i, turn in enumerate(turns) if any(row.id == 0 for row in turn)]
    return min([len(turns) - 1, *unwritten]) if turns else 0


class Compressor:
    """Builds each turn's projection and stores the summaries it makes.

    Args:
        store: where summaries are kept.
        policy: the window and its thresholds.
        row_limit: transcript rows a turn loads (``agent.history_window``); compression also
            starts when the loaded rows reach ``threshold`` of it, so no row falls out of the
            loaded window before it is summarised.
        retry_after_s: after a failed summary call, the session's next try waits this long (in
            this process), so a failing or slow endpoint does not cost every turn an extra call.
        images: which images go along as content parts (``gateway.media.render.ImagePolicy``);
            ``None``: files are described in words only.
    """

    def __init__(self, store: Store, policy: WindowPolicy, row_limit: int, retry_after_s: float = 300.0,
                 images: ImagePolicy | None = None) -> None:
        self.images = images
        self.store = store
        self.policy = policy
        self.row_limit = row_limit
        self.retry_after_s = retry_after_s
        self._failed: dict[str, float] = {}  # session id -> monotonic time of its last failed summary
        self._lock = threading.Lock()
        # The fixed part's estimate (system prompt + tool schemas) for the last few pairs: every turn
        # of a process sends the same tools list (rendered once) and a handful of prompts, and
        # serialising the schemas to count them cost more than the rest of the projection.
        self._fixed: dict[tuple[str, int], tuple[list[dict[str, Any]], int]] = {}

    def _fixed_tokens(self, system_prompt: str, tools: list[dict[str, Any]]) -> int:
        """Estimated tokens of the system message and the tool schemas (cached per prompt text and
        tools list object: ``ToolRegistry.schemas`` renders its list once; the list is kept
        referenced, so its id is not reused)."""
        key = (system_prompt, id(tools))
        with self._lock:
            hit = self._fixed.get(key)
        if hit is not None and hit[0] is tools:
            return hit[1]
        tokens = message_tokens({"role": "system", "content": system_prompt}) + request_tokens([], tools)
        with self._lock:
            if len(self._fixed) >= 64:
                self._fixed.clear()
            self._fixed[key] = (tools, tokens)
        return tokens

    def project(self, *, session_id: str, system_prompt: str, tools: list[dict[str, Any]],
                summary: Summary | None, window: list[StoredMessage], model: ChatModel,
                window_tokens: int | None = None, images: ImagePolicy | None = None,
                usage_of: Callable[[ModelReply], UsageEntry] | None = None) -> Projection:
        """The history to send for this turn, fitted into the window (see the module doc).

        ``window``: the rows after ``summary``'s cut, oldest first, ending with the new user
        message(s); ``images``: this turn's image policy (default: the one given at construction).
        ``window_tokens`` forces a compression for that window (a model refused the request as too
        long: ``FitOnOverflow``), whatever the estimate says and even within the wait after a
        failed summary. ``usage_of`` gives the ``usage`` row of a summary call (stored with the
        summary). Never raises for a failed summary call (the plain window is sent instead);
        raises only on database faults.
        """
        images = images if images is not None else self.images
        forced = window_tokens is not None
        policy = self.policy if window_tokens is None else \
            dataclasses.replace(self.policy, context_window_tokens=window_tokens)
        fixed = self._fixed_tokens(system_prompt, tools)
        summary_text = summary.text if summary is not None else None
        turns = split_turns(window)
        # The window is rendered once, as it would be sent whole, and each turn costs what its part
        # of that rendering costs: the images the request leaves out (``history_images``) count
        # as the line describing them, an older turn's interrupted tool call its added result.
        rendered = render_history([row for turn in turns for row in turn], images)
        costs = [request_tokens(part) for part in turn_parts(rendered)]

        def total(text: str | None, first: int) -> int:
            return fixed + (message_tokens(summary_message(text)) if text else 0) + sum(costs[first:])

        first = 0
        rows = sum(len(t) for t in turns)
        if not forced and total(summary_text, 0) < policy.compress_at and rows < self.row_limit * policy.threshold:
            return self._projection(summary_text, turns, 0, total(summary_text, 0), False, images, rendered)

        keep = self._keep_from(turns, costs, fixed, policy)
        compressed = False
        if keep > 0 and (forced or self._may_try(session_id)):
            older = [row for turn in turns[:keep] for row in turn if row.id]
            try:
                summary_text, reply = self._summarise(model, summary_text, older, policy)
                self.store.save_summary(session_id, older[-1].id, summary_text, reply.usage.prompt_tokens,
                                        reply.usage.completion_tokens,
                                        usage=(usage_of(reply),) if usage_of is not None else ())
                compressed = True
                log.info("session %s: summarised %d messages up to id %d", session_id, len(older), older[-1].id)
            except Exception as exc:  # any failure: the turn goes on with the plain window
                with self._lock:
                    self._failed[session_id] = time.monotonic()
                log.warning("session %s: summary failed, sending the plain window: %s", session_id, exc)
        if compressed:
            first = keep
        protected = protected_from(turns)
        while first < protected and total(summary_text, first) > policy.compress_at:
            first += 1  # drop the oldest turn (already summarised, or lost to a failed summary)
        return self._projection(summary_text, turns, first, total(summary_text, first), compressed, images)

    def _may_try(self, session_id: str) -> bool:
        with self._lock:
            failed = self._failed.get(session_id)
            if failed is not None and time.monotonic() - failed < self.retry_after_s:
                return False
            self._failed.pop(session_id, None)
            return True

    def _keep_from(self, turns: list[list[StoredMessage]], costs: list[int], fixed: int, policy: WindowPolicy) -> int:
        """Index of the oldest turn kept verbatim after compressing: newest turns within
        ``keep_ratio`` of the window less the ``fixed`` cost (system prompt and tool schemas, sent
        with every request) and half the row limit; the protected turns always. Counting ``fixed``
        keeps the designed headroom (``threshold - keep_ratio - summary_ratio``) before the next
        compression: without it a small window would compress again on the very next turn."""
        budget = int(policy.context_window_tokens * policy.keep_ratio) - fixed
        first = protected_from(turns)
        used = sum(costs[first:])
        rows = sum(len(t) for t in turns[first:])
        while first > 0 and used + costs[first - 1] <= budget and rows + len(turns[first - 1]) <= self.row_limit // 2:
            first -= 1
            used += costs[first]
            rows += len(turns[first])
        return first

    def _summarise(self, model: ChatModel, previous: str | None, rows: list[StoredMessage],
                   policy: WindowPolicy) -> tuple[str, ModelReply]:
        """One model call condensing ``previous`` + ``rows``: the text (capped to the policy) and
        the call's reply (its usage, provider and model). Raises whatever the model client
        raises, or ``ValueError`` on an empty answer."""
        words = max(50, policy.summary_tokens * 3 // 4)
        budget = int(policy.context_window_tokens * (policy.threshold - policy.summary_ratio))
        budget -= text_tokens(previous or "") + text_tokens(SUMMARY_PROMPT) + 64
        lines = transcript_lines(rows)
        kept: list[str] = []
        for line in reversed(lines):  # newest first: the oldest lines give way when it is too long
            budget -= text_tokens(line) + 1
            if budget < 0:
                kept.append("[earlier lines omitted]")
                break
            kept.append(line)
        parts = [f"Previous summary:\n{previous}\n"] if previous else []
        parts.append("Transcript part to add:\n" + "\n".join(reversed(kept)))
        reply = model.complete([{"role": "system", "content": SUMMARY_PROMPT.format(words=words)},
                                {"role": "user", "content": "\n".join(parts)}], [])
        text = (reply.content or "").strip()
        if not text:
            raise ValueError("the model returned an empty summary")
        cap = policy.summary_tokens * 4
        if len(text.encode()) > cap:
            text = text.encode()[:cap].decode(errors="ignore") + " [cut]"
        return text, reply

    @staticmethod
    def _projection(summary: str | None, turns: list[list[StoredMessage]], first: int, tokens: int,
                    compressed: bool, images: ImagePolicy | None = None,
                    rendered: list[dict[str, Any]] | None = None) -> Projection:
        """``rendered``: the whole window's rendering, reused when it is all sent (``first == 0``)."""
        if first == 0 and rendered is not None:
            history = list(rendered)
        else:
            history = render_history([row for turn in turns[first:] for row in turn], images)
        if summary:
            history.insert(0, summary_message(summary))
        return Projection(history, tokens, summary, compressed)


def summary_message(text: str | None) -> dict[str, Any]:
    """The wire message carrying a summary (a user message right after the system prompt)."""
    return {"role": "user", "content": f"{SUMMARY_HEADER}\n{text}"}


def transcript_lines(rows: Sequence[StoredMessage]) -> list[str]:
    """Rows as plain lines for the summariser (``User: ...``, ``Assistant: ...``, tool calls and
    results), each message's text capped at ``TRANSCRIPT_CONTENT_CHARS``."""
    def cap(text: str) -> str:
        if len(text) <= TRANSCRIPT_CONTENT_CHARS:
            return text
        return f"{text[:TRANSCRIPT_CONTENT_CHARS]} [... {len(text) - TRANSCRIPT_CONTENT_CHARS} more characters]"

    lines = []
    for row in rows:
        if row.role == "user":
            meta = {k: v for k, v in (row.meta or {}).items() if k != "memory"}  # memory is not the conversation
            lines.append("User: " + cap(render_user(row.content, meta)))
        elif row.role == "assistant":
            if row.content:
                lines.append("Assistant: " + cap(row.content))
            for call in row.tool_calls or ():
                fn = call.get("function", {})
                lines.append(f"Assistant called {fn.get('name')}({cap(str(fn.get('arguments', '')))})")
        elif row.role == "tool":
            lines.append("Tool result: " + cap(row.content or ""))
    return lines


OVERFLOW_SHARE = 0.8
"""A context refusal that names no window: the refusing model's window is taken as the smaller of
its configured one and this share of the refused request's estimate."""


class FitOnOverflow:
    """A turn's model that compresses and retries once when a model refuses a request as longer than
    its context window (``ModelError.reason == "context_length"``: no failover, the request is at fault).

    The window to fit is the one the refusal names (``limit_tokens``: "maximum context length is
    8192 tokens"), else the smaller of the refusing model's configured window and
    ``OVERFLOW_SHARE`` of the request's estimate. ``refit(window_tokens)`` projects the turn again
    for it (``Compressor.project(window_tokens=...)``: older turns summarised, the summary stored so
    later turns start from it); the history part of ``messages`` is replaced in place (the loop's
    own list, so the turn's later steps send the shorter request too) and the turn's own new
    messages after it are kept. The call is then sent once more, through the route. A refit that
    shrinks nothing, or a second refusal, raises the refusal with a plain explanation. A
    sub-agent's request (the same model object, another message list) is not refitted.

    Args:
        inner: the turn's model (a route).
        history: the history the loop was started with (the projection's ``history``).
        tokens: that projection's estimated request tokens.
        refit: the projection for a window of that many tokens.
    """

    def __init__(self, inner: ChatModel, history: list[dict[str, Any]], tokens: int,
                 refit: Callable[[int], Projection]) -> None:
        self.inner = inner
        self.model = inner.model
        self._history = history
        self._tokens = tokens
        self._refit = refit

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                 on_text: OnText | None = None) -> ModelReply:
        """``inner.complete``, refitted and sent once more after a context-length refusal.

        Raises:
            ModelError: as ``inner``; a refusal that refitting could not cure has a ``user_message``
                saying the conversation is too long for the model (and to start a new one).
        """
        try:
            return self.inner.complete(messages, tools, on_text)
        except ModelError as exc:
            held = {id(m) for m in self._history}
            if exc.reason != "context_length" or not any(id(m) in held for m in messages):
                raise  # not a refusal as too long, or not the turn's own request (a sub-agent's)
            refused = exc
        estimate = request_tokens(messages, tools)
        window = refused.limit_tokens or min(filter(None, [refused.window_tokens, int(estimate * OVERFLOW_SHARE)]))
        projection = self._refit(window)
        if projection.tokens >= self._tokens:
            raise _too_long(refused) from refused
        last = max(i for i, m in enumerate(messages) if id(m) in held)
        messages[:] = [messages[0], *projection.history, *messages[last + 1:]]
        log.info("%s:%s refused %d estimated tokens as too long; refitted to %d for a window of %d and retrying once",
                 refused.provider, refused.model, estimate, request_tokens(messages, tools), window)
        self._history, self._tokens = projection.history, projection.tokens
        try:
            return self.inner.complete(messages, tools, on_text)
        except ModelError as exc:
            if exc.reason == "context_length":
                raise _too_long(exc) from exc
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _too_long(exc: ModelError) -> ModelError:
    exc.user_message = ("This conversation is too long for the model, even with older turns summarised. "
                        "Start a new one with /new, or send a shorter message.")
    return exc
