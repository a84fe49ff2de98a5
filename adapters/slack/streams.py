"""Slack's native streaming of a reply (Slack Web API, AI apps): ``chat.startStream`` (``channel``,
``thread_ts``, ``markdown_text``, and in channels ``recipient_user_id`` + ``recipient_team_id``),
``chat.appendStream`` (``channel``, ``ts``, ``markdown_text``: appended to what is shown),
``chat.stopStream`` (``channel``, ``ts``, optional last ``markdown_text``). ``markdown_text`` is
standard Markdown (Slack renders it), at most 12,000 characters per call; streamed messages are
replies in a thread.

The gateway streams a reply as a preview that is edited with the whole text so far, then
delivered as an edit of the preview (``gateway.delivery.streaming``). ``NativeStreams`` maps that
onto the stream methods: the preview starts a stream, an edit that extends the text appends the
difference, the final edit stops the stream with the rest. What cannot be streamed (an edit that
is no extension, a stream this process did not start, a workspace without the methods) falls back
to ``chat.update``, as on platforms without native streaming.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import aiohttp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from gateway.core.types import ChatAddress

log = logging.getLogger("adapters.slack")

PREVIEW_MARK = " …"
"""The gateway's "still being written" mark at the end of a preview
(``gateway.delivery.streaming.PREVIEW_SUFFIX``): Slack shows its own while a stream is open."""
MARKDOWN_LIMIT = 12_000  # chat.startStream / appendStream / stopStream: markdown_text per call
UNAVAILABLE = frozenset({"unknown_method", "not_allowed_token_type", "missing_scope", "method_deprecated",
                         "feature_not_enabled", "not_allowed"})
"""Errors meaning this workspace or token has no streaming: stop trying for this process."""
_MAX_STREAMS = 1000


@dataclass
class _Stream:
    address: ChatAddress
    streamed: str  # the Markdown shown so far


def without_mark(text: str) -> str:
    """A preview's text without the gateway's preview mark."""
    return text[: -len(PREVIEW_MARK)] if text.endswith(PREVIEW_MARK) else text


class NativeStreams:
    """Live streams of this process, by the streamed message's ``ts``.

    Args:
        client: the bot's Web API client.
        enabled: use the stream methods at all (``slack.native_streaming``); switched off for the
            process by the first ``UNAVAILABLE`` answer.
    """

    def __init__(self, client: AsyncWebClient, enabled: bool = True) -> None:
        self.client = client
        self.enabled = enabled
        self._live: OrderedDict[str, _Stream] = OrderedDict()

    def wanted(self, address: ChatAddress, text: str, recipient: str | None) -> bool:
        """Whether a preview (``text`` ending in the preview mark) to ``address`` can stream: in a
        thread, and in a channel only with the user it answers (``recipient``)."""
        return (self.enabled and bool(address.thread_id) and text.endswith(PREVIEW_MARK)
                and (address.chat_id.startswith("D") or recipient is not None))

    def live(self, ts: str) -> bool:
        return ts in self._live

    async def start(self, address: ChatAddress, text: str, recipient: str | None) -> str | None:
        """``chat.startStream`` in ``address``'s thread with ``text`` (preview mark removed); the
        message's ``ts``, or ``None`` when Slack refused (the caller posts a plain preview).

        Raises:
            aiohttp.ClientError, TimeoutError, OSError: the network failed.
        """
        body = without_mark(text)[:MARKDOWN_LIMIT]
        kwargs: dict[str, Any] = {"channel": address.chat_id, "thread_ts": address.thread_id, "markdown_text": body}
        if recipient is not None:
            kwargs.update(recipient_user_id=recipient, recipient_team_id=address.tenant)
        try:
            response = await self.client.chat_startStream(**kwargs)
        except SlackApiError as exc:
            self._refused("chat.startStream", exc)
            return None
        ts = str(response.get("ts") or "")
        if not ts:
            return None
        self._live[ts] = _Stream(address, body)
        while len(self._live) > _MAX_STREAMS:
            self._live.popitem(last=False)
        return ts

    async def append(self, ts: str, text: str) -> bool:
        """Shows ``text`` (the whole text so far) in the live stream ``ts`` by appending what is new
        (``chat.appendStream``). ``False`` when it cannot (not live here, not an extension of what
        is shown, Slack refused): the stream is then stopped and the caller edits with
        ``chat.update``.

        Raises:
            aiohttp.ClientError, TimeoutError, OSError: the network failed (the stream stays live).
        """
        stream = self._live.get(ts)
        if stream is None:
            return False
        body = without_mark(text)
        if not body.startswith(stream.streamed):
            await self.stop(ts, stream.address)
            return False
        new = body[len(stream.streamed):]
        try:
            for start in range(0, len(new), MARKDOWN_LIMIT):
                await self.client.chat_appendStream(channel=stream.address.chat_id, ts=ts,
                                                    markdown_text=new[start:start + MARKDOWN_LIMIT])
                stream.streamed += new[start:start + MARKDOWN_LIMIT]
        except SlackApiError as exc:
            self._refused("chat.appendStream", exc)
            await self.stop(ts, stream.address)
            return False
        return True

    async def finish(self, ts: str, text: str) -> bool:
        """Ends the live stream ``ts`` as ``text`` (the final Markdown): ``chat.stopStream`` with the
        part not shown yet. ``False`` when it cannot (not live here, not an extension, longer than
        one call takes, Slack refused): the stream is stopped and the caller uses ``chat.update``.

        Raises:
            aiohttp.ClientError, TimeoutError, OSError: the network failed.
        """
        stream = self._live.get(ts)
        if stream is None:
            return False
        rest = text[len(stream.streamed):] if text.startswith(stream.streamed) else None
        if rest is None or len(rest) > MARKDOWN_LIMIT:
            await self.stop(ts, stream.address)
            return False
        kwargs: dict[str, Any] = {"channel": stream.address.chat_id, "ts": ts}
        if rest:
            kwargs["markdown_text"] = rest
        try:
            await self.client.chat_stopStream(**kwargs)
        except SlackApiError as exc:
            self._live.pop(ts, None)
            self._refused("chat.stopStream", exc)
            return False
        self._live.pop(ts, None)
        return True

    async def stop(self, ts: str, address: ChatAddress) -> None:
        """``chat.stopStream`` without more text, so the message can be edited; best effort (a
        message that is no stream, or no longer one, is refused by Slack: logged at DEBUG)."""
        self._live.pop(ts, None)
        try:
            await self.client.chat_stopStream(channel=address.chat_id, ts=ts)
        except (SlackApiError, aiohttp.ClientError, TimeoutError, OSError) as exc:
            code = exc.response.get("error") if isinstance(exc, SlackApiError) and exc.response is not None else None
            log.debug("slack chat.stopStream %s: %s", ts, code or type(exc).__name__)

    def _refused(self, method: str, exc: SlackApiError) -> None:
        code = str(exc.response.get("error") or "") if exc.response is not None else ""
        if code in UNAVAILABLE and self.enabled:
            self.enabled = False
            log.info("slack %s answered %s: native streaming off, previews use chat.update", method, code)
        else:
            log.info("slack %s answered %s; this reply uses chat.update", method, code or "an error")
