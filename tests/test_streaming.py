"""Streaming: tool-call deltas merged by id, then index (also when a server tags every parallel call
with ``index: 0``), and streamed replies delivered once as one message (a preview edited in place,
the final text an edit of it through the outbox) on Telegram and Slack."""

from __future__ import annotations

import asyncio
import itertools
import re

import pytest

from agent.streaming import StreamAccumulator
from gateway.delivery.streaming import PREVIEW_SUFFIX
from tests.conftest import gateway_config, start_gateway
from tests.fakes import openai as oa
from tests.helpers import wait_until
from tests.test_slack_e2e import events_url, message
from tests.test_telegram_e2e import dm_update, sends_to

STREAM_FAST = {"stream_first_after_s": 0.2, "stream_edit_interval_s": {"telegram": 0.3, "slack": 0.3}}




def delta(**fields):
    return {"choices": [{"index": 0, "delta": fields, "finish_reason": None}]}


def test_tool_call_deltas_are_merged_by_index_not_arrival_order():
    acc = StreamAccumulator()
    acc.add(delta(role="assistant", content=None))
    acc.add(delta(tool_calls=[{"index": 1, "id": "call_b", "type": "function",
                               "function": {"name": "get_", "arguments": ""}}]))
    acc.add(delta(tool_calls=[{"index": 0, "id": "call_a", "type": "function",
                               "function": {"name": "search", "arguments": '{"q": '}}]))
    acc.add(delta(tool_calls=[{"index": 1, "function": {"name": "time", "arguments": '{"tz": "UTC"}'}}]))
    acc.add(delta(tool_calls=[{"index": 0, "function": {"arguments": '"oslo"}'}}]))
    acc.add({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    acc.add({"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 3}})
    assert acc.tool_calls() == [
        {"id": "call_a", "type": "function", "function": {"name": "search", "arguments": '{"q": "oslo"}'}},
        {"id": "call_b", "type": "function", "function": {"name": "get_time", "arguments": '{"tz": "UTC"}'}},
    ]
    assert acc.finish_reason == "tool_calls" and acc.usage == {"prompt_tokens": 10, "completion_tokens": 3}


def test_text_deltas_accumulate_and_the_name_sent_whole_twice_is_not_doubled():
    acc = StreamAccumulator()
    assert acc.add(delta(content="Hel")) == "Hel"
    assert acc.add(delta(content="lo")) == "lo"
    acc.add(delta(tool_calls=[{"index": 0, "id": "c", "function": {"name": "web_fetch", "arguments": ""}}]))
    acc.add(delta(tool_calls=[{"index": 0, "function": {"name": "web_fetch", "arguments": "{}"}}]))
    assert acc.text == "Hello" and acc.tool_calls()[0]["function"] == {"name": "web_fetch", "arguments": "{}"}


def test_parallel_calls_streamed_under_one_id_are_two_calls():
    """A model gave two parallel calls one id (index 0 and 1, each with its name): they were merged
    into one call with arguments '{"a": 1}{"a": 2}', which the tool refused (found by a review)."""
    acc = StreamAccumulator()
    acc.add(delta(tool_calls=[{"index": 0, "id": "call_x", "type": "function",
                               "function": {"name": "add", "arguments": '{"a": 1}'}}]))
    acc.add(delta(tool_calls=[{"index": 1, "id": "call_x", "type": "function",
                               "function": {"name": "add", "arguments": '{"a": 2}'}}]))
    first, second = acc.tool_calls()
    assert first == {"id": "call_x", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}
    assert second["function"] == {"name": "add", "arguments": '{"a": 2}'} and second["id"].startswith("call_")
    assert second["id"] != "call_x"


@pytest.mark.parametrize("chunk", [
    {"choices": [None]},
    {"choices": "nope"},
    {"choices": [{"index": 0, "delta": "text"}]},
    {"choices": [{"index": 0, "delta": {"content": 42}}]},
    {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "c", "function": "add"}]}}]},
    {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "c", "function": {"name": 7}}]}}]},
    {"choices": [{"index": 0, "delta": {"tool_calls": ["c"]}}]},
])
def test_a_malformed_stream_chunk_is_the_providers_fault_and_fails_over(fake_openai, chunk):
    """Such chunks raised AttributeError/TypeError: not a ModelError, so a route never tried its
    fallback and the turn failed three times into the generic apology (found by a review)."""
    from agent.model import ModelError, OpenAIChatModel

    fake_openai.reset()
    fake_openai.script(oa.raw(chunk))
    model = OpenAIChatModel(base_url=f"{fake_openai.url}/v1", api_key="sk-test", model="gpt-4o-mini", max_retries=0)
    with pytest.raises(ModelError) as raised:
        model.complete([{"role": "user", "content": "hi"}], [])
    assert raised.value.reason == "stream" and raised.value.user_message == "The model's answer broke off; try again."


