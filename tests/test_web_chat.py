"""The web chat (platform ``web``) end to end: the real gateway with its aiohttp server, the fake
model on loopback, and an HTTP client standing in for the page (the real browser is in
tests/test_web_browser.py). Messages go through the inbox, bus and agent; replies come back on the
page's event stream; a web user linked to Telegram sees the Telegram turns."""

from __future__ import annotations

import logging
import re

from yarl import URL

from adapters.web.inbound import WebInputError, message_from_post
from tests.conftest import gateway_config, start_gateway
from tests.fakes import openai as oa
from tests.helpers import wait_until
from tests.test_sessions_e2e import tg_command, tg_texts
from tests.test_telegram_e2e import dm_update
from tests.web_client import WebClient

STREAM_FAST = {"stream_first_after_s": 0.2, "stream_edit_interval_s": {"web": 0.2, "telegram": 0.3}}
LONG = "Here is the **answer**: " + " ".join(f"step {i} done." for i in range(30))


def base_of(gateway) -> str:
    return f"http://127.0.0.1:{gateway.http_port}"


def test_a_post_becomes_a_dm_from_the_browser_user_and_commands_are_parsed():
    message = message_from_post({"id": "a1b2c3d4e5", "text": "  /link  ABC123 ", "name": "  Ann \n Lee "}, "u1")
    assert (message.platform, message.address.chat_id, message.chat_type) == ("web", "u1", "dm")
    assert (message.command, message.text, message.sender.display_name) == ("link", "ABC123", "Ann Lee")
    assert message.message_id == "u1:a1b2c3d4e5"  # scoped by the user: the inbox dedupes per platform
    plain = message_from_post({"id": "a1b2c3d4e6", "text": "hi /there"}, "u1")
    assert (plain.command, plain.text, plain.sender.display_name) == (None, "hi /there", "Web user")
    for body, error in [([], "JSON object"), ({"id": "x", "text": "hi"}, "id must be"),
                        ({"id": "a1b2c3d4e5", "text": "  "}, "empty"), ({"id": "a1b2c3d4e5"}, "empty"),
                        ({"id": "a1b2c3d4e5", "text": 123}, "text must be a string, not int"),
                        ({"id": "a1b2c3d4e5", "text": "x" * 16_001}, "too long"),
                        ({"id": "a1b2c3d4e5", "text": "hi", "name": 5}, "name must be")]:
        try:
            message_from_post(body, "u1")
        except WebInputError as exc:
            assert error in str(exc)
        else:
            raise AssertionError(f"{body!r} was accepted")


async def test_the_reply_streams_to_the_page_then_settles_into_the_transcript(tmp_path, fake_openai, running):
    fake_openai.reset()
    fake_openai.script(oa.text(LONG, pieces=10, piece_delay_s=0.15))
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, agent=STREAM_FAST), running)
    page = WebClient(base_of(gateway))
    try:
        html = await page.open()
        assert 'name="viewport"' in html and "/web/chat.js" in html
        assert '<link rel="icon" href="/web/icon.svg"' in html
        for path in ("/web/icon.svg", "/favicon.ico"):  # the page's icon; browsers' default request
            async with page.http.get(base_of(gateway) + path) as response:
                assert response.status == 200 and response.content_type == "image/svg+xml"
                assert (await response.text()).startswith("<svg")
        page.listen()
        response = await page.say("explain it please", message_id="msg-0001")
        assert response.status == 200
        await wait_until(lambda: page.of("row", lambda e: e["role"] == "assistant"), timeout=20, what="answer row")

        user_row = page.of("row", lambda e: e["role"] == "user")[0]
        assert (user_row["text"], user_row["message_id"], user_row["platform"]) == ("explain it please", "msg-0001",
                                                                                    "web")
        answer = page.of("row", lambda e: e["role"] == "assistant")[0]
        assert "<strong>answer</strong>" in answer["html"] and answer["platform"] == "web"
        assert page.of("typing"), "no typing indicator while the turn ran"
        first = page.of("reply")[0]  # the streamed preview, then edits of it, then it settles
        assert first["text"].endswith(" …") and len(first["text"]) < len(LONG)
        assert page.of("preview", lambda e: e["id"] == first["id"])
        await wait_until(lambda: page.of("settled", lambda e: e["id"] == first["id"]), what="preview settled")
        # Nothing was sent twice: the final text is not left on the page as a second reply.
        assert not page.of("reply", lambda e: e["text"] == LONG)
    finally:
        await page.close()


