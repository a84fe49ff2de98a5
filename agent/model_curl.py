"""The streamed chat-completions call on libcurl (``pycurl``), the default where it is installed.

Against the same server, the call through the SDK's HTTP client (``agent.model_http``: httpx,
httpcore and h11, some 700 Python function calls a call) cost the calling thread 1.0-1.2 ms of
CPU and 1.8-2.1 ms of wall time per call; on libcurl 0.20-0.25 ms and 0.7-1.0 ms (one thread, 300
calls, a 6.6 KB request with 7 tools, alternating runs; ``bench/README.md``, fifteenth round).
libcurl does the HTTP/1.1, TLS and chunked transfer in C, releasing the
interpreter lock while it waits (``poll(2)`` on its sockets), and keeps connections, DNS answers
(60 s) and TLS sessions between calls (``CurlEndpoint``: a pool of transfers).

The request is the one ``StreamingEndpoint`` sends (``llm.http_client``: ``auto`` picks this one
when ``pycurl`` imports, ``httpx`` keeps the SDK's client), and callers see the same behaviour:

- the same URL, headers (the SDK client's over its HTTP client's, the attempt's
  ``x-stainless-retry-count``; ``Host`` and ``Content-Length`` as libcurl writes them, no
  ``Expect: 100-continue``), body, cookies (kept per endpoint, as httpx keeps them per client),
  HTTP/1.1 (no HTTP/2 offered over TLS), the body decoded as httpx decodes it (gzip, deflate; an
  encoding it does not know passes as it came); a header value with a line break is refused;
- the SDK's retry policy and exception types (``agent.model_http``: ``status_error``,
  ``_should_retry``, ``_backoff``): a status outside 2xx is retried or not on its head, as the
  SDK decides, else read whole (within the read timeout) and raised as the SDK's
  ``APIStatusError`` subclass; libcurl's timeout is ``APITimeoutError``, any other transfer
  failure (refused, reset, an undecodable body) ``APIConnectionError``, before the answer starts
  (retried) and during it (never resent);
- timeouts: the SDK client's connect timeout, and its read timeout as the longest wait for the
  next byte (checked here, to the millisecond);
- proxies from the environment as httpx reads them (``HTTP_PROXY``/``http_proxy``,
  ``HTTPS_PROXY``, ``ALL_PROXY``, ``NO_PROXY`` as httpx matches them: ``proxy_for``; libcurl
  alone ignores an upper-case ``HTTP_PROXY`` and reads ``NO_PROXY`` its own way),
  redirects followed as the SDK's client follows them (at most 20, http and https only);
- TLS verified against the CA file or directory httpx would load (``SSL_CERT_FILE``,
  ``SSL_CERT_DIR``, else the interpreter's OpenSSL default paths), and only those: libcurl's own
  built-in bundle is unset;
- the event stream read as ``agent.model_http.sse_events`` reads it, up to ``[DONE]``, then the
  rest of the body, so the connection is kept for the next call.
"""

from __future__ import annotations

import math
import os
import re
import select
import ssl
import time
import weakref
from collections.abc import Iterator
from typing import Any

import httpx2
import openai
import pycurl
from httpx2._utils import URLPattern, get_environment_proxies

from agent.model_http import _backoff, _should_retry, sse_events, status_error

_TIMED_OUT = pycurl.E_OPERATION_TIMEDOUT
_POLLIN = select.POLLIN
_HTTP_ONLY = pycurl.PROTO_HTTP | pycurl.PROTO_HTTPS
"""What a call and its redirects may use, as httpx: never ``ftp://``, ``file://`` or others."""
_LINE_BREAK = re.compile(r"[\r\n\0]")
_HEADERS_LIBCURL_WRITES = frozenset({"host", "content-length", "transfer-encoding", "expect"})
SUPPRESS_CONNECT_HEADERS = 265
"""``CURLOPT_SUPPRESS_CONNECT_HEADERS`` (libcurl 7.54; pycurl names no constant for it): a proxy's
answer to ``CONNECT`` is not handed to the header callback, which would take it for the response."""
MAX_REDIRECTS = 20
"""httpx's ``DEFAULT_MAX_REDIRECTS``."""
IDLE_TRANSFERS_KEPT = 64
"""Idle transfers (libcurl handles and their connection: three descriptors) an endpoint keeps for
the next calls, as httpx's pools keep 100 idle connections in all; beyond, a finished call's
transfer is closed."""
CA_FILE_CANDIDATES = ("/etc/ssl/cert.pem", "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem", "/etc/pki/tls/cert.pem",
                      "/etc/ssl/certs/ca-certificates.crt", "/etc/ssl/ca-bundle.pem")
