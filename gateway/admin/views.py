"""The admin pages under ``/admin``: sessions, transcripts, users, jobs, approvals, usage (cost per day
and turns per platform as SVG charts, ``gateway.admin.charts``), adapters' health.

Server-rendered (Jinja2, autoescaped: names, messages and tool output show as text). Read-mostly;
the few changes go through the same code as the chat commands: ``/approve`` and ``/deny``
(``gateway.tools.approvals.decide_reply``), ``/run`` (``PushService.fire_soon``), and pausing a job
(``JobStore.set_enabled`` + ``PushService.job_changed``, as ``/unschedule`` reloads). Every page
needs a login, every POST a CSRF token (``gateway.admin.auth``). With no admin password
configured, ``/admin`` answers 404 and says how to turn it on.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

from aiohttp import web
from aiohttp.web_request import FileField
from jinja2 import Environment, FileSystemLoader, select_autoescape
from multidict import MultiDictProxy

from agent.model import Usage
from gateway.admin.auth import CSRF_FIELD, AdminAuth, cookie
from gateway.admin.charts import bar_chart, stacked_chart
from gateway.admin.limits import LoginLimiter
from gateway.admin.queries import AdminQueries
from gateway.admin.sessions import AdminSessions
from gateway.core.clients import client_address
from gateway.ops.usage_limits import usd
from gateway.scheduler.planner import format_address, job_schedule, local_time, next_fire_of
from gateway.tools.approvals import decide_reply

if TYPE_CHECKING:
    from gateway.app.gateway import Gateway

log = logging.getLogger("gateway.admin")

TEMPLATES = Path(__file__).with_name("templates")
FLASH_COOKIE = "gw_admin_flash"
CHECK_TIMEOUT_S = 5.0
CHART_DAYS = 30
"""Days the usage charts show (today and the 29 before)."""
DECIDED_BY = "web-admin"
CSP = ("default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; "
       "base-uri 'none'")
OFF_TEXT = ("The admin pages are off: no admin password is configured. Set the environment variable "
            "{env} (named by web.admin_password_env) and restart the gateway.")

Page = Callable[[web.Request], Awaitable[tuple[str, dict[str, Any]]]]
Action = Callable[[web.Request, Any], Awaitable[tuple[str, str]]]


def admin_routes(gateway: Gateway) -> list[web.RouteDef]:
    """The ``/admin`` routes for ``gateway``: the pages, or a 404 that says they are off."""
    web_config = gateway.config.web
    auth = AdminAuth(gateway.config.secret(web_config.admin_password_env), gateway.config.web_secret(),
                     web_config.admin_session_hours * 3600, web_config.cookie_secure)
    if not auth.enabled:
        text = OFF_TEXT.format(env=web_config.admin_password_env)

        async def off(_: web.Request) -> web.Response:
            return web.Response(status=404, text=text)

        return [web.get("/admin", off), web.get("/admin/{tail:.*}", off)]
    return AdminSite(gateway, auth).routes()


def _when(epoch: float | None) -> str:
    return "-" if epoch is None else datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


class AdminSite:
    """Handlers of the admin pages for one gateway."""

    def __init__(self, gateway: Gateway, auth: AdminAuth) -> None:
        self.gateway = gateway
        self.auth = auth
        self.queries = AdminQueries(gateway.engine)
        self.sessions = AdminSessions(gateway.engine)
        self.limiter = LoginLimiter()
        self.env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(["html"]),
                               trim_blocks=True, lstrip_blocks=True)
        self.env.filters["when"] = _when
        self.price = gateway.config.agent.limits().price_of(gateway.config.llm.model)

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/admin", self._index), web.get("/admin/", self._index),
            web.get("/admin/static/admin.css", self._css),
            web.get("/admin/login", self._login_form), web.post("/admin/login", self._login),
            web.post("/admin/logout", self._action(self._logout)),
            web.get("/admin/sessions", self._page(self._sessions)),
            web.get("/admin/sessions/{session_id}", self._page(self._session)),
            web.get("/admin/users", self._page(self._users)),
            web.get("/admin/jobs", self._page(self._jobs)),
            web.post("/admin/jobs/{job_id}/{op:pause|resume|run}", self._action(self._job_action)),
            web.get("/admin/approvals", self._page(self._approvals)),
            web.post("/admin/approvals/{approval_id}/{op:approve|deny}", self._action(self._approval_action)),
            web.get("/admin/usage", self._page(self._usage)),
            web.get("/admin/health", self._page(self._health)),
            web.get("/admin/files/{sha256}", self._thumbnail),
        ]

    # -- plumbing --------------------------------------------------------------------------------
    def _render(self, request: web.Request, template: str, status: int = 200, **context: Any) -> web.Response:
        response = web.Response(status=status, content_type="text/html", charset="utf-8",
                                headers={"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
                                         "Referrer-Policy": "no-referrer", "Cache-Control": "no-store"})
        nonce = self.auth.nonce(request, response)
        flash = unquote(cookie(request, FLASH_COOKIE) or "")
        if FLASH_COOKIE in request.cookies:
            response.del_cookie(FLASH_COOKIE, path="/admin")
        response.text = self.env.get_template(template).render(
            csrf_field=CSRF_FIELD, csrf=self.auth.csrf_for(request, nonce), flash=flash, path=request.path, **context)
        return response

    def _page(self, handler: Page) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        @functools.wraps(handler)
        async def page(request: web.Request) -> web.StreamResponse:
            if not await self._logged_in(request):
                raise web.HTTPFound("/admin/login?next=" + quote(request.path_qs, safe=""))
            template, context = await handler(request)
            return self._render(request, template, **context)
        return page

    def _action(self, handler: Action) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        @functools.wraps(handler)
        async def action(request: web.Request) -> web.StreamResponse:
            form = await _read_form(request)
            if not await self._logged_in(request):
                return web.Response(status=403, text="Not logged in: open /admin/login first.")
            if not self.auth.csrf_ok(request, form.get(CSRF_FIELD)):
                return web.Response(status=403, text="CSRF token missing or wrong: reload the page and try again.")
            target, flash = await handler(request, form)
            response = web.HTTPFound(target)
            if flash:
                response.set_cookie(FLASH_COOKIE, quote(flash), httponly=True, samesite="Strict",
                                    secure=self.auth.secure, path="/admin")
            raise response
        return action

    async def _logged_in(self, request: web.Request) -> bool:
        session_id = self.auth.session_id(request)
        return session_id is not None and await self.gateway.run_db(self.sessions.active, session_id)

    async def _css(self, _: web.Request) -> web.Response:
        return web.Response(body=(TEMPLATES / "admin.css").read_bytes(), content_type="text/css", charset="utf-8")

    async def _index(self, _: web.Request) -> web.Response:
        raise web.HTTPFound("/admin/sessions")

    # -- login -----------------------------------------------------------------------------------
    async def _login_form(self, request: web.Request) -> web.Response:
        return self._render(request, "login.html", bare=True, next=_safe_next(request.query.get("next")),
                            error=None)

    async def _login(self, request: web.Request) -> web.StreamResponse:
        form = await _read_form(request)
        if not self.auth.csrf_ok(request, form.get(CSRF_FIELD)):
            return web.Response(status=403, text="CSRF token missing or wrong: reload the page and try again.")
        target = _safe_next(str(form.get("next", "")))
        client = client_address(request, self.gateway.config.http.proxies())
        wait_s = self.limiter.retry_after(client)
        if wait_s is not None:
            return web.Response(status=429, headers={"Retry-After": str(wait_s)},
                                text=f"Too many wrong passwords; try again in {wait_s} seconds.")
        if not self.auth.password_ok(str(form.get("password", ""))):
            failures = self.limiter.failed(client)
            log.warning("admin login failed from %s (%d failure(s) from it in %.0f s)", client, failures,
                        self.limiter.window_s)
            await asyncio.sleep(0.3)  # slows down guessing
            return self._render(request, "login.html", status=401, bare=True, next=target,
                                error="Wrong password.")
        self.limiter.succeeded(client)
        response = web.HTTPFound(target)
        self.auth.start_session(response, await self.gateway.run_db(self.sessions.create, self.auth.session_s))
        raise response

    async def _logout(self, request: web.Request, __: Any) -> tuple[str, str]:
        session_id = self.auth.session_id(request)
        if session_id is not None:
            await self.gateway.run_db(self.sessions.revoke, session_id)
        raise_response = web.HTTPFound("/admin/login")
        self.auth.end_session(raise_response)
        raise raise_response

    # -- pages -----------------------------------------------------------------------------------
    async def _sessions(self, request: web.Request) -> tuple[str, dict[str, Any]]:
        query = request.query.get("q", "")
        rows = await self.gateway.run_db(self.queries.sessions, query)
        for row in rows:
            row["cost"], row["cost_estimated"] = self._cost(row)
        return "sessions.html", {"sessions": rows, "q": query}

    async def _session(self, request: web.Request) -> tuple[str, dict[str, Any]]:
        session = await self.gateway.run_db(self.queries.session, request.match_info["session_id"])
        if session is None:
            raise web.HTTPNotFound(text="No session has that id.")
        for turn in session["turns"]:
            turn["cost"], turn["cost_estimated"] = self._cost(turn)
        return "session.html", {"session": session, "model": self.gateway.config.llm.model}

    async def _thumbnail(self, request: web.Request) -> web.StreamResponse:
        """A 256 px preview of an image blob in a transcript (logged-in admins only)."""
        if not await self._logged_in(request):
            return web.Response(status=403, text="Not logged in: open /admin/login first.")
        from gateway.core.errors import BlobMissing, MediaError

        try:
            data = await asyncio.to_thread(self.gateway.blobs.get, request.match_info["sha256"])
            small = await asyncio.to_thread(self.gateway.media_readers.thumbnail, data)
        except (BlobMissing, MediaError):
            raise web.HTTPNotFound(text="No image with that address is stored.") from None
        return web.Response(body=small.data, content_type=small.mime_type,
                            headers={"Cache-Control": "private, max-age=3600", "X-Content-Type-Options": "nosniff"})

    async def _users(self, request: web.Request) -> tuple[str, dict[str, Any]]:
        query = request.query.get("q", "")
        return "users.html", {"users": await self.gateway.run_db(self.queries.users, query), "q": query}

    async def _jobs(self, _: web.Request) -> tuple[str, dict[str, Any]]:
        jobs_store = self.gateway.jobs

        def load() -> list[dict[str, Any]]:
            rows = []
            for job in jobs_store.list_jobs():
                rows.append({"job": job, "schedule": job_schedule(job).describe(), "target": format_address(job.target),
                             "next": local_time(next_fire_of(job), job.timezone),
                             "runs": jobs_store.runs(job.id, limit=5)})
            return rows

        return "jobs.html", {"jobs": await self.gateway.run_db(load), "scheduler_on": self.gateway.pushes is not None}

    async def _approvals(self, _: web.Request) -> tuple[str, dict[str, Any]]:
        return "approvals.html", {"approvals": await self.gateway.run_db(self.queries.pending_approvals)}

    async def _usage(self, _: web.Request) -> tuple[str, dict[str, Any]]:
        limits = self.gateway.runner.usage
        if limits is None:
            raise web.HTTPNotFound(text="Usage is not recorded by this gateway.")
        ledger = limits.ledger

        def load() -> dict[str, Any]:
            days = ledger.last_days(CHART_DAYS)
            today, month = limits.report_totals()
            first, last = limits.calendar.month_days(days[-1])
            return {"days": CHART_DAYS, "zone": limits.calendar.zone_name, "today_day": days[-1],
                    "today": today, "month": month, "models": ledger.by_model(first_day=first, last_day=last),
                    "users": ledger.by_user(first_day=first, last_day=last),
                    "cost_chart": bar_chart(ledger.daily_cost(days), title="Cost per day (USD)", label=usd),
                    "turns_chart": stacked_chart(ledger.daily_turns(days), days, title="Turns per platform per day")}

        return "usage.html", {**await self.gateway.run_db(load), "usd": usd}

    async def _health(self, _: web.Request) -> tuple[str, dict[str, Any]]:
        gateway = self.gateway
        adapters = await asyncio.gather(*(self._check(adapter) for adapter in gateway.adapters.values()))
        try:
            database = {"pending": await gateway.run_db(gateway.store.count_inbox, "pending"),
                        "leases": await gateway.run_db(gateway.store.count_leases, time.time()),
                        "outbox": await gateway.run_db(gateway.store.outbox_counts), "error": None,
                        "instances": await gateway.run_db(gateway.instance.store.records), "now": time.time()}
        except Exception as exc:
            database = {"error": gateway.redact(f"{type(exc).__name__}: {exc}")[:300]}
        llm = gateway.config.llm
        routed = set(llm.routed_providers())
        routes = [{"name": name, "models": [t.name for t in llm.targets(gateway.providers, name)]}
                  for name in llm.route_names()]
        return "health.html", {"adapters": adapters, "database": database, "instance": gateway.instance_id,
                               "providers": [p for p in gateway.provider_health.snapshot()
                                             if p["provider"] in routed], "routes": routes,
                               "started": gateway.started, "received": gateway.received,
                               "duplicates": gateway.duplicates, "dropped": gateway.dropped,
                               "sent": gateway.delivery.sent}

    async def _check(self, adapter: Any) -> dict[str, Any]:
        try:
            detail = await asyncio.wait_for(adapter.check(), CHECK_TIMEOUT_S)
            ok = True
        except TimeoutError:
            ok, detail = False, f"no answer within {CHECK_TIMEOUT_S:.0f} s"
        except Exception as exc:
            ok, detail = False, f"{type(exc).__name__}: {exc}"
        return {"platform": adapter.platform, "ok": ok, "detail": self.gateway.redact(str(detail))[:300],
                "receiver_lease": getattr(adapter, "receiver_lease", None)}

    # -- actions (the chat commands' code paths) ------------------------------------------------
    async def _job_action(self, request: web.Request, _: Any) -> tuple[str, str]:
        job_id, op = request.match_info["job_id"], request.match_info["op"]
        service = self.gateway.pushes
        if service is None:
            return "/admin/jobs", "Scheduled reports are turned off on this gateway."
        job = await self.gateway.run_db(self.gateway.jobs.get_job, job_id)
        if job is None:
            return "/admin/jobs", f"No scheduled report {job_id!r}."
        if op == "run":
            service.fire_soon(job.id, time.time(), "manual")  # as /run ID
            return "/admin/jobs", f"Running {job.id} now; the report goes to {format_address(job.target)}."
        await self.gateway.run_db(self.gateway.jobs.set_enabled, job.id, op == "resume")
        service.job_changed()
        return "/admin/jobs", f"{'Resumed' if op == 'resume' else 'Paused'} {job.id}."

    async def _approval_action(self, request: web.Request, _: Any) -> tuple[str, str]:
        approval_id, op = request.match_info["approval_id"], request.match_info["op"]
        text = await self.gateway.run_db(decide_reply, self.gateway.approvals, op, approval_id, DECIDED_BY, True)
        return "/admin/approvals", text  # the same answer /approve ID and /deny ID give

    def _cost(self, row: dict[str, Any]) -> tuple[float | None, bool]:
        """``(USD, estimated)`` of a session or turn row: the cost recorded with each model call
        (the price then, cache discount included), or, where none was recorded, an estimate at
        the configured model's price (``None`` without one)."""
        if row.get("cost_usd"):
            return float(row["cost_usd"]), False
        if self.price is None:
            return None, True
        return self.price.cost(Usage(prompt_tokens=row["prompt_tokens"] or 0,
                                     completion_tokens=row["completion_tokens"] or 0,
                                     cached_tokens=row.get("cached_tokens") or 0)), True



async def _read_form(request: web.Request) -> MultiDictProxy[str | bytes | bytearray | FileField]:
    """The POST's form fields; a body that is not a readable form (bytes that are not in its
    charset, an unknown charset, a broken multipart body) is answered 400, never a 500.

    Raises:
        web.HTTPBadRequest: the body cannot be read as a form.
    """
    try:
        return await request.post()
    except (UnicodeDecodeError, LookupError, ValueError, AssertionError) as exc:
        problem = type(exc).__name__
        raise web.HTTPBadRequest(text=f"The form could not be read ({problem}): send it from the page.") from None


def _safe_next(target: str | None) -> str:
    """Where to go after login: an admin path only (never another site)."""
    if target and target.startswith("/admin") and not target.startswith("//") and "\\" not in target:
        return target
    return "/admin/sessions"
