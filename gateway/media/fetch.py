"""Downloads of file URLs that platforms hand over, with the outbound address guard.

``GuardedFetch(url, headers=..., max_bytes=..., trusted=...)`` (``gateway.core.ports.Fetch``):

* a URL on the platform API origin the operator configured (``trusted``) is connected to as it
  is (a loopback fake, a self-hosted server): the operator chose it;
* any other URL, and every redirect that leaves the first origin, goes through
  ``agent.netguard.open_url``: every hop's address is checked (no loopback, private, link-local,
  metadata addresses), at most 5 redirects, and ``Authorization``/``Cookie`` are dropped when a
  redirect leaves the first origin, so a bot token never travels to another host;
* the body is read in chunks and cut off past ``max_bytes`` (``FileTooBig``): a server that
  lies about its size cannot make the gateway hold more.
"""

from __future__ import annotations

import aiohttp
from yarl import URL

from agent.netguard import REDIRECT_STATUSES, BlockedAddress, NetGuard, open_url
from gateway.core.errors import DownloadFailed, FileTooBig

CHUNK = 64 * 1024
MAX_REDIRECTS = 5


class GuardedFetch:
    """See the module doc. ``guard``: the address policy (default: public addresses only);
    ``timeout_s``: for the whole download."""

    def __init__(self, guard: NetGuard | None = None, timeout_s: float = 120.0) -> None:
        self.guard = guard or NetGuard()
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def __call__(self, url: str, *, headers: dict[str, str], max_bytes: int,
                       trusted: bool) -> tuple[bytes, str]:
        try:
            if trusted:
                return await self._trusted(url, headers, max_bytes)
            return await self._guarded(url, headers, max_bytes)
        except BlockedAddress as exc:
            raise DownloadFailed(f"the file's address was refused ({exc.reason})") from None
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise DownloadFailed(f"the download failed ({type(exc).__name__})", retryable=True) from None

    async def _trusted(self, url: str, headers: dict[str, str], max_bytes: int) -> tuple[bytes, str]:
        """Hops on the configured origin as they are; the first hop elsewhere goes guarded, without credentials."""
        current = URL(url)
        origin = (current.scheme, current.host, current.port)
        async with aiohttp.ClientSession(timeout=self.timeout, trust_env=False) as plain:
            for _ in range(MAX_REDIRECTS + 1):
                async with plain.get(current, headers=headers, allow_redirects=False) as response:
                    location = response.headers.get("Location")
                    if response.status not in REDIRECT_STATUSES or not location:
                        return await _body(response, max_bytes)
                current = current.join(URL(location))
                if (current.scheme, current.host, current.port) != origin:
                    return await self._guarded(str(current), {}, max_bytes)
        raise DownloadFailed("the platform redirected too often")

    async def _guarded(self, url: str, headers: dict[str, str], max_bytes: int) -> tuple[bytes, str]:
        async with self.guard.session(timeout=self.timeout) as session, \
                open_url(session, url, self.guard, headers=headers) as response:
            return await _body(response, max_bytes)


async def _body(response: aiohttp.ClientResponse, max_bytes: int) -> tuple[bytes, str]:
    if response.status >= 400:
        raise DownloadFailed(f"the platform answered HTTP {response.status}", retryable=response.status >= 500)
    declared = response.content_length
    if declared is not None and declared > max_bytes:
        raise FileTooBig(declared, max_bytes, "this gateway")
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_chunked(CHUNK):
        size += len(chunk)
        if size > max_bytes:
            raise FileTooBig(None, max_bytes, "this gateway")
        chunks.append(chunk)
    return b"".join(chunks), response.content_type or "application/octet-stream"