def piece(index, id=None, name=None, arguments=""):
    tc = {"index": index, "function": {"arguments": arguments}}
    if id is not None:
        tc.update(id=id, type="function")
        tc["function"]["name"] = name
    return tc


def test_calls_sharing_index_0_in_consecutive_chunks_stay_apart():
    acc = StreamAccumulator()  # the vLLM shape: a new id under the same index is a new call
    acc.add(delta(tool_calls=[piece(0, "call_a", "web_fetch")]))
    acc.add(delta(tool_calls=[piece(0, arguments='{"url": "https://a.example"}')]))
    acc.add(delta(tool_calls=[piece(0, "call_b", "web_fetch")]))
    acc.add(delta(tool_calls=[piece(0, arguments='{"url": ')]))
    acc.add(delta(tool_calls=[piece(0, arguments='"https://b.example"}')]))
    assert acc.tool_calls() == [
        {"id": "call_a", "type": "function", "function": {"name": "web_fetch", "arguments": '{"url": "https://a.example"}'}},
        {"id": "call_b", "type": "function", "function": {"name": "web_fetch", "arguments": '{"url": "https://b.example"}'}},
    ]


def test_calls_sharing_index_0_in_one_chunk_stay_apart_and_a_repeated_id_continues_its_call():
    acc = StreamAccumulator()
    acc.add(delta(tool_calls=[piece(0, "call_a", "add", '{"a": 1}'), piece(0, "call_b", "shout", '{"t": ')]))
    acc.add(delta(tool_calls=[{"index": 0, "id": "call_b", "function": {"arguments": '"x"}'}}]))
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in acc.tool_calls()] == [
        ("call_a", "add", '{"a": 1}'), ("call_b", "shout", '{"t": "x"}')]


def test_a_call_streamed_without_id_or_index_gets_an_id():
    acc = StreamAccumulator()
    acc.add(delta(tool_calls=[{"function": {"name": "web_fetch", "arguments": '{"url": '}}]))
    acc.add(delta(tool_calls=[{"function": {"arguments": '"https://a.example"}'}}]))
    calls = acc.tool_calls()
    assert len(calls) == 1 and re.fullmatch(r"call_[0-9a-f]{24}", calls[0]["id"])
    assert calls[0]["function"] == {"name": "web_fetch", "arguments": '{"url": "https://a.example"}'}
    assert acc.tool_calls()[0]["id"] == calls[0]["id"]  # stable


@pytest.mark.parametrize("shape", ["shared", "one_chunk"])
async def test_parallel_calls_streamed_under_one_index_both_run_and_the_follow_up_is_accepted(
        shape, tmp_path, fake_telegram, fake_openai, page_server, running):
    fake_openai.reset()
    first = oa.call("web_fetch", {"url": f"{page_server.url}/page?copy=1"})
    second = oa.call("web_fetch", {"url": f"{page_server.url}/page?copy=2"})
    fake_openai.script(oa.tool_calls(first, second, index_shape=shape), oa.text("fetched both"))
    await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram), running)
    chat = 5552101 + (shape == "one_chunk")
    fake_telegram.inject(dm_update("fetch both copies", 9751, user_id=chat))
    await wait_until(lambda: any(m["text"] == "fetched both" for m in fake_telegram.sent_messages(chat)),
                     what="the reply after both tools")
    requests = fake_openai.requests
    assert [r["status"] for r in requests] == [200, 200]  # the fake refuses a call without an id (400)
    follow_up = requests[1]["json"]["messages"]
    assistant = next(m for m in follow_up if m.get("tool_calls"))
    assert assistant["tool_calls"] == [
        {"id": c.id, "type": "function", "function": {"name": "web_fetch", "arguments": c.arguments}}
        for c in (first, second)]
    answers = [m for m in follow_up if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in answers] == [first.id, second.id]
    for n, answer in enumerate(answers, 1):  # each call ran with its own arguments
        assert f"URL: {page_server.url}/page?copy={n}\nStatus: 200" in answer["content"]
        assert "amber-falcon-42" in answer["content"]


FINAL = "Here is the **summary** you asked for: " + " ".join(f"point {i} is fine." for i in range(40))


