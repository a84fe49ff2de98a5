"""Feishu interactive cards end to end, through the real lark-oapi against the loopback fake: a
streamed reply is one card patched in place whose last state is the answer; a plan is one card
patched in place and the reply another message; an approval card's buttons become the presser's
``/approve`` / ``/deny`` (webhook and long connection), and only the asker may decide."""

from __future__ import annotations

import json

from adapters.feishu.cards import action_to_inbound, card_parts
from gateway.delivery.streaming import PREVIEW_SUFFIX
from tests.conftest import gateway_config, start_gateway
from tests.fakes import openai as oa
from tests.fakes.feishu import card_elements, post_text
from tests.helpers import wait_until
from tests.test_approvals_e2e import write_then_report
from tests.test_feishu_e2e import P2P, url
from tests.test_skills_e2e import plan
from tests.test_streaming import FINAL

ALICE, BOB = "ou_fakealice00000000000000000000001", "ou_fakebob000000000000000000000001"
GROUP = "oc_fakegroupcards00000000000000001"
STREAM_FAST = {"stream_first_after_s": 0.2, "stream_edit_interval_s": {"feishu": 0.3}}


def created(fake, chat_id: str) -> list:
    """Successful create/reply calls that put a message into ``chat_id``."""
    ids = {m["message_id"] for m in fake.sent(chat_id)}
    return [c for c in fake.calls() if c.route in ("create", "reply") and c.code == 0 and c.message_id in ids]


def patches_of(fake, message_id: str) -> list:
    return [c for c in fake.calls("patch") if c.code == 0 and c.path.endswith("/" + message_id)]


def patches_of_any(fake, message_id: str) -> list:
    """Every PATCH of ``message_id``, accepted or refused."""
    return [c for c in fake.calls("patch") if c.path.endswith("/" + message_id)]


def settled(gateway) -> bool:
    rows = gateway.store.outbox_rows()
    return bool(rows) and all(r["status"] == "sent" for r in rows)


async def test_streamed_reply_is_one_card_patched_in_place_and_ends_as_the_answer(tmp_path, fake_feishu, fake_openai,
                                                                                   running):
    fake_feishu.reset()
    fake_openai.reset()
    fake_openai.script(oa.text(FINAL, pieces=10, piece_delay_s=0.15))
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_feishu=fake_feishu, agent=STREAM_FAST),
                                  running)
    status, _ = await fake_feishu.post_event(url(gateway), fake_feishu.text_event("stream it"))
    assert status == 200
    await wait_until(lambda: [post_text(m["content"]) for m in fake_feishu.sent(P2P)] == [FINAL],
                     what="the preview card patched into the answer")
    await wait_until(lambda: settled(gateway), what="outbox settled")

    [create] = created(fake_feishu, P2P)  # one message: the preview, never a second copy of the answer
    assert create.body["msg_type"] == "interactive" and create.content["config"]["update_multi"] is True
    assert post_text(create.content).endswith(PREVIEW_SUFFIX)
    [message] = fake_feishu.sent(P2P)
    patches = patches_of(fake_feishu, message["message_id"])
    assert len(patches) >= 2  # preview edits, then the final state
    assert [el["tag"] for el in card_elements(message["content"])] == ["markdown"]  # the answer keeps its markdown
    assert [r["preview_id"] for r in gateway.store.outbox_rows()] == [message["message_id"]]


