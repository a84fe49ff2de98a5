"""python-telegram-bot's HTTP seam (``telegram.request.BaseRequest``) on an aiohttp client.

PTB's default ``HTTPXRequest`` spends several milliseconds of CPU per call in httpcore's pool
bookkeeping; the gateway already runs aiohttp, whose client does the same work for a fraction of
that. Behaviour is PTB's (multipart when files are sent, PTB's timeout defaults, ``TimedOut`` /
``NetworkError`` on transport failures) with two differences. Parameters without files go as one
JSON object (``RequestData.parameters``), which the Bot API accepts for every call but uploads
("application/json (except for uploading files)", https://core.telegram.org/bots/api#making-requests);
PTB form-encodes them, and urllib's pure-Python percent-encoding (through aiohttp's ``FormData``)
cost 70-130 µs of CPU for a short reply with entities and a button, 0.6-0.9 ms for 4,000 CJK
characters (JSON: 7 and 25 µs), with a body three times the UTF-8 size of non-Latin text.

Proxies come from the environment (``HTTPS_PROXY``, ``HTTP_PROXY``, ``ALL_PROXY``, ``NO_PROXY``; a
password may be in the URL), read when the client starts: aiohttp's ``trust_env`` would scan the
whole environment again on every call.
"""

from __future__ import annotations

import functools
import json
import re
import urllib.request
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from telegram._utils.defaultvalue import DefaultValue
from telegram.error import NetworkError, TimedOut
from telegram.request import BaseRequest, RequestData

_to_json = functools.partial(json.dumps, ensure_ascii=False, separators=(",", ":"))
"""A request body: UTF-8 (the Bot API's encoding) rather than ``\\u`` escapes, half the bytes of CJK text."""


class AiohttpRequest(BaseRequest):
    """A ``BaseRequest`` for ``telegram.Bot(request=..., get_updates_request=...)``.

    Args:
        connection_limit: most connections open at once (requests beyond it wait).
        read_timeout, write_timeout, connect_timeout: seconds, PTB's meaning; ``None`` = no limit.
    """

    def __init__(self, *, connection_limit: int = 16, read_timeout: float | None = 5.0,
                 write_timeout: float | None = 5.0, connect_timeout: float | None = 5.0) -> None:
        self._limit = connection_limit
        self._read_timeout = read_timeout
        self._write_timeout = write_timeout
        self._connect_timeout = connect_timeout
        self._session: aiohttp.ClientSession | None = None
        self._proxies: dict[str, str] = {}
        self._proxy_for: dict[tuple[str, str], str | None] = {}

    @property
    def read_timeout(self) -> float | None:
        return self._read_timeout

    async def initialize(self) -> None:
        if self._session is None or self._session.closed:
            self._proxies = urllib.request.getproxies_environment()
            self._proxy_for = {}
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._limit), trust_env=False,
                headers={"User-Agent": self.USER_AGENT}, json_serialize=_to_json,
            )

    def proxy(self, url: str) -> str | None:
        """The proxy URL for ``url`` from the environment read at ``initialize`` (the scheme's
        ``*_PROXY``, else ``ALL_PROXY``), or ``None`` when there is none or ``NO_PROXY`` names the
        host; kept per scheme and host."""
        parts = urlsplit(url)
        key = (parts.scheme, parts.hostname or "")
        if key not in self._proxy_for:
            proxy = self._proxies.get(parts.scheme) or self._proxies.get("all")
            # (in the standard library since 3.x, missing from typeshed's stubs)
            if proxy and urllib.request.proxy_bypass_environment(key[1], self._proxies):  # type: ignore[attr-defined]
                proxy = None
            self._proxy_for[key] = proxy or None
        return self._proxy_for[key]

    async def shutdown(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None

    async def do_request(
        self,
        url: str,
        method: str,
        request_data: RequestData | None = None,
        read_timeout: float | DefaultValue[None] | None = BaseRequest.DEFAULT_NONE,  # type: ignore[override]
        write_timeout: float | DefaultValue[None] | None = BaseRequest.DEFAULT_NONE,  # type: ignore[override]
        connect_timeout: float | DefaultValue[None] | None = BaseRequest.DEFAULT_NONE,  # type: ignore[override]
        pool_timeout: float | DefaultValue[None] | None = BaseRequest.DEFAULT_NONE,  # type: ignore[override]
    ) -> tuple[int, bytes]:
        """Sends one Bot API call; returns ``(HTTP status, body)``. Raises ``TimedOut`` or
        ``NetworkError`` (PTB's types) when the call did not complete."""
        if self._session is None or self._session.closed:
            raise RuntimeError("AiohttpRequest is not initialized")
        read = self._read_timeout if isinstance(read_timeout, DefaultValue) else read_timeout
        connect = self._connect_timeout if isinstance(connect_timeout, DefaultValue) else connect_timeout
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect, sock_read=read)
        body: aiohttp.FormData | None = None
        parameters: dict[str, Any] | None = None
        if request_data is not None and request_data.contains_files:
            form = aiohttp.FormData()
            for name, value in request_data.json_parameters.items():
                form.add_field(name, value)
            for name, (filename, content, mime) in request_data.multipart_data.items():
                form.add_field(name, content, filename=filename, content_type=mime)
            body = form
        elif request_data is not None:
            parameters = request_data.parameters  # a JSON body (see the module's docstring)
        try:
            async with self._session.request(method, url, data=body, json=parameters, timeout=timeout,
                                             proxy=self.proxy(url)) as response:
                return response.status, await response.read()
        except TimeoutError as exc:
            raise TimedOut from exc
        except aiohttp.ClientError as exc:
            raise NetworkError(describe(exc)) from exc


_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://\S+")


def describe(exc: aiohttp.ClientError) -> str:
    """``exc`` as the text of a ``NetworkError`` (logged, and stored as a delivery's error, shown on
    the admin pages and in a report's failure notice) without the URLs aiohttp's own text carries:
    a proxy's with its password (``ClientHttpProxyError``: ``url='http://user:pass@proxy'``), a
    request's with the bot token (``/bot<token>/sendMessage``). Found by a review."""
    name = f"aiohttp.{type(exc).__name__}"
    if isinstance(exc, aiohttp.ClientResponseError):  # ClientHttpProxyError among them
        return f"{name}: {exc.status} {exc.message}"
    if isinstance(exc, aiohttp.ClientConnectorError):
        why = exc.os_error.strerror or type(exc.os_error).__name__
        return f"{name}: cannot connect to {exc.host}:{exc.port} ({why})"
    text = _URL.sub("<url>", str(exc))
    return f"{name}: {text}" if text else name