"""The bundle files httpcore2 (and truststore) try on Linux when OpenSSL's own paths are unusable."""


def ca_locations() -> tuple[str | None, str | None]:
    """``(cafile, capath)`` as ``httpx2.create_ssl_context()`` loads them on Linux (httpcore2's
    ``default_ssl_context``): ``SSL_CERT_FILE``, else ``SSL_CERT_DIR``, else the interpreter's
    OpenSSL default file and hashed directory that exist, else the first of the usual bundle files.
    libcurl's own default path is where its wheel was built, not this system's."""
    if cafile := os.environ.get("SSL_CERT_FILE"):
        return cafile, None
    if capath := os.environ.get("SSL_CERT_DIR"):
        return None, capath
    paths = ssl.get_default_verify_paths()
    cafile = paths.openssl_cafile if os.path.isfile(paths.openssl_cafile) else None
    capath = paths.openssl_capath if os.path.isdir(paths.openssl_capath) else None
    if capath and not cafile and not any(re.fullmatch(r"[0-9a-fA-F]{8}\.\d", f) for f in os.listdir(capath)):
        capath = None
    if not cafile and not capath:
        cafile = next(filter(os.path.isfile, CA_FILE_CANDIDATES), None)
    return cafile, capath


def proxy_for(url: httpx2.URL) -> str:
    """The proxy URL the environment gives for ``url`` (``""``: none), as httpx's client picks it:
    its mounts from ``get_environment_proxies`` (``HTTP_PROXY``, ``HTTPS_PROXY``, ``ALL_PROXY``;
    ``NO_PROXY`` entries as URL patterns, with ports, CIDRs and ``*.`` names), the most specific
    matching pattern first."""
    mounts = sorted(((URLPattern(pattern), proxy) for pattern, proxy in get_environment_proxies().items()),
                    key=lambda mount: mount[0])
    return next((proxy or "" for pattern, proxy in mounts if pattern.matches(url)), "")


