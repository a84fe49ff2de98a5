"""Who is at the other end of an HTTP request, for per-client limits (web chat streams and
uploads, admin logins).

Behind a reverse proxy every request comes from the proxy's address, so a limit per address would
be one limit for everyone. A request from an address in ``http.trusted_proxies`` is attributed to
the address the proxy recorded: the right-most ``X-Forwarded-For`` entry that is not itself a
trusted proxy (RFC 7239 §5.2 semantics as Caddy, nginx and HAProxy append it). Anything else
(the header sent by a direct client) is ignored, so a client cannot choose its own address.
IPv6 clients are grouped by their /64, the block one subscriber usually holds.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from aiohttp import web

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_networks(entries: Iterable[str]) -> tuple[Network, ...]:
    """``["127.0.0.1", "10.0.0.0/8", "::1"]`` -> networks. Raises ``ValueError`` for a bad entry."""
    return tuple(ipaddress.ip_network(entry.strip(), strict=False) for entry in entries)


def _trusted(address: str, proxies: tuple[Network, ...]) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in network for network in proxies)


def client_address(request: web.BaseRequest, proxies: tuple[Network, ...] = ()) -> str:
    """The client's address as a limit key: ``"203.0.113.7"``, ``"2001:db8:1:2::/64"``, or
    ``"unknown"`` (a Unix socket)."""
    address = request.remote or "unknown"
    if proxies and _trusted(address, proxies):
        hops = [hop.strip() for header in request.headers.getall("X-Forwarded-For", ())
                for hop in header.split(",") if hop.strip()]
        for hop in reversed(hops):
            if not _trusted(hop, proxies):
                address = hop
                break
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address[:64]
    if ip.version == 6 and ip.ipv4_mapped is None:
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip.ipv4_mapped or ip) if ip.version == 6 else str(ip)