async def test_telegram_streamed_reply_is_one_message_edited_in_place(tmp_path, fake_telegram, fake_openai, running):
    fake_openai.reset()
    fake_openai.script(oa.text(FINAL, pieces=10, piece_delay_s=0.15))
    config = gateway_config(tmp_path, fake_openai, fake_telegram, agent=STREAM_FAST)
    gateway = await start_gateway(config, running)
    chat = 5552001
    fake_telegram.inject(dm_update("summarise please", 9701, user_id=chat))
    final_text = FINAL.replace("**", "")
    await wait_until(lambda: any(m["text"] == final_text for m in fake_telegram.sent_messages(chat)),
                     what="final text")
    await asyncio.sleep(0.3)

    sends = sends_to(fake_telegram, chat)
    assert len(sends) == 1, [c.params["text"] for c in sends]  # the preview; never a second send
    assert sends[0].params["text"].endswith(PREVIEW_SUFFIX) and "entities" not in sends[0].params
    stored = fake_telegram.sent_messages(chat)
    assert len(stored) == 1
    message_id = stored[0]["message_id"]
    edits = [c for c in fake_telegram.calls("editMessageText") if int(c.params["chat_id"]) == chat]
    assert len(edits) >= 2 and all(int(c.params["message_id"]) == message_id for c in edits)
    texts = [c.params["text"] for c in edits]
    assert texts[-1] == final_text and {"type": "bold", "offset": 12, "length": 7} in edits[-1].params["entities"]
    assert all(a != b for a, b in itertools.pairwise(texts))  # unchanged edits are skipped
    intervals = [b.time - a.time for a, b in itertools.pairwise(edits[:-1])]
    assert all(gap >= 0.25 for gap in intervals)  # preview edits are throttled (0.3 s here)

    row = next(r for r in gateway.store.outbox_rows() if r["idempotency_key"].endswith(":0"))
    assert row["status"] == "sent" and row["preview_id"] == str(message_id)
    assert row["platform_message_ids"] == [str(message_id)]


async def test_telegram_long_streamed_reply_edits_part_one_and_sends_the_rest(tmp_path, fake_telegram, fake_openai,
                                                                             running):
    fake_openai.reset()
    long_text = "\n\n".join(f"Paragraph {i}: " + "lorem ipsum dolor sit amet " * 12 for i in range(40))
    assert len(long_text) > 8000
    fake_openai.script(oa.text(long_text, pieces=6, piece_delay_s=0.12))
    await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram, agent=STREAM_FAST), running)
    chat = 5552002
    fake_telegram.inject(dm_update("write a lot", 9702, user_id=chat))
    await wait_until(lambda: sum(len(m["text"]) for m in fake_telegram.sent_messages(chat)) >= len(long_text) - 200,
                     what="all parts")
    await asyncio.sleep(0.3)
    stored = fake_telegram.sent_messages(chat)
    sends = sends_to(fake_telegram, chat)
    assert len(stored) == len(sends) >= 3  # preview (edited into part 1) + the other parts, each sent once
    assert "".join("".join(m["text"] for m in stored).split()) == "".join(long_text.split())
    assert not stored[0]["text"].endswith(PREVIEW_SUFFIX)


async def test_telegram_short_fast_reply_is_not_previewed(tmp_path, fake_telegram, fake_openai, running):
    fake_openai.reset()
    fake_openai.script(oa.text("quick answer"))
    await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram, agent=STREAM_FAST), running)
    chat = 5552003
    fake_telegram.inject(dm_update("hi", 9703, user_id=chat))
    await wait_until(lambda: len(fake_telegram.sent_messages(chat)) == 1, what="reply")
    await asyncio.sleep(0.2)
    assert [c.params["text"] for c in sends_to(fake_telegram, chat)] == ["quick answer"]
    assert not [c for c in fake_telegram.calls("editMessageText") if int(c.params["chat_id"]) == chat]


async def test_a_reply_whose_last_words_come_late_is_sent_whole_not_previewed(tmp_path, fake_telegram, fake_openai,
                                                                                running):
    """The model writes its first half, pauses past ``stream_first_after_s``, then the rest and the
    end of the reply: the text so far is complete when the preview would start, so the reply goes
    out once as itself (no preview of the finished reply edited into the same text)."""
    fake_openai.reset()
    fake_openai.script(oa.text("The first half of the answer, and then the second half.", pieces=2,
                               piece_delay_s=0.35))
    await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram, agent=STREAM_FAST), running)
    chat = 5552008
    fake_telegram.inject(dm_update("take your time", 9708, user_id=chat))
    await wait_until(lambda: len(fake_telegram.sent_messages(chat)) == 1, what="reply")
    await asyncio.sleep(0.3)
    assert [c.params["text"] for c in sends_to(fake_telegram, chat)] == [
        "The first half of the answer, and then the second half."]
    assert not [c for c in fake_telegram.calls("editMessageText") if int(c.params["chat_id"]) == chat]


