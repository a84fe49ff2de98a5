"""Browser tools on Playwright with the system Chromium, run on the AsyncBridge loop (DESIGN §2, §7).

``browser_open(url)``, ``browser_click(selector)``, ``browser_fill(selector, text)`` and
``browser_text()`` drive one page in one persistent ``BrowserContext`` per session, so cookies
(a login done in one turn) are still there in the next turn. The session comes from the
per-call ``RunContext.session_id`` (the tools declare ``takes_context``), not from thread state.

Playwright, the browser and every context are created on the bridge loop and only ever touched
there. Chromium is the Debian package (``executable_path``), launched headless on first use;
no browser build is downloaded. Every connection the browser makes (pages, redirects, subresources,
WebSockets) goes through ``agent.browser_proxy``, which lets it reach only addresses
``agent.netguard`` allows. A context unused for ``idle_s`` is closed (its cookies with it);
``AsyncBridge.stop`` closes contexts, the browser and Playwright. Contexts live in this process:
a session served next by another gateway instance starts with a fresh browser.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from agent.bridge import AsyncBridge
from agent.browser_proxy import GuardProxy
from agent.context import RunContext
from agent.netguard import BlockedAddress, NetGuard
from agent.tools import Tool

log = logging.getLogger("agent.browser")

LAUNCH_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--no-first-run",
               # WebRTC may not open UDP sockets of its own (they would bypass the proxy).
               "--force-webrtc-ip-handling-policy=disable_non_proxied_udp"]


@dataclass
class _Session:
    context: Any
    page: Any
    proxy: GuardProxy
    last_used: float = field(default_factory=time.monotonic)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class BrowserTools:
    """Holds Playwright and the browser on the bridge loop; ``tools()`` returns the four Tools.

    Args:
        executable_path: the system Chromium (``/usr/bin/chromium`` on Debian).
        idle_s: a session's context is closed after this long unused.
        allow_private: allow loopback/private hosts (``tools.browser_allow_private``); otherwise
            every request the page makes to such a host is refused, redirects and scripts included.
        guard: the address policy (default ``NetGuard(allow_private=allow_private)``).
        timeout_s: Playwright's per-action timeout.
        max_chars: page text returned per call (the executor caps again centrally).
    """

    def __init__(self, bridge: AsyncBridge, *, executable_path: str = "/usr/bin/chromium", idle_s: float = 600.0,
                 allow_private: bool = False, guard: NetGuard | None = None, timeout_s: float = 30.0,
                 max_chars: int = 12000) -> None:
        self._bridge = bridge
        self._executable = executable_path
        self._idle_s = idle_s
        self._guard = guard or NetGuard(allow_private=allow_private)
        self._proxy = GuardProxy(self._guard)  # the browser's own traffic; each context has its own
        self._timeout_s = timeout_s
        self._max_chars = max_chars
        self._playwright: Any = None
        self._browser: Any = None
        self._sessions: dict[str, _Session] = {}
        self._reaper: asyncio.Task[None] | None = None
        self._start_lock: asyncio.Lock | None = None
        self.launches = 0

    # -- lifecycle (bridge loop) -------------------------------------------------------------
    async def _ensure_browser(self) -> Any:
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if self._browser is None or not self._browser.is_connected():
                from playwright.async_api import async_playwright

                if self._playwright is None:
                    self._playwright = await async_playwright().start()
                    self._bridge.on_stop(self.close)
                # Playwright adds "<-loopback>" to the bypass list: loopback goes through the proxy too.
                self._browser = await self._playwright.chromium.launch(
                    executable_path=self._executable, args=LAUNCH_ARGS, headless=True,
                    proxy={"server": await self._proxy.start()})
                for stale in self._sessions.values():  # their contexts died with the old browser
                    await stale.proxy.close()
                self._sessions.clear()
                self.launches += 1
                log.info("browser started (%s)", self._executable)
            if self._reaper is None or self._reaper.done():
                self._reaper = asyncio.create_task(self._reap(), name="browser-reaper")
        return self._browser

    async def _session(self, session_id: str) -> _Session:
        browser = await self._ensure_browser()
        session = self._sessions.get(session_id)
        if session is None:
            proxy = GuardProxy(self._guard)
            context = await browser.new_context(proxy={"server": await proxy.start()})
            context.set_default_timeout(self._timeout_s * 1000)
            session = _Session(context, await context.new_page(), proxy)
            self._sessions[session_id] = session
        session.last_used = time.monotonic()
        return session

    async def _reap(self) -> None:
        while True:
            await asyncio.sleep(max(0.05, min(self._idle_s / 4, 30.0)))
            await self.close_idle()

    async def close_idle(self, now: float | None = None) -> int:
        """Closes contexts unused for ``idle_s``; returns how many were closed."""
        now = time.monotonic() if now is None else now
        idle = [sid for sid, s in self._sessions.items() if now - s.last_used >= self._idle_s and not s.lock.locked()]
        for sid in idle:
            session = self._sessions.pop(sid)
            with contextlib.suppress(Exception):
                await session.context.close()
            await session.proxy.close()
        if idle:
            log.info("closed %d idle browser context(s)", len(idle))
        return len(idle)

    @property
    def open_sessions(self) -> int:
        return len(self._sessions)

    async def close(self) -> None:
        """Closes every context, the browser and Playwright (registered with ``AsyncBridge.stop``)."""
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(BaseException):
                await self._reaper
            self._reaper = None
        for session in self._sessions.values():
            with contextlib.suppress(Exception):
                await session.context.close()
            await session.proxy.close()
        self._sessions.clear()
        if self._browser is not None:
            with contextlib.suppress(Exception):
                await self._browser.close()
            self._browser = None
        if self._playwright is not None:
            with contextlib.suppress(Exception):
                await self._playwright.stop()
            self._playwright = None
        await self._proxy.close()

    # -- tools (bridge loop) -------------------------------------------------------------------
    @staticmethod
    def _refused_since(session: _Session, mark: int) -> str:
        """A note naming the requests the session's proxy refused since ``mark``."""
        refused = session.proxy.refusals_since(mark)
        if not refused:
            return ""
        shown = "; ".join(dict.fromkeys(refused))
        return f"\n[{len(refused)} request(s) of this page were refused: {shown[:600]}]"

    async def _describe(self, page: Any) -> str:
        title = await page.title()
        try:
            text = await page.inner_text("body")
        except Exception:
            text = ""
        lines = [" ".join(line.split()) for line in text.splitlines()]
        body = "\n".join(line for line in lines if line)
        truncated = len(body) > self._max_chars
        return (f"URL: {page.url}\nTitle: {title}\n\n{body[: self._max_chars]}"
                + ("\n[truncated]" if truncated else ""))

    async def open(self, ctx: RunContext, url: str) -> str:
        """Opens ``url`` in the session's page; returns its URL, title and visible text.

        Raises:
            BlockedAddress: ``url`` (or the page it redirects to) is refused by the guard.
        """
        try:
            self._guard.check_url(url)
        except BlockedAddress as exc:
            if exc.address is None:
                return "Error: only absolute http:// or https:// URLs can be opened."
            raise
        session = await self._session(ctx.session_id or "default")
        async with session.lock:
            mark = session.proxy.refusal_count
            try:
                response = await session.page.goto(url, wait_until="load")
            except Exception as exc:
                refused = session.proxy.refusals_since(mark)
                if refused:  # the navigation itself (or a redirect hop) was refused
                    raise PermissionError(refused[-1]) from exc
                raise
            status = f"Status: {response.status}\n" if response is not None else ""
            return status + await self._describe(session.page) + self._refused_since(session, mark)

    async def click(self, ctx: RunContext, selector: str) -> str:
        """Clicks the element matching ``selector``; returns the page after it settled."""
        session = await self._session(ctx.session_id or "default")
        async with session.lock:
            mark = session.proxy.refusal_count
            await session.page.click(selector)
            with contextlib.suppress(Exception):
                await session.page.wait_for_load_state("load", timeout=min(5000, self._timeout_s * 1000))
            return await self._describe(session.page) + self._refused_since(session, mark)

    async def fill(self, ctx: RunContext, selector: str, text: str) -> str:
        """Types ``text`` into the input matching ``selector`` (replacing its value)."""
        session = await self._session(ctx.session_id or "default")
        async with session.lock:
            await session.page.fill(selector, text)
            return f"Filled {selector}."

    async def text(self, ctx: RunContext) -> str:
        """The current page's URL, title and visible text."""
        session = await self._session(ctx.session_id or "default")
        async with session.lock:
            return await self._describe(session.page)

    def tools(self) -> list[Tool]:
        """``browser_open``, ``browser_click``, ``browser_fill``, ``browser_text``."""
        timeout = self._timeout_s + 5
        common: dict[str, Any] = {"is_async": True, "timeout_s": timeout, "takes_context": True, "retries": 0}
        selector = {"type": "string", "description": "A CSS selector (Playwright syntax), e.g. '#login button'."}
        return [
            Tool("browser_open", "Open a URL in your browser (logins and cookies persist across the conversation) "
                 "and return the page's visible text. Use it for pages that need a login, forms or JavaScript; "
                 "for plain pages prefer web_fetch.",
                 {"type": "object", "properties": {"url": {"type": "string", "description": "Absolute http(s) URL."}},
                  "required": ["url"], "additionalProperties": False},
                 fn=self.open, side_effect="read", **common),
            Tool("browser_click", "Click an element on the current browser page; returns the page afterwards.",
                 {"type": "object", "properties": {"selector": selector}, "required": ["selector"],
                  "additionalProperties": False},
                 fn=self.click, side_effect="write", **common),
            Tool("browser_fill", "Type text into an input field on the current browser page (replaces its value).",
                 {"type": "object", "properties": {"selector": selector, "text": {"type": "string"}},
                  "required": ["selector", "text"], "additionalProperties": False},
                 fn=self.fill, side_effect="write", **common),
            Tool("browser_text", "Return the current browser page's URL, title and visible text.",
                 {"type": "object", "properties": {}, "additionalProperties": False},
                 fn=self.text, side_effect="none", idempotent=True, **common),
        ]