async def test_a_streamed_answer_feishu_refuses_as_a_card_still_ends_as_the_answer(tmp_path, fake_feishu,
                                                                                      fake_openai, running):
    """Feishu refuses card markdown with more than five tables (230099, ErrCode 11310 "card table
    number over limit"). The last patch of a streamed answer comparing six things used to fail for
    good, leaving the preview (cut, with its " …") as all the user saw: now the card gets the whole
    answer as plain text, in place, once."""
    fake_feishu.reset()
    fake_openai.reset()
    answer = "Comparison:\n\n" + "\n\n".join(f"| item {i} | value |\n|---|---|\n| a{i} | {i} |" for i in range(6))
    fake_openai.script(oa.text(answer, pieces=8, piece_delay_s=0.15))
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_feishu=fake_feishu, agent=STREAM_FAST),
                                  running)
    status, _ = await fake_feishu.post_event(url(gateway), fake_feishu.text_event("compare them"))
    assert status == 200
    await wait_until(lambda: bool(gateway.store.outbox_rows())
                     and all(r["status"] in ("sent", "failed") for r in gateway.store.outbox_rows()),
                     what="outbox settled")
    assert [r["status"] for r in gateway.store.outbox_rows()] == ["sent"]
    [message] = fake_feishu.sent(P2P)  # one message: the preview card, patched into the answer
    assert post_text(message["content"]) == answer
    assert [el["tag"] for el in card_elements(message["content"])] == ["div"]
    refused = [c for c in patches_of_any(fake_feishu, message["message_id"]) if c.code == 230099]
    assert len(refused) == 1


async def test_a_long_streamed_code_answer_fits_its_cards_and_each_shows_code(tmp_path, fake_feishu, fake_openai,
                                                                              running):
    """A streamed answer ends as cards of ≤ 30 KB (Feishu: interactive body ≤ 30 KB, 230025). Card
    markdown has ``<`` written as ``&lt;`` (so no text becomes a tag), which used to be done after
    the size was measured: an HTML answer came to 44 KB and Feishu refused it for good. And a code
    block cut between two cards is closed in the first and opened again (with its language) in the
    next, not shown as markdown there."""
    fake_feishu.reset()
    fake_openai.reset()
    code = "\n".join(f"<div class=\"row\"><span>{i}</span><b>*x*</b></div>" for i in range(1100))
    answer = f"Here is the page:\n\n```html\n{code}\n```\n\nDone."
    fake_openai.script(oa.text(answer, pieces=6, piece_delay_s=0.15))
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_feishu=fake_feishu, agent=STREAM_FAST),
                                  running)
    status, _ = await fake_feishu.post_event(url(gateway), fake_feishu.text_event("write the page"))
    assert status == 200
    await wait_until(lambda: bool(gateway.store.outbox_rows())
                     and all(r["status"] in ("sent", "failed") for r in gateway.store.outbox_rows()),
                     what="outbox settled")
    assert [r["status"] for r in gateway.store.outbox_rows()] == ["sent"]
    cards = [post_text(m["content"]) for m in fake_feishu.sent(P2P)]
    assert len(cards) >= 2
    for shown in cards:
        assert shown.count("```") % 2 == 0  # every card's code block is closed in that card
    assert cards[0].startswith("Here is the page:") and cards[-1].endswith("```\n\nDone.")
    assert all(c.startswith("```html\n") for c in cards[1:])
    joined = "\n".join(cards).replace("\n```\n```html\n", "\n")  # without the fences added at each cut
    assert joined.replace("&lt;", "<") == answer


async def test_plan_is_one_card_patched_in_place_and_the_reply_another_message(tmp_path, fake_feishu, fake_openai,
                                                                               running):
    fake_feishu.reset()
    fake_openai.reset()
    fake_openai.script(oa.tool_calls(oa.call("update_plan", plan("in_progress", "pending", "pending"))),
                       oa.tool_calls(oa.call("update_plan", plan("done", "in_progress", "pending"))),
                       oa.tool_calls(oa.call("update_plan", plan("done", "done", "done"))),
                       oa.text("All three done."))
    config = gateway_config(tmp_path, fake_openai, fake_feishu=fake_feishu,
                            agent={"stream_edit_interval_s": {"feishu": 0.0}})
    gateway = await start_gateway(config, running)
    status, _ = await fake_feishu.post_event(url(gateway), fake_feishu.text_event("do the three things"))
    assert status == 200
    await wait_until(lambda: [post_text(m["content"]) for m in fake_feishu.sent(P2P)][-1:] == ["All three done."],
                     what="reply")
    await wait_until(lambda: settled(gateway), what="outbox settled")

    plan_card, reply = fake_feishu.sent(P2P)
    assert [c.content and post_text(c.content).splitlines()[0] for c in created(fake_feishu, P2P)] == [
        "Plan (0/3 done)", "All three done."]
    assert plan_card["msg_type"] == "interactive" and reply["msg_type"] == "post"
    assert post_text(plan_card["content"]).splitlines()[0] == "Plan (3/3 done)"
    assert len(patches_of(fake_feishu, plan_card["message_id"])) >= 2
    assert not [c for c in fake_feishu.calls("patch") if c.path.endswith("/" + reply["message_id"])]