async def test_bad_posts_get_clear_errors_and_a_retry_is_not_a_second_message(tmp_path, fake_openai, running):
    fake_openai.reset()
    fake_openai.script(oa.text("only once"))
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai), running)
    base = base_of(gateway)
    page = WebClient(base)
    try:
        async with page.http.post(f"{base}/web/messages", json={"id": "abcdefgh", "text": "hi"}) as response:
            assert response.status == 403  # no X-Requested-With: not from the page (cross-site form)
        async with page.http.post(f"{base}/web/messages", json={"id": "abcdefgh", "text": "hi"},
                                  headers={"X-Requested-With": "gateway-web"}) as response:
            assert response.status == 401 and "reload the page" in (await response.json())["error"]
        await page.open()
        async with page.http.post(f"{base}/web/messages", data=b"{not json",
                                  headers={"X-Requested-With": "gateway-web",
                                           "Content-Type": "application/json"}) as response:
            assert response.status == 400 and "not JSON" in (await response.json())["error"]
        async with page.http.post(f"{base}/web/messages", data=b'{"id": "abcdefgh", "text": "hi"}',
                                  headers={"X-Requested-With": "gateway-web",
                                           "Content-Type": "text/plain"}) as response:
            assert response.status == 415 and "application/json" in (await response.json())["error"]
        async with page.http.post(f"{base}/web/messages", data=b'{"id": "abcdefgh", "text": "hi"}',
                                  headers={"X-Requested-With": "gateway-web",
                                           "Content-Type": "application/json; charset=nosuch"}) as response:
            assert response.status == 400 and "unknown charset 'nosuch'" in (await response.json())["error"]
        assert (await page.say("   ")).status == 400
        first = await page.say("hello", message_id="retry-0001")
        again = await page.say("hello", message_id="retry-0001")  # the page's retry after a lost answer
        assert first.status == again.status == 200
        await wait_until(lambda: gateway.delivery.sent == 1, what="reply")
        assert len(fake_openai.requests) == 1 and gateway.duplicates == 1
    finally:
        await page.close()


async def test_without_a_model_key_start_up_warns_once_and_the_reply_says_what_to_set(
        tmp_path, fake_openai, running, caplog, monkeypatch):
    monkeypatch.delenv("GATEWAY_TEST_UNSET_KEY", raising=False)
    fake_openai.reset()
    fake_openai.script(oa.text("never sent: the fake refuses the placeholder key"))
    config = gateway_config(tmp_path, fake_openai, llm={"api_key_env": "GATEWAY_TEST_UNSET_KEY"})
    with caplog.at_level(logging.WARNING):
        gateway = await start_gateway(config, running)
    warnings = [r for r in caplog.records if "GATEWAY_TEST_UNSET_KEY" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
    assert warnings[0].getMessage().startswith("GATEWAY_TEST_UNSET_KEY is not set")
    page = WebClient(base_of(gateway))
    try:
        await page.open()
        page.listen()
        assert (await page.say("hello")).status == 200
        await wait_until(lambda: page.of("reply"), timeout=20, what="the reply")
        assert page.of("reply")[0]["text"] == (
            "⚠️ The model rejected the gateway's credentials. No model API key is set: put it in the "
            "environment variable GATEWAY_TEST_UNSET_KEY (llm.api_key_env) and restart the gateway.")
        assert [r["status"] for r in fake_openai.requests] == [401] and fake_openai.pending == 1
    finally:
        await page.close()
    assert len([r for r in caplog.records if "is not set" in r.getMessage()]) == 1  # once, not per turn


async def test_model_html_and_an_html_name_reach_the_page_escaped(tmp_path, fake_openai, running):
    fake_openai.reset()
    evil = 'Done <script>window.pwned=1</script> <img src=x onerror="window.pwned=1"> [x](javascript:alert(1))'
    fake_openai.script(oa.text(evil))
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai), running)
    page = WebClient(base_of(gateway))
    try:
        await page.open()
        page.listen()
        await page.say("<b>hi</b> <script>alert(1)</script>", name="<img src=x onerror=alert(1)>")
        await wait_until(lambda: len(page.of("row")) == 2, what="both rows")
        user, answer = page.of("row")
        assert user["html"] == "&lt;b&gt;hi&lt;/b&gt; &lt;script&gt;alert(1)&lt;/script&gt;"
        assert "<script" not in answer["html"] and "<img" not in answer["html"] and "javascript:" not in \
            re.sub(r"\[x\]\(javascript:alert\(1\)\)", "", answer["html"])
        assert "&lt;script&gt;window.pwned=1&lt;/script&gt;" in answer["html"]
        assert "href" not in answer["html"]  # the javascript: link is refused, left as text
    finally:
        await page.close()


