"""The streamed chat-completions call, sent on the ``openai`` client's own HTTP client (httpx).

The SDK's request path (options copied through pydantic, the request rebuilt with its headers
merged, the response wrapped, every server-sent event decoded by its Python SSE decoder) costs a
third of a streamed call's CPU against a fast server: 1.4-1.7 ms per call through the SDK,
0.9-1.2 ms here (one thread, 300 calls, alternating runs). Building the request once instead of
with ``build_request`` per call, and reading the stream with fewer layers, took a fifth off that
(0.51 to 0.40 ms of the thread's CPU; 0.83 to 0.62 ms with the machine loaded; interleaved runs).
This module sends the request with the client's base URL, headers, cookies, key and timeout on
that client, and keeps the SDK's behaviour where it matters to callers:

- **Errors** are the SDK's exception types with the SDK's fields (``status_code``, ``message`` =
  ``"Error code: 429 - <the error's message>"``, ``body`` = the ``error`` object, ``code``,
  ``param``, ``response``): ``APIStatusError`` subclasses by status, ``APITimeoutError``,
  ``APIConnectionError`` (also when the connection breaks mid-stream), ``APIError`` for an
  ``error`` object sent inside the stream. ``agent.model_errors`` reads them as before.
- **Retries** follow the SDK's policy: up to ``max_retries`` more attempts after a timeout, a
  connection failure, 408, 409, 429 or 5xx (``x-should-retry: true|false`` overrides), waiting
  ``Retry-After`` when the server gives 0-120 s, else 0.5 s doubling up to 8 s, less up to 25 %
  jitter; a ``Retry-After`` above 120 s is not waited for (the error is raised, so routing can
  move on). Only before the first byte of the answer: a stream that broke off is never resent.
  Any status outside 2xx is an error, as the SDK's ``raise_for_status``.
- **Server-sent events** are split on CR, LF and CRLF only (not on U+2028 and the other line
  breaks ``str.splitlines`` knows, which JSON text may hold unescaped) and read as UTF-8 whatever
  charset the response names (WHATWG HTML, "Interpreting an event stream").
- After ``[DONE]`` the rest of the body is read, so the connection goes back to the pool (the SDK's
  sync stream closes it instead: a new connection, and TLS handshake, per call); a failure while
  reading it does not matter (the answer is complete; the connection is dropped). A server that
  keeps the body open after ``[DONE]`` delays the answer by the read timeout.
"""

from __future__ import annotations

import math
import random
import re
import ssl
import time
from collections.abc import Iterator
from typing import Any

import anyio
import httpx2
import openai
import orjson

from agent.model_errors import retry_after_s

INITIAL_RETRY_DELAY_S = 0.5
MAX_RETRY_DELAY_S = 8.0
MAX_RETRY_AFTER_S = 120.0
"""The SDK's own limits (``openai._constants``, 3.57): a longer ``Retry-After`` is not waited for."""

_CONNECTION_ERRORS: tuple[type[BaseException], ...] = (httpx2.RequestError, ssl.SSLError, anyio.EndOfStream)
"""What the SDK reports as ``APIConnectionError`` (``openai._httpx2.request_exceptions``); timeouts
(``httpx2.TimeoutException``, a ``RequestError`` too) are checked first."""

_DRAIN_ERRORS: tuple[type[BaseException], ...] = (httpx2.TimeoutException, *_CONNECTION_ERRORS)

_LINE_END = re.compile(rb"\r\n|\r|\n")

_STATUS_ERRORS: dict[int, type[openai.APIStatusError]] = {
    400: openai.BadRequestError, 401: openai.AuthenticationError, 403: openai.PermissionDeniedError,
    404: openai.NotFoundError, 409: openai.ConflictError, 422: openai.UnprocessableEntityError,
    429: openai.RateLimitError,
}