def approval_config(tmp_path, fake_openai, fake_feishu, **feishu):
    return gateway_config(tmp_path, fake_openai, fake_feishu=fake_feishu, feishu=feishu,
                          access={"allowed_users": [f"feishu:{ALICE}"]},  # the requester (open access)
                          tools={"workspace": "write", "workspace_root": str(tmp_path / "ws")},
                          approvals={"require_for": ["write", "external"], "timeout_s": 10.0})


def texts(fake, chat_id: str) -> list[str]:
    return [post_text(m["content"]) for m in fake.sent(chat_id)]


async def approval_card(fake, chat_id: str) -> dict:
    await wait_until(lambda: any("🔐 需要审批" in t for t in texts(fake, chat_id)), what="approval card")
    card = next(m for m in fake.sent(chat_id) if "🔐 需要审批" in post_text(m["content"]))
    assert card["msg_type"] == "interactive"
    buttons = [el for el in card_elements(card["content"]) if el["tag"] == "button"]
    assert [b["text"]["content"] for b in buttons] == ["✅ 批准", "❌ 拒绝"]  # Feishu: Chinese (README "Languages")
    assert buttons[0]["value"]["gw_cmd"].startswith("/approve ") and buttons[1]["value"]["gw_cmd"].startswith("/deny ")
    return card


async def test_approve_button_runs_the_tool_and_another_users_press_is_refused(tmp_path, fake_feishu, fake_openai,
                                                                               running):
    fake_feishu.reset()
    fake_openai.reset()
    fake_openai.responder = write_then_report
    gateway = await start_gateway(approval_config(tmp_path, fake_openai, fake_feishu), running)
    status, _ = await fake_feishu.post_event(url(gateway), fake_feishu.text_event(
        "make a plan", chat_id=GROUP, chat_type="group", mention_bot=True, sender=ALICE))
    assert status == 200
    card = await approval_card(fake_feishu, GROUP)

    status, body = await fake_feishu.post_event(url(gateway), fake_feishu.card_action(
        card["message_id"], "✅ 批准", operator=BOB))
    assert (status, body) == (200, {})
    await wait_until(lambda: any("只有发起请求的人" in t for t in texts(fake_feishu, GROUP)), what="Bob refused")
    refusal = next(m for m in fake_feishu.sent(GROUP) if "只有发起请求的人" in post_text(m["content"]))
    assert refusal["parent_id"] == card["message_id"]  # answered under the pressed card
    assert not list((tmp_path / "ws").rglob("plan.txt"))

    press = fake_feishu.card_action(card["message_id"], "✅ 批准", operator=ALICE)
    assert (await fake_feishu.post_event(url(gateway), press))[0] == 200
    await wait_until(lambda: any(t.startswith("tool said") for t in texts(fake_feishu, GROUP)), what="turn finished")
    assert texts(fake_feishu, GROUP)[-1] == "tool said: Wrote 6 bytes to plan.txt."
    assert list((tmp_path / "ws").rglob("plan.txt"))

    assert (await fake_feishu.post_event(url(gateway), press))[0] == 200  # Feishu pushes the callback again
    await wait_until(lambda: settled(gateway), what="outbox settled")
    assert sum(t.startswith("已批准：") for t in texts(fake_feishu, GROUP)) == 1


