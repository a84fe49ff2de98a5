"""Outbound address guard for URLs that a user or the model supplies (SSRF defence, issue 17).

Rule: a fetch made for a user (``web_fetch``, the browser tools, later the gateway's downloads)
connects only to public unicast addresses. Refused: loopback (127/8, ::1), private (RFC 1918,
fc00::/7), link-local (169.254/16 with the cloud metadata address 169.254.169.254, fe80::/10),
shared address space (100.64/10), site-local (fec0::/10), multicast, unspecified (0.0.0.0, ::),
reserved and documentation ranges: every address that ``ipaddress`` does not call global. IPv6
addresses that carry an IPv4 address (IPv4-mapped ``::ffff:a.b.c.d``, IPv4-compatible
``::a.b.c.d``, 6to4 ``2002::/16``, NAT64 ``64:ff9b::/96``) are judged by that IPv4 address. Host
names in a legacy numeric IPv4 form (``2130706433``, ``0177.0.0.1``, ``0x7f.1``, ``127.1``) are
refused whatever they denote.

The check binds to the address actually connected, never to an earlier lookup:

* ``GuardedResolver`` wraps aiohttp's resolver and drops refused addresses from every answer, so
  a name that resolves to something else at connect time (DNS rebinding) still cannot reach them;
* ``GuardedConnector`` also checks IP-literal hosts, which aiohttp connects to without resolving;
* ``open_url`` follows redirects itself: every hop's scheme and host are checked and every hop
  connects through the guarded connector, at most ``max_redirects`` hops, and credentials
  (``Authorization``, ``Cookie``) are dropped when a redirect leaves the first origin;
* ``NetGuard.open_connection`` (raw TCP, used by the browser's filtering proxy) resolves and
  connects only to allowed addresses.

``allow_private=True`` (settings ``tools.web_fetch_allow_private``, ``tools.browser_allow_private``)
turns the address rule off; the scheme rule (http/https only) and the hop limit stay.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from yarl import URL

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
"""HTTP statuses ``open_url`` follows (RFC 9110 §15.4), with a ``Location`` header."""
_CREDENTIAL_HEADERS = ("authorization", "cookie", "proxy-authorization")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")
_LEGACY_PART = re.compile(r"0[xX][0-9a-fA-F]*|0[0-7]*|[1-9][0-9]*")


class BlockedAddress(PermissionError):
    """A URL, host or address the guard refuses; the message says which and why (shown to the model).

    Attributes:
        host: the host name or literal as given.
        address: the refused address (text), or ``None`` when the URL itself was refused.
        reason: ``loopback``, ``private``, ``link-local``, ``multicast``, ``unspecified``,
            ``reserved``, ``site-local``, ``not globally routable``, or a URL-level reason.
    """

    def __init__(self, host: str, address: str | None, reason: str, via: str | None = None) -> None:
        self.host, self.address, self.reason, self.via = host, address, reason, via
        where = host if address is None or address == host else f"{host} ({address})"
        hop = f" (reached by a redirect from {via})" if via else ""
        rule = "; tools may reach only public internet addresses" if address else ""
        super().__init__(f"refused {where}: {reason}{hop}{rule}")

    def redirected_from(self, url: str) -> BlockedAddress:
        """The same refusal, saying which URL redirected to it."""
        return BlockedAddress(self.host, self.address, self.reason, via=url)


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address in _NAT64 or (address in _IPV4_COMPATIBLE and int(address) > 1):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def address_problem(address: IPAddress) -> str | None:
    """Why ``address`` may not be connected to (``"loopback"``, ``"private"``, ...), ``None`` if public.

    IPv6 addresses embedding an IPv4 address are judged by the IPv4 address inside; a zone id
    (``fe80::1%eth0``) does not change the verdict.
    """
    if isinstance(address, ipaddress.IPv6Address):
        embedded = _embedded_ipv4(address)
        if embedded is not None:
            return address_problem(embedded)
        if address.scope_id:
            address = ipaddress.IPv6Address(str(address).split("%", 1)[0])
    checks = (("unspecified", address.is_unspecified), ("loopback", address.is_loopback),
              ("link-local", address.is_link_local), ("multicast", address.is_multicast),
              ("site-local", isinstance(address, ipaddress.IPv6Address) and address.is_site_local),
              ("private", address.is_private), ("reserved", address.is_reserved),
              ("not globally routable", not address.is_global))
    return next((reason for reason, hit in checks if hit), None)


def _legacy_part(part: str) -> int:
    if part[:2].lower() == "0x":
        return int(part[2:] or "0", 16)
    return int(part, 8) if len(part) > 1 and part[0] == "0" else int(part)


def legacy_ipv4(host: str) -> ipaddress.IPv4Address | None:
    """The IPv4 address a non-canonical numeric host denotes for ``inet_aton`` (and so for
    ``getaddrinfo`` and browsers): ``2130706433``, ``0177.0.0.1``, ``0x7f.1``, ``127.1`` are all
    127.0.0.1. ``None`` for a canonical dotted quad or anything that is not such a number."""
    parts = host.split(".") if host else []
    if parts and parts[-1] == "" and len(parts) > 1:
        parts.pop()  # a trailing dot: "127.0.0.1." still means 127.0.0.1
    if not 1 <= len(parts) <= 4 or not all(_LEGACY_PART.fullmatch(p) for p in parts):
        return None
    *head, last = (_legacy_part(p) for p in parts)
    if any(v > 255 for v in head) or last >= 1 << (8 * (4 - len(head))):
        return None
    number = last
    for index, value in enumerate(head):
        number |= value << (8 * (3 - index))
    address = ipaddress.IPv4Address(number)
    return None if str(address) == host else address


def literal_address(host: str) -> IPAddress | None:
    """``host`` (brackets allowed) as an IP address when it is an IP literal, else ``None``."""
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def blocked_cause(exc: BaseException | None) -> BlockedAddress | None:
    """The ``BlockedAddress`` behind ``exc`` (aiohttp wraps resolver errors), or ``None``."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, BlockedAddress):
            return exc
        exc = getattr(exc, "os_error", None) or exc.__cause__ or exc.__context__
        seen += 1
    return None