class StreamingEndpoint:
    """``POST {base_url}chat/completions`` with ``stream: true`` for one ``openai.OpenAI`` client,
    on ``http`` (the ``httpx2.Client`` that client was built with).

    The request is put together once as ``http.build_request`` would merge it on every call (that
    merge parses the URL and every header again: about 100 µs a call): the URL, ``http``'s headers
    under the SDK client's (``Host`` first), the SDK client's timeout. Per call only the body, its
    ``Content-Length`` and the cookies ``http`` holds (as ``build_request`` adds them) are set; it
    is sent with ``http.send``, so the client's transport, proxies and mounts, redirects and cookie
    jar apply as before."""

    def __init__(self, client: openai.OpenAI, http: httpx2.Client) -> None:
        self.http = http
        self.url = httpx2.URL(f"{str(client.base_url).rstrip('/')}/chat/completions")
        merged = {**client.default_headers, **client.auth_headers}
        headers = httpx2.Headers(http.headers)
        headers.update({name: value for name, value in merged.items() if isinstance(value, str)})  # no Omit markers
        self.headers = httpx2.Headers([(b"Host", self.url.netloc), *headers.raw])
        self.extensions = {"timeout": httpx2.Timeout(client.timeout).as_dict()}
        self.max_retries = client.max_retries

    def request(self, body: bytes) -> httpx2.Request:
        """The ``POST`` carrying ``body`` (JSON bytes), headers and cookies as ``http.build_request`` sets them."""
        request = httpx2.Request("POST", self.url, headers=self.headers, stream=httpx2.ByteStream(body),
                                 extensions=self.extensions)
        request.headers["Content-Length"] = str(len(body))
        if self.http.cookies:
            self.http.cookies.set_cookie_header(request)
        return request

    def events(self, body: bytes) -> Iterator[dict[str, Any]]:
        """The JSON objects of the stream's ``data:`` events in order, up to ``[DONE]`` (the rest of
        the body is read so the connection goes back to the pool). Raises the SDK's exceptions
        (module docstring); retries as the SDK does before the answer starts."""
        request = self.request(body)
        response = self._send(request)
        try:
            yield from _data_events(response)
        except httpx2.TimeoutException as exc:
            raise openai.APITimeoutError(request=request) from exc
        except _CONNECTION_ERRORS as exc:
            raise openai.APIConnectionError(request=request) from exc
        finally:
            response.close()

    def _send(self, request: httpx2.Request) -> httpx2.Response:
        for attempt in range(self.max_retries + 1):
            last = attempt == self.max_retries
            request.headers["x-stainless-retry-count"] = str(attempt)  # as the SDK counts them
            try:
                response = self.http.send(request, stream=True)
            except httpx2.TimeoutException as exc:
                if last:
                    raise openai.APITimeoutError(request=request) from exc
                time.sleep(_backoff(attempt, None))
                continue
            except _CONNECTION_ERRORS as exc:
                if last:
                    raise openai.APIConnectionError(request=request) from exc
                time.sleep(_backoff(attempt, None))
                continue
            if 200 <= response.status_code < 300:
                return response
            if last or not _should_retry(response):
                raise _read_error(response, request)
            response.close()
            time.sleep(_backoff(attempt, response))
        raise AssertionError("unreachable: the last attempt returns or raises")


def _read_error(response: httpx2.Response, request: httpx2.Request) -> openai.APIError:
    """``status_error`` for ``response``, or ``APITimeoutError`` / ``APIConnectionError`` when its
    body does not come whole (the SDK would let httpx's own exception through)."""
    try:
        return status_error(response)
    except httpx2.TimeoutException as exc:
        response.close()
        return _chained(openai.APITimeoutError(request=request), exc)
    except _CONNECTION_ERRORS as exc:
        response.close()
        return _chained(openai.APIConnectionError(request=request), exc)


def _chained(error: openai.APIError, cause: BaseException) -> openai.APIError:
    error.__cause__ = cause
    return error


def status_error(response: httpx2.Response) -> openai.APIStatusError:
    """The SDK's exception for an error response (read here): its class by status, ``body`` = the
    ``error`` object when the body is JSON with one (else the parsed body or its text), ``message``
    = ``"Error code: N"`` plus ``" - <error.message>"`` when there is one."""
    response.read()
    text = response.text.strip()
    message = f"Error code: {response.status_code}"
    body: Any = text
    try:
        body = orjson.loads(text)
    except orjson.JSONDecodeError:
        pass
    else:
        error = body.get("error", body) if isinstance(body, dict) else None
        detail = error.get("message") if isinstance(error, dict) else None
        if isinstance(detail, str) and detail:
            message += f" - {detail}"
        if isinstance(body, dict):
            body = body.get("error", body)
    status = response.status_code
    kind = _STATUS_ERRORS.get(status, openai.InternalServerError if status >= 500 else openai.APIStatusError)
    return kind(message, response=response, body=body)


