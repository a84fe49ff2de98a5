"""The admin pages end to end: the real gateway and its aiohttp server, a web user talking to the
fake model, and an HTTP client as the operator's browser (login, session cookie, CSRF tokens)."""

from __future__ import annotations

import os
import re
import socket

import aiohttp

from tests.conftest import gateway_config, start_gateway
from tests.fakes import openai as oa
from tests.helpers import wait_until
from tests.web_client import WebClient

PASSWORD = "admin-pass-0001-secret"
os.environ["GATEWAY_TEST_ADMIN_PASSWORD"] = PASSWORD  # GATEWAY_TEST_*: the log secret scan covers it
ADMIN = {"admin_password_env": "GATEWAY_TEST_ADMIN_PASSWORD"}
HTML_NAME = "<img src=x onerror=alert(1)>"


class Operator:
    """The operator's browser: its own cookie jar; ``csrf`` is read from the last form page."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.http = aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))
        self.csrf = ""

    async def get(self, path: str) -> tuple[int, str, aiohttp.ClientResponse]:
        async with self.http.get(self.base + path, allow_redirects=False) as response:
            text = await response.text()
        if match := re.search(r'name="csrf" value="([0-9a-f]+)"', text):
            self.csrf = match.group(1)
        return response.status, text, response

    async def post(self, path: str, with_csrf: bool = True, **fields: str) -> aiohttp.ClientResponse:
        data = {**fields, **({"csrf": self.csrf} if with_csrf else {})}
        async with self.http.post(self.base + path, data=data, allow_redirects=False) as response:
            await response.read()
            return response

    async def login(self) -> None:
        await self.get("/admin/login")
        response = await self.post("/admin/login", password=PASSWORD, next="/admin/sessions")
        assert response.status == 302 and response.headers["Location"] == "/admin/sessions"


def base_of(gateway) -> str:
    return f"http://127.0.0.1:{gateway.http_port}"


async def test_without_a_password_the_admin_pages_are_off(tmp_path, fake_openai, running):
    config = gateway_config(tmp_path, fake_openai, web={"admin_password_env": "GATEWAY_TEST_NO_SUCH_PASSWORD"})
    gateway = await start_gateway(config, running)
    operator = Operator(base_of(gateway))
    try:
        for path in ("/admin", "/admin/sessions", "/admin/login"):
            status, text, _ = await operator.get(path)
            assert status == 404 and "GATEWAY_TEST_NO_SUCH_PASSWORD" in text
    finally:
        await operator.http.close()


async def test_login_transcript_with_tool_calls_escaping_and_csrf(tmp_path, fake_openai, page_server, running):
    fake_openai.reset()
    fake_openai.script(oa.tool_calls(oa.call("web_fetch", {"url": f"{page_server.url}/page"})),
                       oa.text("The codename is amber-falcon-42. <script>alert('x')</script>"))
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, web=ADMIN), running)
    base = base_of(gateway)
    page, operator = WebClient(base), Operator(base)
    try:
        await page.open()
        page.listen()
        await page.say("what is the codename on that page?", name=HTML_NAME)
        await wait_until(lambda: page.of("row", lambda e: e["role"] == "assistant"), timeout=15, what="answer")

        # Without a login: pages redirect to the login form, posts are refused.
        status, _, response = await operator.get("/admin/sessions?q=x")
        assert status == 302 and response.headers["Location"].startswith("/admin/login?next=")
        assert "q%3Dx" in response.headers["Location"]
        status, login_page, _ = await operator.get("/admin/login")
        assert status == 200 and 'name="viewport"' in login_page and operator.csrf
        assert (await operator.post("/admin/login", with_csrf=False, password=PASSWORD)).status == 403
        assert (await operator.post("/admin/login", password="wrong")).status == 401
        response = await operator.post("/admin/login", password=PASSWORD, next="https://evil.example/")
        assert response.status == 302 and response.headers["Location"] == "/admin/sessions"  # never off-site
        cookie = next(v for v in response.headers.getall("Set-Cookie") if v.startswith("gw_admin="))
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and PASSWORD not in cookie

        # Sessions: listed, found by a word of the conversation, opened with the tool call folded.
        status, sessions, _ = await operator.get("/admin/sessions")
        session_id = re.search(r'href="/admin/sessions/([0-9a-f]{32})"', sessions).group(1)
        assert status == 200 and "what is the codename on that page?" in sessions
        assert session_id in (await operator.get("/admin/sessions?q=AMBER-falcon"))[1]
        assert session_id not in (await operator.get("/admin/sessions?q=no-such-words"))[1]
        status, transcript, _ = await operator.get(f"/admin/sessions/{session_id}")
        assert status == 200
        assert re.search(r"<details class=\"call\"><summary>Tool call: web_fetch", transcript)
        assert f"{page_server.url}/page" in transcript
        assert re.search(r"<details class=\"msg tool\"><summary>Tool result: web_fetch", transcript)
        assert "amber-falcon-42" in transcript and " in / " in transcript
        assert re.search(r"out tokens · \$0\.\d{4}</small>", transcript)  # the recorded cost, not an estimate
        assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in transcript and "<script" not in transcript

        # Users: the web identity with its HTML name shown as text.
        status, users, _ = await operator.get("/admin/users")
        assert status == 200 and "web:web:" in users
        assert "&lt;img src=x onerror=alert(1)&gt;" in users and HTML_NAME not in users

        # A form post without the CSRF token is refused; with it, it acts.
        await operator.get("/admin/jobs")
        assert (await operator.post("/admin/jobs/nojob/run", with_csrf=False)).status == 403
        response = await operator.post("/admin/jobs/nojob/run")
        assert response.status == 302 and response.headers["Location"] == "/admin/jobs"
        assert "No scheduled report" in (await operator.get("/admin/jobs"))[1]

        status, health, _ = await operator.get("/admin/health")
        assert status == 200 and "web chat at /" in health and "Inbox pending 0" in health
        assert f"<tr><td><code>{gateway.instance_id}</code></td><td>{socket.gethostname()}</td><td>{os.getpid()}</td>" \
            in health  # the instances holding ids, with their heartbeats
        await operator.post("/admin/logout")
        assert (await operator.get("/admin/sessions"))[0] == 302
    finally:
        await page.close()
        await operator.http.close()


async def test_jobs_pause_and_run_now_and_approvals_through_the_chat_command_paths(
        tmp_path, fake_openai, page_server, running):
    fake_openai.reset()
    fake_openai.responder = lambda request: oa.text("weekly numbers: fine")
    config = gateway_config(tmp_path, fake_openai, web=ADMIN, approvals={"require_for": ["read"]})
    gateway = await start_gateway(config, running)
    base = base_of(gateway)
    page, operator = WebClient(base), Operator(base)
    try:
        await page.open()
        page.listen()
        await operator.login()

        # A job scheduled from the web chat into the web chat.
        await page.say('/schedule "0 9 * * 1" UTC summarise the week')
        await wait_until(lambda: page.of("reply", lambda e: "Scheduled report" in e["text"]), what="scheduled")
        job_id = re.search(r"Scheduled report `([^`]+)`", page.of("reply")[0]["text"]).group(1)
        status, jobs, _ = await operator.get("/admin/jobs")
        assert status == 200 and job_id in jobs and "active" in jobs and "summarise the week" in jobs

        assert (await operator.post(f"/admin/jobs/{job_id}/pause")).status == 302
        assert not (await gateway.run_db(gateway.jobs.get_job, job_id)).enabled
        jobs = (await operator.get("/admin/jobs"))[1]
        assert f"Paused {job_id}." in jobs and "paused" in jobs and "Resume" in jobs

        assert (await operator.post(f"/admin/jobs/{job_id}/run")).status == 302  # as /run ID
        await wait_until(lambda: page.of("reply", lambda e: "weekly numbers: fine" in e["text"]), timeout=15,
                         what="report delivered to the web chat")
        await wait_until(lambda: gateway.jobs.runs(job_id)[0].status == "sent", what="run settled")
        jobs = (await operator.get("/admin/jobs"))[1]
        assert re.search(r"<td>manual</td><td>sent</td>\s*<td><code>[0-9a-f]{32}</code>", jobs)
        assert (await operator.post(f"/admin/jobs/{job_id}/resume")).status == 302
        assert (await gateway.run_db(gateway.jobs.get_job, job_id)).enabled

        # A tool call waiting for approval is listed and approved from the admin page.
        fake_openai.responder = None
        fake_openai.script(oa.tool_calls(oa.call("web_fetch", {"url": f"{page_server.url}/page"})),
                           oa.text("fetched it"))
        await page.say("fetch the page")
        await wait_until(lambda: page.of("reply", lambda e: "Approval needed" in e["text"]), what="approval prompt")
        status, approvals, _ = await operator.get("/admin/approvals")
        approval_id = re.search(r'action="/admin/approvals/([0-9a-z]+)/approve"', approvals).group(1)
        assert status == 200 and "web_fetch" in approvals
        assert (await operator.post(f"/admin/approvals/{approval_id}/approve", with_csrf=False)).status == 403
        assert (await operator.post(f"/admin/approvals/{approval_id}/approve")).status == 302
        assert "Approved: running web_fetch." in (await operator.get("/admin/approvals"))[1]
        await wait_until(lambda: page.of("row", lambda e: e["text"] == "fetched it"), timeout=15, what="answer")
    finally:
        fake_openai.responder = None
        await page.close()
        await operator.http.close()


def _cookie(response: aiohttp.ClientResponse, name: str) -> str:
    return next(v for v in response.headers.getall("Set-Cookie") if v.startswith(name + "=")).split(";")[0]


async def test_admin_sessions_are_random_revocable_and_rotate_the_csrf_nonce(tmp_path, fake_openai, running):
    import hashlib

    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, web=ADMIN), running)
    base = base_of(gateway)
    first, second = Operator(base), Operator(base)
    try:
        cookies, nonces = [], []
        for operator in (first, second):
            _, _, form = await operator.get("/admin/login")
            nonces.append(_cookie(form, "gw_admin_nonce"))
            response = await operator.post("/admin/login", password=PASSWORD, next="/admin/sessions")
            assert response.status == 302
            cookies.append(_cookie(response, "gw_admin"))
            assert _cookie(response, "gw_admin_nonce") != nonces[-1]  # a nonce planted before login dies
        # Two logins in the same second: different cookies; nothing in them comes from the password alone.
        assert cookies[0] != cookies[1]
        unkeyed = hashlib.sha256(b"gateway-admin:" + PASSWORD.encode()).hexdigest()[:16]
        assert not any(unkeyed in cookie or PASSWORD in cookie for cookie in cookies)

        assert (await first.get("/admin/sessions"))[0] == 200  # the new nonce's token works for forms
        assert (await first.post("/admin/logout")).status == 302
        async with aiohttp.ClientSession() as replay:  # the stolen cookie after logout: revoked
            async with replay.get(base + "/admin/sessions", headers={"Cookie": cookies[0]},
                                  allow_redirects=False) as response:
                assert response.status == 302 and response.headers["Location"].startswith("/admin/login")
            async with replay.get(base + "/admin/sessions", headers={"Cookie": cookies[1]},
                                  allow_redirects=False) as response:
                assert response.status == 200  # the other login is untouched
    finally:
        await first.http.close()
        await second.http.close()


async def test_password_guessing_is_limited_per_address_and_logged(tmp_path, fake_openai, running, caplog):
    import asyncio
    import logging

    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, web=ADMIN), running)
    operator = Operator(base_of(gateway))
    try:
        await operator.get("/admin/login")
        with caplog.at_level(logging.WARNING, logger="gateway.admin"):
            answers = await asyncio.gather(*(operator.post("/admin/login", password=f"guess-{i:03d}-xyz")
                                             for i in range(40)))
        statuses = sorted(response.status for response in answers)
        assert statuses == [401] * 5 + [429] * 35
        retry_after = {int(r.headers["Retry-After"]) for r in answers if r.status == 429}
        assert retry_after and all(0 < seconds <= 300 for seconds in retry_after)
        refused = await operator.post("/admin/login", password=PASSWORD)  # even the right one, for now
        assert refused.status == 429 and "Retry-After" in refused.headers
        failed = [r.getMessage() for r in caplog.records if "admin login failed" in r.getMessage()]
        assert len(failed) == 5 and all("from 127.0.0.1" in line for line in failed)
        assert not any("guess-" in r.getMessage() for r in caplog.records)  # never the password tried
    finally:
        await operator.http.close()


def test_the_login_limiter_has_an_overall_cap_for_guessers_only_and_forgets_after_the_window():
    from gateway.admin.limits import LoginLimiter

    now = [1000.0]
    limiter = LoginLimiter(window_s=300, per_client=5, overall=12, clock=lambda: now[0], fresh=3)
    for i in range(12):  # 12 addresses, one failure each: none reaches 5, together they reach 12
        assert limiter.retry_after(f"10.0.0.{i}") is None
        limiter.failed(f"10.0.0.{i}")
        now[0] += 1
    # Past the overall cap an address that has guessed wrong waits for the oldest failure; one that
    # has not (the admin, elsewhere) gets one of the window's 3 fresh tries: guessers from many
    # addresses neither lock the admin out at once nor guess much more.
    assert limiter.retry_after("10.0.0.3") == 300 - 12
    assert limiter.retry_after("10.9.9.9") is None
    limiter.failed("10.9.9.9")
    assert limiter.retry_after("10.9.9.9") == 300 - 11  # the 12th newest failure is now the second
    assert limiter.retry_after("10.9.9.8") is None and limiter.retry_after("10.9.9.7") is None
    assert limiter.retry_after("10.9.9.6") == 300  # the fresh tries of this window are used up
    now[0] += 300
    assert limiter.retry_after("10.0.0.3") is None
    for _ in range(5):
        limiter.failed("10.0.0.1")
    assert limiter.retry_after("10.0.0.1") == 300 and limiter.retry_after("10.0.0.2") is None
    limiter.succeeded("10.0.0.1")
    assert limiter.retry_after("10.0.0.1") is None


async def test_a_logout_on_one_instance_ends_the_session_on_another_and_a_new_password_ends_all(
        tmp_path, fake_openai, running):
    """Two gateways on one database: the session cookie works on both, a logout on one is seen by
    the other (the revocation is in ``admin_sessions``); a gateway started with another password
    takes none of the old cookies."""
    first = await start_gateway(gateway_config(tmp_path, fake_openai, web=ADMIN), running)
    second = await start_gateway(gateway_config(tmp_path, fake_openai, web=ADMIN).model_copy(
        update={"instance_id": "second"}), running)  # one live process per instance id
    operator = Operator(base_of(first))
    other_login = Operator(base_of(first))
    try:
        await operator.login()
        await other_login.login()
        cookies = [_cookie_of(operator), _cookie_of(other_login)]
        async with aiohttp.ClientSession() as browser:
            async def status_on(gateway, cookie: str) -> int:
                async with browser.get(base_of(gateway) + "/admin/sessions", headers={"Cookie": cookie},
                                       allow_redirects=False) as response:
                    return response.status

            assert await status_on(second, cookies[0]) == 200
            await operator.get("/admin/sessions")
            assert (await operator.post("/admin/logout")).status == 302
            assert await status_on(second, cookies[0]) == 302  # revoked everywhere
            assert await status_on(second, cookies[1]) == 200

            os.environ["GATEWAY_TEST_ADMIN_PASSWORD_NEW"] = PASSWORD + "-changed"
            changed = await start_gateway(gateway_config(tmp_path, fake_openai, web={
                "admin_password_env": "GATEWAY_TEST_ADMIN_PASSWORD_NEW"}).model_copy(update={"instance_id": "third"}),
                running)
            assert await status_on(changed, cookies[1]) == 302  # a new password ends every session
    finally:
        os.environ.pop("GATEWAY_TEST_ADMIN_PASSWORD_NEW", None)
        await operator.http.close()
        await other_login.http.close()


def _cookie_of(operator: Operator) -> str:
    value = next(c.value for c in operator.http.cookie_jar if c.key == "gw_admin")
    return f"gw_admin={value}"


async def test_bodies_that_are_not_forms_get_400_not_a_server_error(tmp_path, fake_openai, running):
    """Bytes not in the form's charset, an unknown charset, a broken multipart body and a CSRF
    token with non-ASCII characters, before and after login: a 400 or 403, never a 500."""
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, web=ADMIN), running)
    operator = Operator(base_of(gateway))
    bad = [("application/x-www-form-urlencoded", b"\xff"),
           ("application/x-www-form-urlencoded; charset=bogus-charset", b"password=x"),
           ("multipart/form-data; boundary=x", b"garbage")]
    try:
        await operator.get("/admin/login")
        for path in ("/admin/login", "/admin/logout"):
            for content_type, body in bad:
                async with operator.http.post(base_of(gateway) + path, data=body, allow_redirects=False,
                                              headers={"Content-Type": content_type}) as response:
                    assert response.status == 400, (path, content_type, response.status)
        await operator.login()
        async with operator.http.post(base_of(gateway) + "/admin/logout", data=b"csrf=%ff&x=%ff",
                                      headers={"Content-Type": "application/x-www-form-urlencoded"},
                                      allow_redirects=False) as response:
            assert response.status == 403
        status, _, _ = await operator.get("/admin/sessions")
        assert status == 200  # still logged in: nothing happened
    finally:
        await operator.http.close()


async def test_a_csrf_token_for_a_planted_nonce_is_refused_in_a_logged_in_browser(tmp_path, fake_openai, running):
    """The token was an HMAC of the nonce cookie alone: an attacker who learned the token for a
    nonce of their choosing (any visitor of /admin/login) and planted that nonce in the admin's
    browser (a sibling subdomain, or plain HTTP) could post forms there. It now covers the
    browser's session cookie too."""
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, web=ADMIN), running)
    attacker, admin = Operator(base_of(gateway)), Operator(base_of(gateway))
    try:
        await attacker.get("/admin/login")
        planted = next(c.value for c in attacker.http.cookie_jar if c.key == "gw_admin_nonce")
        await admin.login()
        await admin.get("/admin/jobs")
        assert (await admin.post("/admin/jobs/nojob/run")).status == 302  # its own token works
        from http.cookies import SimpleCookie

        from yarl import URL

        cookie = SimpleCookie()
        cookie["gw_admin_nonce"] = planted
        cookie["gw_admin_nonce"]["path"] = "/admin"  # replaces the admin's own nonce
        admin.http.cookie_jar.update_cookies(cookie, response_url=URL(base_of(gateway) + "/admin/login"))
        assert [c.value for c in admin.http.cookie_jar if c.key == "gw_admin_nonce"] == [planted]
        admin.csrf = attacker.csrf  # the token the attacker got for the planted nonce
        assert (await admin.post("/admin/jobs/nojob/run")).status == 403
    finally:
        await attacker.http.close()
        await admin.http.close()