class NetGuard:
    """The address policy and the aiohttp pieces that enforce it.

    Args:
        allow_private: allow every address (loopback, private, ...): for tests and trusted setups.
        allow: networks (``"203.0.113.7/32"``, ``ip_network(...)``) allowed although the rule
            refuses them, e.g. one intranet host an operator trusts.
        resolver: the aiohttp resolver whose answers are filtered (default: the system resolver,
            ``getaddrinfo`` on the running loop, as aiohttp's ``ThreadedResolver``). Tests inject one.
    """

    def __init__(self, *, allow_private: bool = False, allow: Iterable[str | IPNetwork] = (),
                 resolver: AbstractResolver | None = None) -> None:
        self.allow_private = allow_private
        self.allow = tuple(ipaddress.ip_network(n) if isinstance(n, str) else n for n in allow)
        self._inner = resolver

    def problem(self, address: IPAddress) -> str | None:
        """Why this guard refuses ``address``, or ``None`` when it may be connected to."""
        if self.allow_private or any(address.version == n.version and address in n for n in self.allow):
            return None
        return address_problem(address)

    def check_address(self, host: str, address: str | IPAddress) -> None:
        """Raises ``BlockedAddress`` unless ``address`` (the one about to be connected) is allowed."""
        ip = ipaddress.ip_address(address) if isinstance(address, str) else address
        reason = self.problem(ip)
        if reason:
            embedded = _embedded_ipv4(ip) if isinstance(ip, ipaddress.IPv6Address) else None
            inside = f" (IPv4 {embedded} inside an IPv6 address)" if embedded else ""
            raise BlockedAddress(host, str(ip), f"a {reason} address{inside}")

    def check_url(self, url: str | URL) -> URL:
        """Checks what can be checked without DNS: an absolute http(s) URL with a host; an IP
        literal host must be allowed; a legacy numeric IPv4 host is refused. Returns the URL.

        Raises:
            BlockedAddress: the URL is refused (its message names the reason).
        """
        parsed = url if isinstance(url, URL) else URL(url)
        host = parsed.host or ""
        if parsed.scheme not in ("http", "https") or not host:
            raise BlockedAddress(str(url)[:200], None, "not an absolute http:// or https:// URL")
        self.check_host(host)
        return parsed

    def check_host(self, host: str) -> None:
        """Raises ``BlockedAddress`` for a refused IP-literal host or any legacy numeric IPv4 host;
        host names pass (their addresses are checked when resolved)."""
        legacy = legacy_ipv4(host)
        if legacy is not None:
            reason = self.problem(legacy)
            raise BlockedAddress(host, str(legacy), "a non-canonical IPv4 form"
                                 + (f" of a {reason} address" if reason else " (write it as a.b.c.d)"))
        literal = literal_address(host)
        if literal is not None:
            self.check_address(host, literal)

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_UNSPEC) -> list[ResolveResult]:
        """``host``'s addresses that may be connected to (literals checked, names resolved and filtered).

        Raises:
            BlockedAddress: every address ``host`` resolves to is refused (the first one is named).
            OSError: the name does not resolve.
        """
        self.check_host(host)
        literal = literal_address(host)
        if literal is not None:
            fam = socket.AF_INET6 if literal.version == 6 else socket.AF_INET
            return [ResolveResult(hostname=host, host=str(literal), port=port, family=fam, proto=0,
                                  flags=socket.AI_NUMERICHOST)]
        resolver = self._inner or aiohttp.ThreadedResolver()
        answers = await resolver.resolve(host, port, family)
        allowed = [a for a in answers if self.problem(ipaddress.ip_address(a["host"])) is None]
        if not allowed:
            if not answers:
                raise OSError(f"{host} did not resolve")
            self.check_address(host, answers[0]["host"])
        return allowed

    async def open_connection(self, host: str, port: int,
                              timeout_s: float = 10.0) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A TCP connection to an allowed address of ``host`` (tried in resolver order).

        Raises:
            BlockedAddress: no allowed address. OSError: none of them accepted the connection.
        """
        last: OSError | None = None
        for answer in await self.resolve(host, port):
            try:
                return await asyncio.wait_for(asyncio.open_connection(answer["host"], port), timeout_s)
            except (TimeoutError, OSError) as exc:
                last = exc if isinstance(exc, OSError) else OSError(f"connecting to {host}:{port} timed out")
        raise last or OSError(f"cannot connect to {host}:{port}")

    def resolver(self) -> GuardedResolver:
        """An aiohttp resolver returning only allowed addresses (for ``TCPConnector(resolver=...)``)."""
        return GuardedResolver(self)

    def connector(self, **kwargs: Any) -> GuardedConnector:
        """A ``TCPConnector`` that connects only to allowed addresses (names and IP literals)."""
        return GuardedConnector(self, **kwargs)

    def session(self, **kwargs: Any) -> aiohttp.ClientSession:
        """A ``ClientSession`` on a guarded connector, ignoring proxy environment variables."""
        return aiohttp.ClientSession(connector=self.connector(), trust_env=False, **kwargs)


class GuardedResolver(AbstractResolver):
    """aiohttp resolver: the guard's filtered answers (``BlockedAddress`` when none is allowed)."""

    def __init__(self, guard: NetGuard) -> None:
        self._guard = guard

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        return await self._guard.resolve(host, port, family)

    async def close(self) -> None:
        """Nothing to release: the guard's resolver belongs to whoever made the guard."""