def _should_retry(response: httpx2.Response) -> bool:
    wait = retry_after_s(response.headers)
    if (wait is not None and wait > MAX_RETRY_AFTER_S) or _endless_wait(response.headers):
        return False
    said = response.headers.get("x-should-retry")
    if said in ("true", "false"):
        return said == "true"
    return response.status_code in (408, 409, 429) or response.status_code >= 500


def _endless_wait(headers: httpx2.Headers) -> bool:
    """A ``retry-after(-ms)`` number too large for a float (``1e400``): the SDK takes it as longer
    than it waits (``retry_after_s`` reads it as no header)."""
    for name in ("retry-after-ms", "retry-after"):
        raw = headers.get(name)
        if raw is not None:
            try:
                return math.isinf(float(raw)) and raw.strip().lower() not in ("inf", "+inf", "infinity", "+infinity")
            except ValueError:
                continue
    return False


def _backoff(attempt: int, response: httpx2.Response | None) -> float:
    """Seconds before attempt ``attempt + 1`` (the SDK's ``_calculate_retry_timeout``)."""
    wait = retry_after_s(response.headers) if response is not None else None
    if wait is not None and math.isfinite(wait) and 0 < wait <= MAX_RETRY_AFTER_S:
        return wait
    return min(INITIAL_RETRY_DELAY_S * 2.0 ** min(attempt, 1000), MAX_RETRY_DELAY_S) * (1 - 0.25 * random.random())


def _lines(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """The body's lines without their ends (CR, LF or CRLF; a CR at a chunk's end waits for the
    next chunk, which may start with its LF). A last line without its end is dropped (an event
    is dispatched only by a blank line)."""
    pending = b""
    for chunk in chunks:
        if pending:
            chunk = pending + chunk
        if b"\r" in chunk:
            held = chunk.endswith(b"\r")
            lines = _LINE_END.split(chunk[:-1] if held else chunk)
            pending = lines.pop() + (b"\r" if held else b"")
        else:  # LF only, as most servers write
            lines = chunk.split(b"\n")
            pending = lines.pop()
        yield from lines
    if pending.endswith(b"\r"):
        yield pending[:-1]


def _data_events(response: httpx2.Response) -> Iterator[dict[str, Any]]:
    """``sse_events`` of ``response``'s body (decoded when it names a content encoding)."""
    # iter_raw when there is nothing to decode: iter_bytes adds a decoder and a chunker per call
    chunks = response.iter_bytes() if "content-encoding" in response.headers else response.iter_raw()
    return sse_events(chunks, response.request, _DRAIN_ERRORS)


def sse_events(chunks: Iterator[bytes], request: httpx2.Request,
               drain_errors: tuple[type[BaseException], ...]) -> Iterator[dict[str, Any]]:
    """Server-sent events (WHATWG HTML, "Interpreting an event stream") of a body read as
    ``chunks``: ``data:`` lines joined with newlines until a blank line ends the event; comments
    and other fields skipped. Yields each event's JSON up to ``[DONE]``, then reads the body to its
    end (``drain_errors`` there ignored: the answer is complete). An ``error`` object in an event
    raises ``openai.APIError`` (as the SDK's ``Stream`` does), so does an event that is not JSON
    (``request``: the one the error names)."""
    data: list[bytes] = []
    lines = _lines(chunks)
    for line in lines:
        if line:
            if line.startswith(b"data:"):
                data.append(line[6:] if line.startswith(b"data: ") else line[5:])
            continue
        if not data:
            continue
        payload = data[0] if len(data) == 1 else b"\n".join(data)
        data.clear()
        if payload.startswith(b"[DONE]"):
            try:
                for _ in lines:  # the connection goes back to the pool once the body is read
                    pass
            except drain_errors:
                pass  # it is closed instead
            return
        try:
            event = orjson.loads(payload)
        except orjson.JSONDecodeError as exc:
            raise openai.APIError(f"the stream sent an event that is not JSON: {payload[:80]!r}",
                                  request, body=None) from exc
        if isinstance(event, dict) and event.get("error"):
            error = event["error"]
            text = error.get("message") if isinstance(error, dict) else None
            raise openai.APIError(text if isinstance(text, str) and text else "An error occurred during streaming",
                                  request, body=error)
        yield event