async def test_cookies_with_bytes_that_are_not_utf8_get_the_login_page_not_a_server_error(
        tmp_path, fake_openai, running):
    """aiohttp hands cookie bytes that are not UTF-8 over as lone surrogates; the session, nonce
    and flash cookies were encoded as they came, so any request carrying such a cookie (sent by
    anyone, or planted in the admin's browser from a sibling subdomain) got a 500 on every admin
    page until the cookies were cleared. They count as absent now."""
    from tests import raw_http

    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, web=ADMIN), running)
    operator = Operator(base_of(gateway))
    try:
        await operator.login()
        session = _cookie_of(operator).encode()
        nonce = next(c.value for c in operator.http.cookie_jar if c.key == "gw_admin_nonce").encode()
        for cookie in (b"gw_admin=\xff\xfe" + b"a" * 40, b"gw_admin_nonce=\xff\xfe" + b"a" * 30,
                       b"gw_admin_flash=\xff", session + b"; gw_admin_nonce=\xff\xfe" + b"a" * 30,
                       session + b"; gw_admin_nonce=" + nonce + b"; gw_admin_flash=\xffDone"):
            for path in ("/admin/login", "/admin/sessions"):
                status, body = await raw_http.post(gateway.http_port, path, b"", [(b"Cookie", cookie)],
                                                   method=b"GET")
                assert status in (200, 302), (cookie, path, status, body[:200])
            status, _ = await raw_http.post(gateway.http_port, "/admin/logout", b"csrf=x", [
                (b"Cookie", cookie), (b"Content-Type", b"application/x-www-form-urlencoded")])
            assert status == 403, cookie
        assert (await operator.get("/admin/sessions"))[0] == 200  # still logged in: nothing happened
    finally:
        await operator.http.close()