class GuardedConnector(aiohttp.TCPConnector):
    """``TCPConnector`` whose resolver is the guard's and which checks IP-literal hosts (aiohttp
    connects to those without asking the resolver) before every new connection."""

    def __init__(self, guard: NetGuard, **kwargs: Any) -> None:
        super().__init__(resolver=guard.resolver(), **kwargs)
        self.guard = guard

    async def connect(self, req: Any, traces: Any, timeout: Any) -> Any:
        host = req.url.host or ""
        if literal_address(host) is not None or legacy_ipv4(host) is not None:
            self.guard.check_host(host)
        return await super().connect(req, traces, timeout)


def _origin(url: URL) -> tuple[str, str, int | None]:
    return url.scheme, (url.host or "").lower(), url.port


@asynccontextmanager
async def open_url(session: aiohttp.ClientSession, url: str | URL, guard: NetGuard, *, max_redirects: int = 5,
                   headers: Mapping[str, str] | None = None,
                   method: str = "GET") -> AsyncIterator[aiohttp.ClientResponse]:
    """Opens ``url`` with ``session`` (on ``guard.connector()``), following redirects hop by hop.

    Every hop is checked with ``guard.check_url`` before its request (and connects through the
    guarded connector); a redirect's body is never read. ``303`` turns the method into ``GET``.
    Yields the final response (``response.url`` is the last hop).

    Raises:
        BlockedAddress: a hop's URL or address is refused (nothing of that hop was read).
        aiohttp.TooManyRedirects: more than ``max_redirects`` redirects.
        aiohttp.ClientError: other network failures.
    """
    current = guard.check_url(url)
    first = _origin(current)
    sent = dict(headers or {})
    history: list[aiohttp.ClientResponse] = []
    while True:
        try:
            response = await session.request(method, current, headers=sent, allow_redirects=False)
        except aiohttp.ClientError as exc:
            blocked = blocked_cause(exc)
            if blocked is None:
                raise
            raise (blocked.redirected_from(str(history[-1].url)) if history else blocked) from None
        except BlockedAddress as exc:  # an IP literal, refused by the connector before connecting
            raise (exc.redirected_from(str(history[-1].url)) if history else exc) from None
        location = response.headers.get("Location")
        if response.status not in REDIRECT_STATUSES or not location:
            break
        response.release()
        history.append(response)
        if len(history) > max_redirects:
            raise aiohttp.TooManyRedirects(response.request_info, tuple(history),
                                           message=f"more than {max_redirects} redirects")
        try:
            current = guard.check_url(current.join(URL(location)).with_fragment(None))
        except BlockedAddress as exc:
            raise exc.redirected_from(str(response.url)) from None
        if response.status == 303 and method != "HEAD":
            method = "GET"
        if _origin(current) != first:
            sent = {k: v for k, v in sent.items() if k.lower() not in _CREDENTIAL_HEADERS}
    try:
        yield response
    finally:
        response.release()