class _Transfer:
    """One transfer's libcurl handles (an easy handle on a multi handle of its own, which keeps its
    connection between calls), used by one call at a time, and the state of the call in progress.

    The calling thread waits with ``poll(2)`` on the sockets libcurl names through its socket callback and
    until the deadline its timer callback sets (libcurl's ``curl_multi_socket_action`` API), not
    with ``select(2)``: ``select`` cannot watch a descriptor numbered 1024 or above
    (``FD_SETSIZE``), and a gateway with hundreds of turns in flight holds more descriptors than
    that; libcurl then leaves its sockets out of the set and the waiting thread spins."""

    def __init__(self) -> None:
        self.easy = pycurl.Curl()
        self.multi = pycurl.CurlMulti()
        self.poll = select.poll()
        self.watched: set[int] = set()
        self.deadline: float | None = None
        """When libcurl's timer expires (``time.monotonic()`` seconds; ``None``: no timer)."""
        self.chunks: list[bytes] = []
        self.head: list[tuple[str, str]] = []
        self.status = 0
        self.head_done = False
        self.done = False
        self.error: tuple[int, str] | None = None
        self.last = 0.0
        self.added = False
        me = weakref.ref(self)  # the handles' callbacks do not keep their transfer alive (no cycle)
        self.easy.setopt(pycurl.WRITEFUNCTION, lambda data: me()._body(data))  # type: ignore[union-attr]
        self.easy.setopt(pycurl.HEADERFUNCTION, lambda line: me()._header(line))  # type: ignore[union-attr]
        self.multi.setopt(pycurl.M_SOCKETFUNCTION,
                          lambda what, fd, multi, data: me()._socket(what, fd, multi, data))  # type: ignore[union-attr]
        self.multi.setopt(pycurl.M_TIMERFUNCTION, lambda ms: me()._timer(ms))  # type: ignore[union-attr]

    def start(self) -> None:
        self.stop()  # a call stopped by an exception between its start and its end
        self.chunks.clear()
        self.head = []
        self.status = 0
        self.head_done = self.done = False
        self.error = None
        self.last = time.monotonic()
        self.deadline = self.last  # the transfer starts on its first timeout action
        self.multi.add_handle(self.easy)
        self.added = True

    def stop(self) -> None:
        """Takes the handle off its multi handle (an unfinished transfer's connection is closed)."""
        if self.added:
            self.added = False
            self.multi.remove_handle(self.easy)

    def close(self) -> None:
        """Closes the handles and the connection they keep (their descriptors with them)."""
        self.stop()
        self.easy.close()
        self.multi.close()

    def _socket(self, what: int, fd: int, _multi: object, _data: object) -> None:
        """libcurl's socket callback: what to watch on ``fd`` (``POLL_IN``/``OUT``/``INOUT``) or
        ``POLL_REMOVE``: watch it no more."""
        if what == pycurl.POLL_REMOVE:
            if fd in self.watched:
                self.watched.discard(fd)
                self.poll.unregister(fd)
            return
        mask = (_POLLIN if what in (pycurl.POLL_IN, pycurl.POLL_INOUT) else 0) | (
            select.POLLOUT if what in (pycurl.POLL_OUT, pycurl.POLL_INOUT) else 0)
        self.poll.register(fd, mask)  # registering again changes the mask
        self.watched.add(fd)

    def _timer(self, ms: int) -> None:
        """libcurl's timer callback: act on a timeout in ``ms`` milliseconds (``-1``: no timer)."""
        self.deadline = None if ms < 0 else time.monotonic() + ms / 1000

    def _body(self, data: bytes) -> None:
        self.chunks.append(data)
        self.last = time.monotonic()
        # libcurl hands over no body of a response it goes on from (a redirect it follows): this
        # one's head is whole, also a 3xx it does not follow (a Location it cannot use).
        self.head_done = self.status >= 200

    def _header(self, line: bytes) -> None:
        self.last = time.monotonic()
        text = line.decode("latin-1").rstrip("\r\n")
        if text.startswith("HTTP/"):  # a new response (after a 1xx or a redirect followed)
            parts = text.split(" ", 2)
            self.status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
            self.head = []
            self.head_done = False
        elif text:
            name, _, value = text.partition(":")
            self.head.append((name.strip(), value.strip()))
        elif self.status >= 200 and not (300 <= self.status < 400
                                         and any(n.lower() == "location" for n, _ in self.head)):
            self.head_done = True

    def pump(self, read_s: float, head: bool = False) -> None:
        """Runs the transfer until body data arrived (``head``: or the response's head), or it ended
        (``error`` set on failure). ``read_s``: the longest wait for the socket, counted from the
        last sign of it (a byte, a socket event) or from this call (the caller may have been busy
        for longer with what came before), as httpx counts its read timeout."""
        multi = self.multi
        self.last = max(self.last, time.monotonic())
        while True:
            _, finished, failed = multi.info_read()
            if failed:
                self.error = (failed[0][1], failed[0][2])
            if finished or failed:
                self.done = True
                return
            if self.chunks or (head and self.head_done):
                return
            now = time.monotonic()
            left = self.last + read_s - now
            if left <= 0:
                self.error = (_TIMED_OUT, f"no data for {read_s} s")
                self.done = True
                return
            if self.deadline is not None and self.deadline <= now:
                self.deadline = None
                multi.socket_action(pycurl.SOCKET_TIMEOUT, 0)
                continue
            wait = min(left, 1.0, self.deadline - now if self.deadline is not None else 1.0)
            ready = self.poll.poll(math.ceil(wait * 1000))
            if ready:
                self.last = time.monotonic()
            for fd, event in ready:
                if event & select.POLLNVAL:  # closed without a POLL_REMOVE: watch it no more
                    self._socket(pycurl.POLL_REMOVE, fd, None, None)
                    continue
                flags = (pycurl.CSELECT_IN if event & (_POLLIN | select.POLLHUP) else 0) | (
                    pycurl.CSELECT_OUT if event & select.POLLOUT else 0) | (
                    pycurl.CSELECT_ERR if event & select.POLLERR else 0)
                multi.socket_action(fd, flags)

    def take(self) -> bytes:
        data = b"".join(self.chunks) if len(self.chunks) != 1 else self.chunks[0]
        self.chunks.clear()
        return data