async def test_deny_button_over_the_long_connection_tells_the_model_and_nothing_runs(tmp_path, fake_feishu,
                                                                                     fake_openai, running):
    fake_feishu.reset()
    fake_openai.reset()
    fake_openai.responder = write_then_report
    await start_gateway(approval_config(tmp_path, fake_openai, fake_feishu, mode="websocket"), running)
    await fake_feishu.wait_ws_connected()
    chat = "oc_fakep2pcards0000000000000000001"
    assert (await fake_feishu.ws_push(fake_feishu.text_event("make a plan", chat_id=chat)))["code"] == 200
    card = await approval_card(fake_feishu, chat)

    ack = await fake_feishu.ws_push(fake_feishu.card_action(card["message_id"], "❌ 拒绝", operator=ALICE))
    assert ack["code"] == 200
    await wait_until(lambda: any(t.startswith("tool said") for t in texts(fake_feishu, chat)), what="turn finished")
    assert "denied" in texts(fake_feishu, chat)[-1].lower()
    assert any(t.startswith("已拒绝：") for t in texts(fake_feishu, chat))
    assert not list((tmp_path / "ws").rglob("plan.txt"))


def test_card_markdown_never_becomes_a_tag_and_long_text_is_cut_into_cards_with_buttons_on_the_last():
    [part] = card_parts("ping <at id=all></at> and a < b", "markdown")
    content = json.loads(part.content)
    assert content["body"]["elements"][0]["content"] == "ping &lt;at id=all>&lt;/at> and a < b"

    parts = card_parts("word " * 20000, "markdown", (("OK", "/approve x"),))
    assert len(parts) >= 2 and all(len(json.dumps({"content": p.content}).encode()) < 30 * 1024 for p in parts)
    assert [any(el["tag"] == "button" for el in card_elements(json.loads(p.content))) for p in parts] == [
        False] * (len(parts) - 1) + [True]


def test_a_long_html_answer_is_cut_between_escapes_never_inside_one():
    """Card markdown carries ``<`` as ``&lt;``; a cut inside one showed ``&l`` at the end of a card
    and ``t;div>`` at the start of the next (found by a review)."""
    parts = card_parts("<div>" * 9000, "markdown")
    contents = [json.loads(p.content)["body"]["elements"][0]["content"] for p in parts]
    assert len(contents) >= 2
    assert all(c.startswith("&lt;div>") and c.endswith("div>") for c in contents), [(c[:9], c[-9:]) for c in contents]
    assert "".join(contents) == "&lt;div>" * 9000


def test_a_press_without_a_command_or_by_the_bot_is_not_a_message():
    body = {"schema": "2.0", "header": {"event_type": "card.action.trigger", "event_id": "e1", "tenant_key": "t"},
            "event": {"operator": {"open_id": ALICE}, "action": {"value": {"gw_cmd": "approve x"}},
                      "context": {"open_message_id": "om_1", "open_chat_id": "oc_1"}}}
    assert action_to_inbound(body, "ou_bot") is None  # not a command
    body["event"]["action"]["value"]["gw_cmd"] = "/approve x"
    assert action_to_inbound(body, ALICE) is None  # the bot itself
    message = action_to_inbound(body, "ou_bot")
    assert message is not None and (message.command, message.text, message.sender.user_id) == ("approve", "x", ALICE)


async def test_a_recalled_preview_card_gets_the_answer_as_a_new_message(tmp_path, fake_feishu, fake_openai, running):
    from gateway.core.types import ChatAddress, OutboundMessage

    fake_feishu.reset()
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_feishu=fake_feishu), running)
    adapter = gateway.adapters["feishu"]
    address = ChatAddress("feishu", fake_feishu.tenant_key, P2P)
    preview = await adapter.send(OutboundMessage(address, "Draft …", "t1:0:preview", format="plain", editable=True))
    assert preview.ok and (await adapter.edit(address, preview.platform_message_ids[0], "Draft, more …")).ok

    fake_feishu.fail_next("patch", 400, 230011, "The message was recalled.")
    final = await adapter.send(OutboundMessage(address, "The **answer**.", "t1:0",
                                               edit_id=preview.platform_message_ids[0]))
    assert final.ok and final.platform_message_ids[0] != preview.platform_message_ids[0]
    assert [post_text(m["content"]) for m in fake_feishu.sent(P2P)] == ["Draft, more …", "The **answer**."]