async def test_streaming_can_be_switched_off_per_platform(tmp_path, fake_telegram, fake_openai, running):
    fake_openai.reset()
    fake_openai.script(oa.text(FINAL, pieces=6, piece_delay_s=0.1))
    agent = {**STREAM_FAST, "streaming": ["slack"]}
    await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram, agent=agent), running)
    chat = 5552004
    fake_telegram.inject(dm_update("no stream", 9704, user_id=chat))
    await wait_until(lambda: len(fake_telegram.sent_messages(chat)) == 1, what="reply")
    assert [c.params["text"] for c in sends_to(fake_telegram, chat)] == [FINAL.replace("**", "")]


async def test_telegram_edit_with_unchanged_text_counts_as_success(tmp_path, fake_telegram, fake_openai, running):
    fake_openai.reset()
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram), running)
    adapter = gateway.adapters["telegram"]
    fake_telegram.inject(dm_update("hello", 9705, user_id=5552005))  # makes the chat known to the fake
    await wait_until(lambda: len(fake_telegram.sent_messages(5552005)) == 1, what="reply")
    address = (await asyncio.to_thread(gateway.store.outbox_rows))[-1]["address"]
    from gateway.core.types import ChatAddress

    target = ChatAddress.from_dict(address)
    message_id = str(fake_telegram.sent_messages(5552005)[0]["message_id"])
    before = len(fake_telegram.calls("editMessageText"))
    first = await adapter.edit(target, message_id, "same text")
    second = await adapter.edit(target, message_id, "same text")  # the fake answers "message is not modified"
    assert first.ok and second.ok and second.platform_message_ids == (message_id,)
    assert len(fake_telegram.calls("editMessageText")) == before + 2


async def test_slack_streamed_reply_is_one_post_updated_in_place(tmp_path, fake_slack, fake_openai, running):
    fake_openai.reset()
    fake_openai.script(oa.text(FINAL, pieces=10, piece_delay_s=0.15))
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_slack=fake_slack, agent=STREAM_FAST),
                                  running)
    channel = "D0STREAM01"
    fake_slack.add_channel(channel)
    since_posts, since_updates = len(fake_slack.calls("chat.postMessage")), len(fake_slack.calls("chat.update"))
    status = await fake_slack.post_event(events_url(gateway), fake_slack.envelope(
        message("stream it", "1735700000.000100", channel=channel)))
    assert status.status == 200
    final = FINAL.replace("**", "*")
    await wait_until(lambda: any(m["text"] == final for m in fake_slack.posted(channel)), what="final update")
    await asyncio.sleep(0.3)
    posts = [c for c in fake_slack.calls("chat.postMessage")[since_posts:] if c.params["channel"] == channel]
    updates = [c for c in fake_slack.calls("chat.update")[since_updates:] if c.params["channel"] == channel]
    assert len(posts) == 1 and posts[0].params["text"].endswith(PREVIEW_SUFFIX)
    assert len(updates) >= 2 and {c.params["ts"] for c in updates} == {fake_slack.posted(channel)[0]["ts"]}
    assert [m["text"] for m in fake_slack.posted(channel)] == [final]


class RecordingAdapter:
    """Records what delivery asks of it (an adapter with ``edit``)."""

    platform = "telegram"
    idempotent_send = False

    def __init__(self) -> None:
        self.sent: list = []

    async def send(self, message, on_part=None, before_part=None):
        from gateway.core.types import DeliveryResult

        if before_part is not None:
            await before_part(message.resume_from)
        self.sent.append(message)
        return DeliveryResult(True, (message.edit_id or "new",))

    async def edit(self, address, message_id, text):  # pragma: no cover - capability marker
        raise AssertionError