class CurlEndpoint:
    """``POST {base_url}chat/completions`` with ``stream: true`` for one ``openai.OpenAI`` client
    on libcurl: the request ``StreamingEndpoint`` sends for that client and ``http`` (its
    ``httpx2.Client``: headers, timeout).

    A call takes an idle transfer (libcurl handles and the connection they keep) or opens one, and
    gives it back when it ends; at most ``IDLE_TRANSFERS_KEPT`` stay idle, the rest are closed. So
    the descriptors held (three a transfer: the connection and the multi handle's wake-up pair)
    follow the calls in flight, not the threads that ever called. Cookies, DNS answers and TLS
    sessions are shared by the endpoint's transfers (a libcurl share handle)."""

    def __init__(self, client: openai.OpenAI, http: httpx2.Client) -> None:
        self.url = httpx2.URL(f"{str(client.base_url).rstrip('/')}/chat/completions")
        merged = {**client.default_headers, **client.auth_headers}
        headers = httpx2.Headers(http.headers)
        headers.update({name: value for name, value in merged.items() if isinstance(value, str)})
        self.headers = [f"{name}: {value}" for name, value in headers.items()
                        if name.lower() not in _HEADERS_LIBCURL_WRITES] + ["Expect:"]
        self.bad_header = next((name for name, value in headers.items() if _LINE_BREAK.search(value)), None)
        """A header whose value holds a line break (an API key read with its newline): never sent,
        as httpx refuses it."""
        timeout = httpx2.Timeout(client.timeout)
        self.connect_s = timeout.connect if timeout.connect is not None else 0.0
        self.read_s = timeout.read if timeout.read is not None else math.inf
        self.max_retries = client.max_retries
        self.proxy = proxy_for(self.url)
        self.cafile, self.capath = ca_locations()
        self._request = httpx2.Request("POST", self.url)
        self._idle: list[_Transfer] = []  # append and pop are atomic: no lock
        self._share = pycurl.CurlShare()
        for data in (pycurl.LOCK_DATA_COOKIE, pycurl.LOCK_DATA_DNS, pycurl.LOCK_DATA_SSL_SESSION):
            self._share.setopt(pycurl.SH_SHARE, data)

    def _open(self) -> _Transfer:
        """A new transfer set up for this endpoint. Raises ``APIConnectionError`` when libcurl
        cannot make its handles (descriptors exhausted)."""
        try:
            transfer = _Transfer()
        except pycurl.error as exc:
            raise openai.APIConnectionError(message=f"Connection error: {exc.args[-1]}",
                                            request=self._request) from exc
        easy = transfer.easy
        easy.setopt(pycurl.URL, str(self.url))
        easy.setopt(pycurl.POST, 1)
        easy.setopt(pycurl.HTTP_VERSION, pycurl.CURL_HTTP_VERSION_1_1)  # as httpx speaks it
        easy.setopt(pycurl.HTTP_CONTENT_DECODING, 0)  # decoded as httpx decodes (_decoded)
        easy.setopt(pycurl.SHARE, self._share)
        easy.setopt(pycurl.COOKIEFILE, "")  # keep the cookies the server sets
        easy.setopt(pycurl.PROTOCOLS, _HTTP_ONLY)
        easy.setopt(pycurl.REDIR_PROTOCOLS, _HTTP_ONLY)
        easy.setopt(pycurl.FOLLOWLOCATION, 1)
        easy.setopt(pycurl.MAXREDIRS, MAX_REDIRECTS)
        easy.setopt(pycurl.PROXY, self.proxy)
        easy.setopt(pycurl.NOPROXY, "")  # decided by proxy_for: libcurl would read NO_PROXY again
        easy.setopt(SUPPRESS_CONNECT_HEADERS, 1)
        easy.setopt(pycurl.NOSIGNAL, 1)
        if self.connect_s:
            easy.setopt(pycurl.CONNECTTIMEOUT_MS, max(1, int(self.connect_s * 1000)))
        for file_option, dir_option in ((pycurl.CAINFO, pycurl.CAPATH), (pycurl.PROXY_CAINFO, pycurl.PROXY_CAPATH)):
            # Exactly httpx's trust: libcurl's own built-in bundle and directory are unset.
            for option, location in ((file_option, self.cafile), (dir_option, self.capath)):
                if location:
                    easy.setopt(option, location)
                else:
                    easy.unsetopt(option)
        return transfer

    def _take(self) -> _Transfer:
        try:
            return self._idle.pop()
        except IndexError:
            return self._open()

    def _give_back(self, transfer: _Transfer) -> None:
        transfer.stop()
        if len(self._idle) < IDLE_TRANSFERS_KEPT:
            self._idle.append(transfer)
        else:
            transfer.close()

    def events(self, body: bytes) -> Iterator[dict[str, Any]]:
        """The JSON objects of the stream's ``data:`` events in order, up to ``[DONE]`` (the rest of
        the body is read so the connection is kept). Raises the SDK's exceptions (module
        docstring); retries as the SDK does before the answer starts."""
        if self.bad_header is not None:
            raise openai.APIConnectionError(message=f"Connection error: the {self.bad_header} header's value "
                                            "holds a line break", request=self._request)
        transfer = self._take()
        try:
            self._send(transfer, body)
            yield from sse_events(self._decoded(transfer, self._chunks(transfer)), self._request,
                                  (openai.APITimeoutError, openai.APIConnectionError))
        finally:
            self._give_back(transfer)

    def _decoded(self, transfer: _Transfer, chunks: Iterator[bytes]) -> Iterator[bytes]:
        """``chunks`` decoded as httpx decodes the response's ``Content-Encoding`` (gzip, deflate;
        an encoding it does not know passes as it is)."""
        if not any(name.lower() == "content-encoding" for name, _ in transfer.head):
            yield from chunks
            return
        decoder = httpx2.Response(transfer.status, headers=transfer.head)._get_content_decoder()
        try:
            for chunk in chunks:
                yield from decoder.decode(chunk)
            yield from decoder.flush()
        except httpx2.DecodingError as exc:
            raise openai.APIConnectionError(message=f"Connection error: {exc}", request=self._request) from exc

    def _chunks(self, transfer: _Transfer) -> Iterator[bytes]:
        while True:
            if transfer.chunks:
                yield transfer.take()
                continue
            if transfer.done:
                if transfer.error is not None:
                    raise self._failure(transfer.error)
                return
            transfer.pump(self.read_s)

    def _failure(self, error: tuple[int, str]) -> openai.APIError:
        if error[0] == _TIMED_OUT:
            return openai.APITimeoutError(request=self._request)
        return openai.APIConnectionError(message=f"Connection error: {error[1]}", request=self._request)

    def _send(self, transfer: _Transfer, body: bytes) -> None:
        """Sends ``body`` until a 2xx response's head arrived (its body then streams in on
        ``transfer``), retrying as the SDK does; raises the SDK's exception otherwise: for an error
        status whose body does not come whole within the read timeout, ``APITimeoutError``."""
        easy = transfer.easy
        easy.setopt(pycurl.POSTFIELDS, body)
        for attempt in range(self.max_retries + 1):
            last = attempt == self.max_retries
            easy.setopt(pycurl.HTTPHEADER, [*self.headers, f"x-stainless-retry-count: {attempt}"])
            transfer.start()
            while not (transfer.head_done or transfer.done):
                transfer.pump(self.read_s, head=True)
            if transfer.error is not None and not transfer.head_done:
                transfer.stop()
                if last:
                    raise self._failure(transfer.error)
                time.sleep(_backoff(attempt, None))
                continue
            if 200 <= transfer.status < 300:
                return
            head = httpx2.Response(transfer.status, headers=transfer.head, request=self._request)
            if not last and _should_retry(head):  # decided on the head, as the SDK does; the body unread
                transfer.stop()
                time.sleep(_backoff(attempt, head))
                continue
            content = b"".join(self._chunks(transfer))  # the error's body, read whole
            transfer.stop()
            try:  # decoded here, as httpx decodes it
                response = httpx2.Response(transfer.status, content=content, request=self._request,
                                           headers=[(n, v) for n, v in transfer.head
                                                    if n.lower() != "transfer-encoding"])
            except httpx2.DecodingError as exc:
                raise openai.APIConnectionError(message=f"Connection error: {exc}", request=self._request) from exc
            raise status_error(response)
        raise AssertionError("unreachable: the last attempt returns or raises")
