"""A turn's reply queued already claimed (``Store.finish_turn(claim=...)``): only when nothing in its
chat is unsettled and its lane was not stopped; a claim a dead process held is freed when its id
is taken over, so the reply goes out after the restart at once (SQLite and PostgreSQL, the store's own API).
``streamed=False`` (no preview took the row in this run of the turn): on PostgreSQL the reply is
queued in one statement, with the same outcomes."""

from __future__ import annotations

import time

import pytest

from gateway.core.types import ChatAddress, InboundMessage, OutboundMessage, Sender
from gateway.ops.instance_store import InstanceRecord, InstanceStore
from gateway.store.db import create_db_engine, upgrade
from gateway.store.sql import Store

CHAT = ChatAddress("telegram", "", "42")


@pytest.fixture
def store(db_url: str):
    engine = create_db_engine(db_url)
    upgrade(engine)
    yield Store(engine)
    engine.dispose()


def _turn(store: Store, n: int, key: str = "telegram::dm:42") -> int:
    message = InboundMessage(address=CHAT, message_id=str(n), chat_type="dm", sender=Sender("7"), text=f"m{n}")
    assert store.insert_inbound(message, key, user_id="u1")
    claimed = store.claim_next(key, "me", 30.0, 1)
    assert claimed is not None
    return claimed[0][0].inbox_id


def _reply(n: int) -> OutboundMessage:
    return OutboundMessage(CHAT, f"answer {n}", idempotency_key=f"in{n}:0")


@pytest.mark.parametrize("streamed", [True, False])
def test_a_reply_is_queued_claimed_only_when_its_chat_is_clear(store, streamed: bool) -> None:
    first = _turn(store, 1)
    items = store.finish_turn([first], "done", [_reply(1)], session_key="telegram::dm:42", claim=("me", 30.0),
                              streamed=streamed)
    assert [i.message.text for i in items] == ["answer 1"] and items[0].attempts == 1
    row = store.outbox_rows()[0]
    assert (row["status"], row["claimed_by"], row["attempts"]) == ("claimed", "me", 1)
    assert store.claim_due("other", 10, 30.0).items == []  # nobody else may take it while claimed

    store.release_lane("telegram::dm:42", "me")
    second = _turn(store, 2)  # the first reply is still unsettled: the second waits behind it
    assert store.finish_turn([second], "done", [_reply(2)], session_key="telegram::dm:42", claim=("me", 30.0),
                             streamed=streamed) == []
    assert [r["status"] for r in store.outbox_rows()] == ["claimed", "pending"]
    assert store.mark_sent(items[0].id, "me", ["900"])
    assert [i.message.text for i in store.claim_due("me", 10, 30.0).items] == ["answer 2"]


@pytest.mark.parametrize("streamed", [True, False])
def test_a_stopped_turn_s_reply_is_not_queued_claimed(store, streamed: bool) -> None:
    inbox_id = _turn(store, 1)
    interrupting = InboundMessage(address=CHAT, message_id="2", chat_type="dm", sender=Sender("7"), text="new")
    store.insert_inbound(interrupting, "telegram::dm:42", cancel="always", user_id="u1")  # the lane moves on
    assert store.finish_turn([inbox_id], "done", [_reply(1)], session_key="telegram::dm:42", generation=0,
                             claim=("me", 30.0), streamed=streamed) == []
    assert store.claim_due("me", 10, 30.0).items == []  # claim_due cancels it: never sent
    assert store.outbox_rows()[0]["status"] == "cancelled"


def test_a_dead_owner_s_claim_is_freed_when_its_id_is_taken_over(store) -> None:
    instances = InstanceStore(store.engine)
    now = time.time()
    record = InstanceRecord(id="me", boot="b1", host="h", pid=1, pid_scope="s", pid_start=None, started_at=now,
                            heartbeat_at=now)
    assert instances.take(record, None) is not None
    items = store.finish_turn([_turn(store, 1)], "done", [_reply(1)], session_key="telegram::dm:42",
                              claim=("me", 30.0))
    assert items  # ... and the process dies before sending it
    restarted = InstanceRecord(id="me", boot="b2", host="h", pid=2, pid_scope="s", pid_start=None,
                               started_at=now + 1, heartbeat_at=now + 1)
    released = instances.take(restarted, "b1")
    assert released is not None and released.replies == 1
    assert [i.message.text for i in store.claim_due("me", 10, 30.0).items] == ["answer 1"]