async def test_an_edit_left_in_flight_by_a_crash_is_redone_not_skipped(tmp_path):
    """A send in flight at a crash is never repeated (it may have arrived); the final edit of a
    preview is repeated safely: an edit cannot show the reply twice."""
    from gateway.core.types import ChatAddress, InboundMessage, OutboundMessage, Sender
    from gateway.delivery.outbox import Delivery
    from gateway.store.db import create_db_engine, upgrade
    from gateway.store.sql import Store

    engine = create_db_engine(f"sqlite:///{tmp_path / 'd.db'}")
    upgrade(engine)
    store = Store(engine)
    address = ChatAddress("telegram", "1", "90")
    row_id = store.start_stream(OutboundMessage(address, "", "in1:0"), "s", "k", 0).row_id
    store.set_preview(row_id, "P7")
    store.insert_inbound(InboundMessage(address, "90:1", "dm", Sender("90"), "hi"), "k")
    [pending] = store.next_pending("k")
    store.finish_turn([pending.inbox_id], "done", [OutboundMessage(address, "final", "in1:0")], session_key="k")
    [item] = store.claim_outbox("dead-instance", 10, 0.05)
    assert store.mark_sending(item.id, "dead-instance", [], 0.05)  # then the process died mid-edit
    await asyncio.sleep(0.1)
    [again] = store.claim_outbox("b", 10, 30)
    assert again.unconfirmed and again.message.edit_id == "P7"

    adapter = RecordingAdapter()

    async def run_db(fn, *args):
        return await asyncio.to_thread(fn, *args)

    delivery = Delivery(store=store, adapters={"telegram": adapter}, instance_id="b", run_db=run_db)
    await delivery._send(again)
    assert [(m.edit_id, m.resume_from, m.text) for m in adapter.sent] == [("P7", 0, "final")]
    row = next(r for r in store.outbox_rows() if r["id"] == row_id)
    assert row["status"] == "sent" and row["platform_message_ids"] == ["P7"]
    engine.dispose()


async def test_telegram_preview_deleted_by_the_user_is_not_posted_again_on_every_edit(tmp_path, fake_telegram,
                                                                                       fake_openai, running):
    """The user deletes the preview while the model still writes (private chats allow it): the
    preview's later edits fail ("message to edit not found") and show nothing; only the final
    delivery replaces it, with one new message. Found by a review: each preview edit posted the
    text so far as a new message, so the chat filled with copies of the growing answer."""
    fake_openai.reset()
    fake_openai.script(oa.text(FINAL, pieces=16, piece_delay_s=0.15))
    await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram, agent=STREAM_FAST), running)
    chat = 5552009
    fake_telegram.inject(dm_update("summarise please", 9709, user_id=chat))
    await wait_until(lambda: len(fake_telegram.sent_messages(chat)) == 1, what="preview")
    preview = fake_telegram.sent_messages(chat)[0]
    assert preview["text"].endswith(PREVIEW_SUFFIX)
    fake_telegram.delete_by_user(chat, preview["message_id"])
    final_text = FINAL.replace("**", "")
    await wait_until(lambda: any(m["text"] == final_text for m in fake_telegram.sent_messages(chat)),
                     what="final text")
    await asyncio.sleep(0.5)
    assert [m["text"] for m in fake_telegram.sent_messages(chat)] == [final_text]
    assert len(sends_to(fake_telegram, chat)) == 2  # the preview, then the reply replacing it


async def test_telegram_preview_edits_wait_out_flood_control(tmp_path, fake_telegram, fake_openai, running):
    """Telegram answers a preview edit 429 with ``retry_after`` (groups: about 20 messages a minute,
    edits included): no edit is tried again before that time has passed, and the reply still ends
    as the preview edited into the final text. Found by a review: the preview kept editing once per
    interval through the whole wait, every edit refused, which is what flood control punishes with
    longer waits."""
    fake_openai.reset()
    fake_openai.script(oa.text(FINAL, pieces=20, piece_delay_s=0.15))
    await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram, agent=STREAM_FAST), running)
    chat = 5552010
    fake_telegram.inject(dm_update("summarise please", 9710, user_id=chat))
    await wait_until(lambda: len(fake_telegram.sent_messages(chat)) == 1, what="preview")
    edits_before = len(fake_telegram.calls("editMessageText"))
    fake_telegram.flood("editMessageText", 1.5)
    final_text = FINAL.replace("**", "")
    await wait_until(lambda: any(m["text"] == final_text for m in fake_telegram.sent_messages(chat)),
                     timeout=15, what="final text")
    edits = [c for c in fake_telegram.calls("editMessageText")[edits_before:] if int(c.params["chat_id"]) == chat]
    refused = [c for c in edits if c.time < edits[0].time + 1.5]
    assert len(refused) == 1, [round(c.time - edits[0].time, 2) for c in edits]  # waited out retry_after
    assert [m["text"] for m in fake_telegram.sent_messages(chat)] == [final_text]