async def test_a_web_user_linked_to_telegram_sees_the_telegram_turn(tmp_path, fake_telegram, fake_openai, running):
    fake_openai.reset()
    fake_openai.responder = lambda request: oa.text(f"echo: {request['messages'][-1]['content'][-30:]}")
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram), running)
    page = WebClient(base_of(gateway))
    alice_tg = 5556001
    try:
        await page.open()
        page.listen()
        await page.say("hello from the browser")
        await wait_until(lambda: page.of("row", lambda e: e["role"] == "assistant"), what="web answer")
        session = page.of("row")[0]["session"]

        # /link from the page gives a code; /link CODE from Telegram joins the Telegram account.
        assert (await page.say("/link")).status == 200
        await wait_until(page.link_code, what="link code on the page")
        fake_telegram.inject(tg_command(f"/link {page.link_code()}", 9901, alice_tg))
        await wait_until(lambda: len(tg_texts(fake_telegram, alice_tg)) == 1, what="linked on telegram")
        assert tg_texts(fake_telegram, alice_tg)[0].startswith("Linked.")

        # A Telegram turn of the linked account lands in the same conversation, shown on the page.
        fake_telegram.inject(dm_update("and hello from telegram", 9902, user_id=alice_tg))
        await wait_until(lambda: page.of("row", lambda e: e["text"] == "and hello from telegram"),
                         timeout=15, what="telegram turn on the page")
        from_tg = page.of("row", lambda e: e["text"] == "and hello from telegram")[0]
        assert from_tg["platform"] == "telegram" and from_tg["session"] == session
        await wait_until(lambda: page.of("row", lambda e: e["role"] == "assistant" and e["platform"] == "telegram"),
                         what="telegram answer on the page")
        assert len(tg_texts(fake_telegram, alice_tg)) == 2  # the answer went to Telegram, where it was asked
        # The model saw one conversation: the browser turn is in the Telegram turn's context.
        assert "hello from the browser" in str(fake_openai.requests[-1]["json"]["messages"])
    finally:
        fake_openai.responder = None
        await page.close()


async def test_new_conversation_resets_the_page_and_a_reload_shows_the_current_one(tmp_path, fake_openai, running):
    fake_openai.reset()
    fake_openai.responder = lambda request: oa.text("noted")
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai), running)
    page = WebClient(base_of(gateway))
    try:
        await page.open()
        page.listen()
        await page.say("first conversation")
        await wait_until(lambda: page.of("row", lambda e: e["role"] == "assistant"), what="first answer")
        old = page.of("row")[0]["session"]
        await page.say("/new")
        await wait_until(lambda: page.of("reply", lambda e: e["text"].startswith("Started a new conversation")),
                         what="/new answered")
        await page.say("second conversation")
        await wait_until(lambda: page.of("reset"), what="page reset")
        await wait_until(lambda: page.of("row", lambda e: e["text"] == "second conversation"), what="new row")
        assert page.of("reset")[0]["session"] not in (None, old)

        reloaded = WebClient(base_of(gateway))  # the same browser (cookie) opening the page again
        reloaded.http.cookie_jar.update_cookies(page.http.cookie_jar.filter_cookies(URL(page.base)))
        reloaded.listen()
        await wait_until(lambda: len(reloaded.of("row")) == 2, what="history on reload")
        assert [e["text"] for e in reloaded.of("row")] == ["second conversation", "noted"]
        await reloaded.close()
    finally:
        fake_openai.responder = None
        await page.close()


async def test_the_identity_cookie_is_lax_and_a_valid_one_is_never_replaced(tmp_path, fake_openai, running):
    import aiohttp

    gateway = await start_gateway(gateway_config(tmp_path, fake_openai), running)
    base = base_of(gateway)
    async with aiohttp.ClientSession() as http:  # no cookie jar: each request says what it carries
        async with http.get(f"{base}/") as response:
            set_cookie = response.headers.getall("Set-Cookie")
        assert len(set_cookie) == 1 and set_cookie[0].startswith("gw_web=")
        assert "SameSite=Lax" in set_cookie[0] and "HttpOnly" in set_cookie[0]
        cookie = set_cookie[0].split(";")[0]
        async with http.get(f"{base}/", headers={"Cookie": cookie}) as response:
            assert response.status == 200 and "Set-Cookie" not in response.headers  # kept, not replaced
        async with http.get(f"{base}/", headers={"Cookie": "gw_web=forged.value"}) as response:
            assert response.headers["Set-Cookie"].startswith("gw_web=")  # a bad one is replaced


