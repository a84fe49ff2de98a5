"""A minimal HTTP/1.1 client that sends exactly the bytes it is given.

aiohttp's client drops header bytes that are not UTF-8 (and normalises bodies and cookies), so
hostile requests as an attacker or a broken proxy sends them need a plain socket: a request line,
the given headers as raw bytes, ``Content-Length``, ``Connection: close``, the raw body.
"""

from __future__ import annotations

import asyncio


async def post(port: int, path: str, body: bytes, headers: list[tuple[bytes, bytes]],
               timeout: float = 20.0, method: bytes = b"POST") -> tuple[int, bytes]:
    """POSTs ``body`` to ``127.0.0.1:port`` + ``path`` (``method``: another verb, e.g. ``b"GET"``
    with an empty body); returns ``(status, response body)``.

    Raises:
        TimeoutError: no complete answer within ``timeout`` seconds.
        ValueError: the answer is not HTTP.
    """
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout)
    try:
        head = [method + b" " + path.encode() + b" HTTP/1.1", b"Host: 127.0.0.1:%d" % port,
                b"Content-Length: %d" % len(body), b"Connection: close"]
        head += [name + b": " + value for name, value in headers]
        writer.write(b"\r\n".join(head) + b"\r\n\r\n" + body)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.close()
    status_line, _, rest = answer.partition(b"\r\n")
    parts = status_line.split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/"):
        raise ValueError(f"not an HTTP answer: {answer[:80]!r}")
    return int(parts[1]), rest.partition(b"\r\n\r\n")[2]
