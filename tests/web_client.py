"""A browser stand-in for the web chat and admin tests: one aiohttp client session with its own
cookie jar (loopback addresses need ``unsafe=True``), the chat's POST and its event stream."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import Callable
from typing import Any

import aiohttp


class WebClient:
    """One browser: ``open()`` loads ``/`` (gets the identity cookie), ``say()`` posts a message,
    ``events`` collects everything the chat's event stream sent since ``listen()``."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.http = aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))
        self.events: list[dict[str, Any]] = []
        self._listener: asyncio.Task[None] | None = None

    async def open(self) -> str:
        async with self.http.get(f"{self.base}/") as response:
            assert response.status == 200
            return await response.text()

    async def upload(self, data: bytes, content_type: str, name: str) -> tuple[int, dict[str, Any]]:
        """``POST /web/files`` as the page's attach button and drop zone do: ``(status, answer)``."""
        async with self.http.post(f"{self.base}/web/files", data=data,
                                  headers={"X-Requested-With": "gateway-web", "Content-Type": content_type,
                                           "X-File-Name": name}) as response:
            return response.status, await response.json()

    async def say(self, text: str, name: str = "", message_id: str | None = None,
                  files: list[dict[str, Any]] | None = None) -> aiohttp.ClientResponse:
        body: dict[str, Any] = {"id": message_id or uuid.uuid4().hex, "text": text, "name": name}
        if files is not None:
            body["files"] = files
        async with self.http.post(f"{self.base}/web/messages", json=body,
                                  headers={"X-Requested-With": "gateway-web"}) as response:
            await response.read()
            return response

    def listen(self) -> None:
        self._listener = asyncio.create_task(self._listen())

    async def _listen(self) -> None:
        async with self.http.get(f"{self.base}/web/events?after=0") as response:
            assert response.status == 200
            async for line in response.content:
                if line.startswith(b"data: "):
                    self.events.append(json.loads(line[6:]))

    def of(self, kind: str, where: Callable[[dict[str, Any]], bool] = lambda e: True) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == kind and where(e)]

    def link_code(self) -> str | None:
        for event in self.of("reply"):
            if match := re.search(r"/link ([A-Z0-9]{5}-[A-Z0-9]{5})", event["text"]):
                return match.group(1)
        return None

    async def close(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
            await asyncio.gather(self._listener, return_exceptions=True)
        await self.http.close()