def test_a_streamed_reply_is_queued_claimed_as_an_edit_of_its_preview_when_its_chat_is_clear(store) -> None:
    """The turn's preview row (*streaming*) gets the final text already claimed: the reply goes out at
    once as an edit of the preview (the row's own id, the preview's message id), as ``claim_due``
    would hand it out, but without waiting for a delivery pass."""
    first = _turn(store, 1)
    row_id = store.start_stream(OutboundMessage(CHAT, "", "in1:0"), "s", "telegram::dm:42", 0).row_id
    assert store.set_preview(row_id, "P5")
    [item] = store.finish_turn([first], "done", [_reply(1)], session_key="telegram::dm:42", claim=("me", 30.0),
                               stream_key="in1:0")
    assert (item.id, item.attempts, item.sent_ids, item.unconfirmed) == (row_id, 1, (), False)
    assert (item.message.text, item.message.edit_id, item.message.resume_from) == ("answer 1", "P5", 0)
    [row] = store.outbox_rows()
    assert (row["status"], row["claimed_by"], row["attempts"], row["text"]) == ("claimed", "me", 1, "answer 1")
    assert store.claim_due("other", 10, 30.0).items == []  # nobody else may take it while claimed

    # the next streamed reply of the chat while a reply of another conversation to the same chat
    # waits: it is not claimed but queued pending, and claim_due hands both out in chat order (its
    # row, made with its preview, first)
    store.release_lane("telegram::dm:42", "me")
    assert store.mark_sent(item.id, "me", ["P5"])
    second = _turn(store, 2)
    row_2 = store.start_stream(OutboundMessage(CHAT, "", "in2:0"), "s", "telegram::dm:42", 0).row_id
    assert store.set_preview(row_2, "P6")
    elsewhere = _turn(store, 3, key="telegram::other")
    assert store.finish_turn([elsewhere], "done", [_reply(3)], session_key="telegram::other") == []
    assert store.finish_turn([second], "done", [_reply(2)], session_key="telegram::dm:42", claim=("me", 30.0),
                             stream_key="in2:0") == []
    assert next(r for r in store.outbox_rows() if r["id"] == row_2)["status"] == "pending"
    [handed] = store.claim_due("me", 10, 30.0).items
    assert (handed.id, handed.message.text, handed.message.edit_id) == (row_2, "answer 2", "P6")
    assert store.mark_sent(handed.id, "me", ["P6"])
    assert [i.message.text for i in store.claim_due("me", 10, 30.0).items] == ["answer 3"]


def test_a_streamed_reply_whose_preview_fate_is_unknown_is_claimed_as_a_new_message(store) -> None:
    first = _turn(store, 1)
    row_id = store.start_stream(OutboundMessage(CHAT, "", "in1:0"), "s", "telegram::dm:42", 0).row_id
    # the preview's send timed out: whether it arrived is unknown ("?"), so nothing is edited
    [item] = store.finish_turn([first], "done", [_reply(1)], session_key="telegram::dm:42", claim=("me", 30.0),
                               stream_key="in1:0")
    assert (item.id, item.message.edit_id) == (row_id, None)


def test_a_stopped_turn_s_streamed_reply_is_not_queued_claimed(store) -> None:
    inbox_id = _turn(store, 1)
    row_id = store.start_stream(OutboundMessage(CHAT, "", "in1:0"), "s", "telegram::dm:42", 0).row_id
    assert store.set_preview(row_id, "P5")
    interrupting = InboundMessage(address=CHAT, message_id="2", chat_type="dm", sender=Sender("7"), text="new")
    store.insert_inbound(interrupting, "telegram::dm:42", cancel="always", user_id="u1")  # the lane moves on
    assert store.finish_turn([inbox_id], "done", [_reply(1)], session_key="telegram::dm:42", generation=0,
                             claim=("me", 30.0), stream_key="in1:0") == []
    assert store.claim_due("me", 10, 30.0).items == []  # claim_due cancels it: the final text is never sent
    assert store.outbox_rows()[0]["status"] == "cancelled"


def test_a_resumed_turn_s_reply_is_queued_once_and_its_streaming_row_finished_without_a_preview_this_run(
        store) -> None:
    """``streamed=False`` says only that no preview took the row in this run: a reply an earlier
    run queued is not queued again, and a *streaming* row an earlier run's preview took gets the
    final text (claimed, an edit of that preview), as with ``streamed=True``."""
    first = _turn(store, 1)
    [item] = store.finish_turn([first], "done", [_reply(1)], session_key="telegram::dm:42", claim=("me", 30.0),
                               streamed=False)
    assert store.mark_sent(item.id, "me", ["900"])
    store.release_lane("telegram::dm:42", "me")
    again = _turn(store, 2)
    assert store.finish_turn([again], "done", [_reply(1)], session_key="telegram::dm:42", claim=("me", 30.0),
                             streamed=False) == []  # the same key: queued already
    assert [(r["text"], r["status"]) for r in store.outbox_rows()] == [("answer 1", "sent")]

    store.release_lane("telegram::dm:42", "me")
    third = _turn(store, 3)
    row_id = store.start_stream(OutboundMessage(CHAT, "", "in3:0"), "s", "telegram::dm:42", 0).row_id
    assert store.set_preview(row_id, "P7")
    [edit] = store.finish_turn([third], "done", [_reply(3)], session_key="telegram::dm:42", claim=("me", 30.0),
                               stream_key="in3:0", streamed=False)
    assert (edit.id, edit.message.text, edit.message.edit_id) == (row_id, "answer 3", "P7")
    assert len(store.outbox_rows()) == 2