async def test_two_browsers_with_the_same_client_message_id_are_both_answered(tmp_path, fake_openai, running):
    fake_openai.reset()
    fake_openai.responder = lambda request: oa.text(f"echo: {request['messages'][-1]['content']}")
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai), running)
    ann, bob = WebClient(base_of(gateway)), WebClient(base_of(gateway))
    try:
        for page, text in ((ann, "from ann"), (bob, "from bob")):
            await page.open()
            page.listen()
            assert (await page.say(text, message_id="same-id-0001")).status == 200
        for page, text in ((ann, "from ann"), (bob, "from bob")):
            await wait_until(lambda page=page: page.of("row", lambda e: e["role"] == "assistant"), what="answer")
            mine = page.of("row", lambda e: e["role"] == "user")
            assert [(row["text"], row["message_id"]) for row in mine] == [(text, "same-id-0001")]  # the page's id
            assert page.of("row", lambda e: e["role"] == "assistant")[0]["text"].endswith(text)
        assert gateway.duplicates == 0 and len(fake_openai.requests) == 2
    finally:
        await ann.close()
        await bob.close()


async def test_wrong_link_codes_are_limited_per_user(tmp_path, fake_openai, running):
    """Five wrong ``/link CODE`` guesses in 15 minutes, then even the right code is refused (the
    guesses are counted in the database, for every platform and every instance)."""
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai), running)
    owner, guesser = WebClient(base_of(gateway)), WebClient(base_of(gateway))
    try:
        for page in (owner, guesser):
            await page.open()
            page.listen()
        await owner.say("/link")
        await wait_until(owner.link_code, what="link code")
        wrong = "ZZZZZ2" if owner.link_code() != "ZZZZZ2" else "ZZZZZ3"
        for attempt in range(1, 6):
            await guesser.say(f"/link {wrong}")
            await wait_until(lambda attempt=attempt: len(guesser.of("reply")) == attempt, what=f"answer {attempt}")
        assert all("not valid" in e["text"] for e in guesser.of("reply"))
        await guesser.say(f"/link {owner.link_code()}")  # the right code, after five wrong ones
        await wait_until(lambda: len(guesser.of("reply")) == 6, what="refusal")
        assert guesser.of("reply")[-1]["text"] == "Too many wrong codes; try again in 15 minutes."
        await owner.say("/link ZZZZZ4")  # another user is not held back by them
        await wait_until(lambda: len(owner.of("reply")) == 2, what="owner's answer")
        assert "not valid" in owner.of("reply")[-1]["text"]
    finally:
        await owner.close()
        await guesser.close()


async def test_one_web_user_holds_at_most_eight_event_streams(tmp_path, fake_openai, running):
    import asyncio

    gateway = await start_gateway(gateway_config(tmp_path, fake_openai), running)
    base = base_of(gateway)
    page, other = WebClient(base), WebClient(base)
    streams = []
    try:
        await page.open()
        await other.open()
        opened = await asyncio.gather(*(page.http.get(f"{base}/web/events?after=0") for _ in range(12)))
        streams = [r for r in opened if r.status == 200]
        refused = [r for r in opened if r.status != 200]
        assert len(streams) == 8 and {r.status for r in refused} == {429}
        assert "at most 8" in (await refused[0].json())["error"]
        async with other.http.get(f"{base}/web/events?after=0") as response:
            assert response.status == 200  # another web user is not held back

        streams.pop().close()  # a tab closes: its place is free again
        statuses: list[int] = []

        async def open_one() -> None:
            while not statuses or statuses[-1] != 200:
                async with page.http.get(f"{base}/web/events?after=0") as response:
                    statuses.append(response.status)
                await asyncio.sleep(0.05)
        opener = asyncio.create_task(open_one())
        await wait_until(lambda: statuses and statuses[-1] == 200, what="a stream after one closed")
        await opener
    finally:
        for response in streams:
            response.close()
        await page.close()
        await other.close()
