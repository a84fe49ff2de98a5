"""Store contract: the durable rules hold on SQLite and on PostgreSQL alike."""

from __future__ import annotations

import threading
import time

import pytest

from gateway.core.types import ChatAddress, InboundMessage, OutboundMessage, Sender
from gateway.store.db import create_db_engine, upgrade
from gateway.store.outbox import StreamRequest, StreamStart
from gateway.store.sql import LaneNext, Prefetch, Store


@pytest.fixture
def store(db_url):
    engine = create_db_engine(db_url)
    yield Store(engine)
    engine.dispose()


def message(message_id: str, chat: str = "5", text: str = "hi") -> InboundMessage:
    return InboundMessage(ChatAddress("telegram", "1", chat), message_id, "dm", Sender(chat, "A"), text)


def test_inbox_drops_duplicates_and_keeps_arrival_order(store):
    assert store.insert_inbound(message("5:1", text="first"), "k") is True
    assert store.insert_inbound(message("5:1", text="again"), "k") is False
    assert store.insert_inbound(message("5:2", text="second"), "k") is True
    [pending] = store.next_pending("k")
    assert pending.message.text == "first"
    store.finish_turn([pending.inbox_id], "done", [])
    assert [p.message.text for p in store.next_pending("k", 5)] == ["second"]
    # Same message id on another tenant is a different message.
    other = InboundMessage(ChatAddress("telegram", "2", "5"), "5:1", "dm", Sender("5"), "x")
    assert store.insert_inbound(other, "k2") is True


def test_lane_lease_is_exclusive_until_released_or_expired(store):
    assert store.claim_lane("k", "a", lease_s=60)
    assert not store.claim_lane("k", "b", lease_s=60)
    assert store.claim_lane("k", "a", lease_s=60)  # re-entrant for the owner
    store.release_lane("k", "a")
    assert store.claim_lane("k", "b", lease_s=0.05)
    time.sleep(0.1)
    assert store.claim_lane("k", "a", lease_s=60)  # b's lease expired


def test_a_lane_is_entered_with_its_batch_and_left_when_nothing_waits(store):
    assert store.claim_next("k", "a", 60) is None  # nothing waits: no lease kept
    assert store.claim_lane("k", "b", 60) and store.release_lane("k", "b") is False
    store.insert_inbound(message("5:1", text="first"), "k")
    store.insert_inbound(message("5:2", text="second"), "k")
    batch, generation = store.claim_next("k", "a", 60)
    assert [p.message.text for p in batch] == ["first"] and generation == 0
    assert store.claim_next("k", "b", 60) is None  # a holds the lease
    store.finish_turn([batch[0].inbox_id], "done", [])
    batch, _, _ = store.next_or_release("k", "a")
    assert [p.message.text for p in batch] == ["second"]
    assert not store.claim_lane("k", "b", 60)  # still a's between turns
    store.finish_turn([batch[0].inbox_id], "done", [])
    assert store.next_or_release("k", "a") == ([], 0, False)
    assert store.claim_lane("k", "b", 60)  # released with the last read


def test_a_turns_last_transaction_reads_the_lanes_next_rows_or_gives_the_lease_up(store):
    store.insert_inbound(message("5:1", text="first"), "k")
    store.insert_inbound(message("5:2", text="second"), "k")
    batch, _ = store.claim_next("k", "a", 60)
    then = LaneNext("k", "a")
    store.finish_turn([batch[0].inbox_id], "done", [], then=then)
    assert then.done and not then.released and [p.message.text for p in then.batch] == ["second"]
    assert not store.claim_lane("k", "b", 60)  # the lease stays a's for the next turn
    last = LaneNext("k", "a")
    store.finish_turn([then.batch[0].inbox_id], "done", [], then=last)
    assert last.released and last.batch == [] and last.waiting is False
    assert store.claim_lane("k", "b", 60)  # given up in the turn's own transaction


def test_reads_for_the_next_turn_run_in_the_transaction_that_hands_over_its_rows(store):
    seen: list[tuple[str, list[str]]] = []

    def session_of(conn, batch, fresh):  # what a turn reads before it starts, in the claim's transaction
        opened = store.open_session_in(conn, "k", lambda: "prompt", 10)
        seen.append((opened.session_id, [p.message.text for p in batch]))
        return opened.session_id

    store.insert_inbound(message("5:1", text="first"), "k")
    store.insert_inbound(message("5:2", text="second"), "k")
    first = Prefetch(session_of)
    batch, _ = store.claim_next("k", "a", 60, prefetch=first)
    assert first.value == seen[0][0] and seen[0][1] == ["first"]
    assert store.current_session_id("k") == first.value  # created with the claim, committed with it
    then = LaneNext("k", "a", prefetch=Prefetch(session_of))
    store.finish_turn([batch[0].inbox_id], "done", [], then=then)
    assert then.prefetch is not None and then.prefetch.value == first.value  # the same session, read again
    assert seen[1][1] == ["second"]
    last = LaneNext("k", "a", prefetch=Prefetch(session_of))
    store.finish_turn([then.batch[0].inbox_id], "done", [], then=last)
    assert last.released and last.prefetch is not None and last.prefetch.value is None  # no rows: nothing read
    assert len(seen) == 2


def test_a_turns_finish_titles_the_session_once_and_records_each_sender_in_each_chat_once(store):
    """``finish_turn`` with the turn's messages: the session's title is its first user message (on
    one line, at most 80 characters) and stays; its last use moves; each sender of the turn's
    inbox rows (a merged turn has several) is recorded once per chat, when first seen."""
    from sqlalchemy import select

    from gateway.store.models import ChatMemberRow, SessionRow, table
    from gateway.store.sql import NewMessage

    sessions, members = table(SessionRow), table(ChatMemberRow)
    session_id = store.new_session("k", "prompt", None)

    def turn(n: int, text: str, chat: str, senders: tuple[str, ...] = ("7",)) -> float:
        for i, sender in enumerate(senders):
            store.insert_inbound(InboundMessage(ChatAddress("telegram", "1", chat), f"{chat}:{n}.{i}", "group",
                                                Sender(sender, "A"), text), "k")
        pending = store.next_pending("k", 5)
        before = time.time()
        store.finish_turn([p.inbox_id for p in pending], "done",
                          [OutboundMessage(ChatAddress("telegram", "1", chat), "ok", f"r{n}")],
                          session_id=session_id, session_key="k", claim=("me", 60),
                          messages=[NewMessage(f"in{n}", "user", text, {}),
                                    NewMessage(f"in{n}", "assistant", "ok", {})])
        return before

    first = turn(1, "  plan the\n trip " + "to Oslo " * 20, "-100")
    turn(2, "and the hotel", "-100", senders=("7", "8", "8"))  # merged: three rows, two senders
    third = turn(3, "another group now", "-200")
    with store.engine.connect() as conn:
        title, updated_at = conn.execute(select(sessions.c.title, sessions.c.updated_at)
                                         .where(sessions.c.id == session_id)).one()
        seen = conn.execute(select(members).order_by(members.c.chat_id, members.c.user_id)).all()
    assert title == ("plan the trip " + "to Oslo " * 20)[:80]
    assert updated_at >= third
    assert [(r.platform, r.tenant, r.chat_id, r.user_id, r.chat_type) for r in seen] == [
        ("telegram", "1", "-100", "7", "group"), ("telegram", "1", "-100", "8", "group"),
        ("telegram", "1", "-200", "7", "group")]
    assert first <= seen[0].first_seen_at < seen[1].first_seen_at  # kept from the first time


def test_a_failed_finish_leaves_the_lane_step_undone(store):
    store.insert_inbound(message("5:1"), "k")
    batch, _ = store.claim_next("k", "a", 60)
    then = LaneNext("k", "a")
    with pytest.raises(AttributeError):  # a reply that is not one: the transaction rolls back
        store.finish_turn([batch[0].inbox_id], "done", [object()], session_key="k", then=then)  # type: ignore[list-item]
    assert not then.done and not then.released
    assert not store.claim_lane("k", "b", 60)  # still a's: the caller gives it up itself
    assert [p.message.text for p in store.next_pending("k")] == ["hi"]  # nothing was finished


def test_a_lane_used_for_the_first_time_by_two_instances_has_one_owner(store):
    store.insert_inbound(message("5:1"), "fresh")
    results: list[object] = []
    barrier = threading.Barrier(4)

    def enter(owner: str) -> None:
        barrier.wait()
        results.append(store.claim_next("fresh", owner, 60))

    threads = [threading.Thread(target=enter, args=(f"o{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(r is not None for r in results) == 1


def test_concurrent_claims_have_one_winner(store):
    winners: list[str] = []
    barrier = threading.Barrier(8)

    def claim(owner: str) -> None:
        barrier.wait()
        if store.claim_lane("fresh-key", owner, lease_s=60):
            winners.append(owner)

    threads = [threading.Thread(target=claim, args=(f"o{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(winners) == 1


def test_system_prompt_is_stored_once_and_read_back(store):
    store.claim_lane("k", "a", 60)
    built: list[int] = []

    def build() -> str:
        built.append(1)
        return "You are helpful. ✓"

    first = store.current_session("k", build)
    second = store.current_session("k", build)
    assert first == second and first[1] == "You are helpful. ✓" and len(built) == 1


def test_transcript_window_is_the_newest_messages_in_order(store):
    store.claim_lane("k", "a", 60)
    session_id, _ = store.current_session("k", lambda: "s")
    for i in range(10):
        store.append_message(session_id, "t", "user", f"m{i}")
    window = store.load_window(session_id, 3)
    assert [m.content for m in window] == ["m7", "m8", "m9"]


def test_session_usage_sums_each_calls_reported_figures_once(store):
    from gateway.admin.queries import AdminQueries
    from gateway.sessions.directory import Directory, SessionUsage

    store.claim_lane("k", "a", 60)
    session_id, _ = store.current_session("k", lambda: "s")
    store.append_message(session_id, "t1", "user", "hi", meta={"time": 1.0})
    store.append_message(session_id, "t1", "assistant", None, prompt_tokens=1500,
                         completion_tokens=20, meta={"cost_usd": 0.008, "cached_tokens": 1000})
    store.append_message(session_id, "t1", "tool", "ok", tool_call_id="c1")
    store.append_message(session_id, "t1", "assistant", "done", prompt_tokens=1700, completion_tokens=50,
                         meta={"cost_usd": 0.0085, "cached_tokens": 1500, "stop_reason": "stop"})
    store.append_message(session_id, "t2", "assistant", "no cache", prompt_tokens=10, completion_tokens=5,
                         meta={"cost_usd": 0.0001})
    usage = Directory(store.engine).session_usage(session_id)
    assert usage == SessionUsage(5, 3210, 75, 2500, pytest.approx(0.0166))
    listed = next(r for r in AdminQueries(store.engine).sessions() if r["id"] == session_id)
    assert (listed["prompt_tokens"], listed["cached_tokens"], listed["cost_usd"]) == (3210, 2500, pytest.approx(0.0166))
    turns = AdminQueries(store.engine).session(session_id)["turns"]
    assert [(t["prompt_tokens"], t["cached_tokens"], t["cost_usd"]) for t in turns] == [
        (3200, 2500, pytest.approx(0.0165)), (10, 0, pytest.approx(0.0001))]


def test_a_users_sessions_are_listed_by_their_last_message_reading_only_theirs(store):
    """``/sessions``: the user's sessions, the one last written to first (one without messages by
    its creation), the lane's current one marked, another user's never; each session's last
    message is found through the transcript's index, not by reading every message there is."""
    from gateway.sessions.directory import OWNED_SESSIONS, Directory

    older = store.new_session("dm:u1", "s", "u1")
    store.append_message(older, "t1", "user", "first")
    empty = store.new_session("dm:u1", "s", "u1")
    theirs = store.new_session("dm:u2", "s", "u2")
    store.append_message(theirs, "t2", "user", "not yours")
    time.sleep(0.01)
    store.append_message(older, "t3", "user", "again")  # the older session, used last
    current = store.new_session("dm:u1", "s", "u1")  # the lane's now
    listed = Directory(store.engine).sessions("u1", "dm:u1")
    assert [s.id for s in listed] == [current, older, empty]
    assert [s.current for s in listed] == [True, False, False]
    if store.engine.dialect.name == "sqlite":
        compiled = OWNED_SESSIONS.compile(dialect=store.engine.dialect)
        params = compiled.construct_params({"b_owner": "u1"})
        with store.engine.connect() as conn:
            plan = " | ".join(row[-1] for row in conn.exec_driver_sql(
                f"EXPLAIN QUERY PLAN {compiled.string}", tuple(params[name] for name in compiled.positiontup)))
        assert "SCAN messages" not in plan and "ix_messages_session_id_id" in plan, plan


def test_turn_texts_are_the_turns_messages_among_the_newest(store):
    store.claim_lane("k", "a", 60)
    session_id, _ = store.current_session("k", lambda: "s")
    for i in range(6):
        store.append_message(session_id, f"t{i // 2}", "user" if i % 2 == 0 else "assistant", f"m{i}")
    assert [c for _, _, c in store.turn_texts(session_id, ["t2", "t0"])] == ["m0", "m1", "m4", "m5"]
    # Only m3..m5 are scanned: t0's messages are older.
    assert [(r, c) for _, r, c in store.turn_texts(session_id, ["t0", "t2"], scan=3)] == [("user", "m4"),
                                                                                         ("assistant", "m5")]


def test_outbox_claim_is_exclusive_and_keeps_delivered_parts(store):
    reply = OutboundMessage(ChatAddress("telegram", "1", "5"), "hello", idempotency_key="in1:0")
    store.insert_inbound(message("5:9"), "k")
    [pending] = store.next_pending("k")
    store.finish_turn([pending.inbox_id], "done", [reply])
    store.finish_turn([pending.inbox_id], "done", [reply])  # a resumed turn queues nothing twice
    items = store.claim_outbox("a", 10, claim_s=60)
    assert len(items) == 1 and items[0].message.resume_from == 0
    assert store.claim_outbox("b", 10, claim_s=60) == []
    store.mark_retry(items[0].id, "a", time.time() - 1, "rate limited", ["m1"])
    again = store.claim_outbox("b", 10, claim_s=60)
    assert again[0].message.resume_from == 1 and again[0].sent_ids == ("m1",) and again[0].attempts == 2
    assert not store.mark_sent(again[0].id, "a", ["m1", "x"])  # "a" lost its claim: fenced off
    assert store.mark_sent(again[0].id, "b", ["m1", "m2"])
    assert store.outbox_rows()[0]["status"] == "sent"


def test_migrations_are_idempotent(db_url):
    engine = create_db_engine(db_url)
    upgrade(engine)
    upgrade(engine)
    engine.dispose()


def reply_row(key: str, chat: str = "5") -> OutboundMessage:
    return OutboundMessage(ChatAddress("telegram", "1", chat), f"text {key}", idempotency_key=key)


def test_outbox_keeps_chat_order_across_retries(store):
    store.insert_inbound(message("5:1"), "k")
    [p] = store.next_pending("k")
    store.finish_turn([p.inbox_id], "done", [reply_row("a"), reply_row("b"), reply_row("c", chat="6")])
    first = store.claim_outbox("x", 10, claim_s=60)
    assert [i.message.idempotency_key for i in first] == ["a", "c"]  # one row per chat
    store.mark_retry(first[0].id, "x", time.time() + 60, "429", [])  # chat 5 waits for its retry
    store.mark_sent(first[1].id, "x", ["9"])
    assert store.claim_outbox("x", 10, claim_s=60) == []  # "b" may not overtake "a"


def test_a_claim_says_whether_rows_wait_behind_it(store):
    store.insert_inbound(message("5:1"), "k")
    [p] = store.next_pending("k")
    store.finish_turn([p.inbox_id], "done", [reply_row("a"), reply_row("b"), reply_row("c", chat="6")])
    first = store.claim_due("x", 10, claim_s=60)
    assert [i.message.idempotency_key for i in first.items] == ["a", "c"] and first.more  # "b" waits behind "a"
    for item in first.items:
        store.mark_sent(item.id, "x", ["1"])
    second = store.claim_due("x", 10, claim_s=60)
    assert [i.message.idempotency_key for i in second.items] == ["b"] and not second.more
    store.insert_inbound(message("5:2"), "k")
    [p] = store.next_pending("k")
    store.finish_turn([p.inbox_id], "done", [reply_row("d"), reply_row("e", chat="6")])
    assert store.claim_due("x", 1, claim_s=60).more  # the limit cut the due rows


def test_control_message_cancels_running_turn_and_its_pending_replies(store):
    assert store.claim_lane("k", "a", 60)
    gen = store.lane_generation("k")
    store.insert_inbound(message("5:1"), "k")
    [p] = store.next_pending("k")
    store.finish_turn([p.inbox_id], "done", [reply_row("old")], session_key="k", generation=gen)
    stop = InboundMessage(ChatAddress("telegram", "1", "5"), "5:2", "dm", Sender("5"), "", command="stop")
    assert store.insert_inbound(stop, "k", cancel="always", control_reply=reply_row("stopped"))
    assert store.lane_generation("k") == gen + 1
    claimed = store.claim_outbox("x", 10, claim_s=60)
    assert [i.message.idempotency_key for i in claimed] == ["stopped"]
    assert {r["idempotency_key"]: r["status"] for r in store.outbox_rows()}["old"] == "cancelled"
    assert store.next_pending("k") == []  # the control message never waits in the lane


def test_interrupt_cancels_only_while_a_turn_runs(store):
    store.insert_inbound(message("5:1"), "k", cancel="if_busy")
    assert store.lane_generation("k") == 0  # idle lane: nothing to interrupt
    store.claim_lane("k", "a", 60)
    store.insert_inbound(message("5:2"), "k", cancel="if_busy")
    assert store.lane_generation("k") == 1
    assert store.insert_inbound(message("5:2"), "k", cancel="if_busy") is False
    assert store.lane_generation("k") == 1  # a duplicate cancels nothing


def test_row_left_sending_by_a_dead_owner_is_reclaimed_as_unconfirmed(store):
    store.insert_inbound(message("5:1"), "k")
    [p] = store.next_pending("k")
    store.finish_turn([p.inbox_id], "done", [reply_row("a")])
    [item] = store.claim_outbox("dead", 10, claim_s=0.01)
    assert not item.unconfirmed
    time.sleep(0.05)
    [again] = store.claim_outbox("next", 10, claim_s=0.01)  # claimed, nothing in flight: a safe retry
    assert again.id == item.id and not again.unconfirmed
    assert store.mark_sending(again.id, "next", [], claim_s=0.01)  # the API call starts ... and it dies
    time.sleep(0.05)
    [third] = store.claim_outbox("alive", 10, claim_s=60)
    assert third.id == item.id and third.unconfirmed


def test_streamed_reply_row_is_never_claimed_until_final_and_then_edits_its_preview(store):
    address = ChatAddress("telegram", "1", "77")
    reply = OutboundMessage(address, "", "in9:0")
    start = store.start_stream(reply, "s", "k", 0)
    assert start is not None and (start.send, start.preview_id) == (True, None)
    row_id = start.row_id
    assert [r["preview_id"] for r in store.outbox_rows() if r["id"] == row_id] == ["?"]  # before the send
    # a resumed turn finds its row: its preview's fate unknown ("?"), nothing is sent or edited
    assert store.start_stream(reply, "s", "k", 0) == StreamStart(row_id, False, None)
    assert store.set_preview(row_id, "501")
    assert store.start_stream(reply, "s", "k", 0) == StreamStart(row_id, False, "501")  # it keeps editing 501
    assert store.claim_outbox("a", 10, 30) == []  # streaming rows are not deliverable
    store.insert_inbound(message("77:1", chat="77"), "k")
    [pending] = store.next_pending("k")
    store.finish_turn([pending.inbox_id], "done", [OutboundMessage(address, "final text", "in9:0")],
                      session_key="k", stream_key="in9:0")
    [item] = store.claim_outbox("a", 10, 30)
    assert item.message.text == "final text" and item.message.edit_id == "501" and item.message.resume_from == 0
    # an unsettled reply: no other preview may overtake it, and none is written for it
    assert store.start_stream(OutboundMessage(address, "", "other-key"), "s", "k", 0) is None
    assert not any(r["idempotency_key"] == "other-key" for r in store.outbox_rows())
    assert store.start_stream(reply, "s", "k", 0) == StreamStart(row_id, False, None)  # final: no preview


def test_cancelled_turn_cancels_its_streaming_row_and_unknown_previews_are_not_edited(store):
    address = ChatAddress("telegram", "1", "78")
    row_id = store.start_stream(OutboundMessage(address, "", "in10:0"), "s", "k", 0).row_id
    store.insert_inbound(message("78:1", chat="78"), "k")
    [pending] = store.next_pending("k")
    store.finish_turn([pending.inbox_id], "cancelled", [], session_key="k", stream_key="in10:0")
    assert [r["status"] for r in store.outbox_rows() if r["id"] == row_id] == ["cancelled"]

    unknown = store.start_stream(OutboundMessage(address, "", "in11:0"), "s", "k", 0)
    assert unknown is not None and unknown.send  # then the preview's send was in flight when the process died
    store.finish_turn([pending.inbox_id], "done", [OutboundMessage(address, "final", "in11:0")], session_key="k")
    [item] = store.claim_outbox("a", 10, 30)
    assert item.message.edit_id is None  # sent as a new message: nothing known to edit


def test_previews_of_several_replies_are_taken_and_recorded_together(store):
    """``start_streams``/``set_previews`` (the main loop's group commits of a burst's previews) do in
    one transaction what ``start_stream``/``set_preview`` do one by one, in order."""
    a, b = ChatAddress("telegram", "1", "81"), ChatAddress("telegram", "1", "82")
    requests = [StreamRequest(OutboundMessage(a, "", "in20:0"), "s", "k1", 0),
                StreamRequest(OutboundMessage(b, "", "in21:0"), "s", "k2", 0)]
    first, second = store.start_streams(requests)
    assert first is not None and second is not None and first.send and second.send
    assert {r["id"]: r["preview_id"] for r in store.outbox_rows()} == {first.row_id: "?", second.row_id: "?"}
    assert store.set_previews([(first.row_id, "701"), (second.row_id, None)]) == [True, True]
    # asked again (a resumed turn): the first keeps editing 701; the second's preview failed: sent anew
    assert store.start_streams(requests) == [StreamStart(first.row_id, False, "701"),
                                             StreamStart(second.row_id, True, None)]
    store.insert_inbound(message("81:1", chat="81"), "k1")
    [pending] = store.next_pending("k1")
    store.finish_turn([pending.inbox_id], "done", [OutboundMessage(a, "final", "in20:0")], session_key="k1")
    # a row no longer streaming keeps its preview id; another reply of its chat waits behind it
    assert store.set_previews([(first.row_id, "999"), (second.row_id, "702")]) == [False, True]
    assert store.start_streams([StreamRequest(OutboundMessage(a, "", "in22:0"), "s", "k1", 0)]) == [None]


def test_instances_starting_together_migrate_once(db_url):
    """Several instances start at once on a fresh database: one migrates, the others wait."""
    from gateway.store.db import create_db_engine as make
    from gateway.store.models import Base

    engine = make(db_url)
    Base.metadata.drop_all(engine)  # back to an empty database
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE IF EXISTS alembic_version")
    engine.dispose()
    errors: list[str] = []

    def start() -> None:
        e = make(db_url)
        try:
            upgrade(e)
        except Exception as exc:
            errors.append(repr(exc))
        finally:
            e.dispose()

    threads = [threading.Thread(target=start) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    engine = make(db_url)
    assert Store(engine).count_inbox("pending") == 0
    engine.dispose()


def test_a_control_reply_after_a_stop_is_not_taken_for_a_stale_one(store):
    store.claim_lane("k", "a", 60)
    stop = InboundMessage(ChatAddress("telegram", "1", "5"), "5:1", "dm", Sender("5"), "", command="stop")
    store.insert_inbound(stop, "k", cancel="always", control_reply=reply_row("stopped"))
    store.claim_outbox("x", 10, claim_s=60)
    later = InboundMessage(ChatAddress("telegram", "1", "5"), "5:2", "dm", Sender("5"), "hi")
    store.insert_inbound(later, "k", control_reply=reply_row("pairing code"))  # no cancellation
    store.mark_sent(store.outbox_rows()[0]["id"], "x", ["1"])
    assert [i.message.idempotency_key for i in store.claim_outbox("x", 10, claim_s=60)] == ["pairing code"]


def test_a_turns_messages_are_stored_in_order_and_each_usage_row_keyed_by_its_own_message(store):
    """A turn's messages (on PostgreSQL several in one statement) keep their order in the
    transcript (ids ascending), a JSON column left empty reads back as ``None``, and a model call's
    usage row is keyed by the message it belongs to, not by the first or last of the statement. More
    messages than one statement takes are split, in order. A field that is not a column is refused."""
    from sqlalchemy import select

    from gateway.store.models import UsageRow
    from gateway.store.prepared import MESSAGES_PER_INSERT
    from gateway.store.sql import NewMessage, UsageEntry

    used = UsageEntry(user_id="u1", chat_key="telegram:1:5", session_key="k", platform="telegram",
                      provider="default", model="m", day="2026-12-03", prompt_tokens=10, cached_tokens=0,
                      completion_tokens=2, cost_usd=0.001)
    session_id = store.new_session("k", "prompt", None)
    calls = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    messages = [NewMessage("in1", "user", "hi", {"meta": {"time": 1.0}}),
                NewMessage("in1", "assistant", None, {"tool_calls": calls}),
                NewMessage("in1", "tool", "result", {"tool_call_id": "c1"}),
                NewMessage("in1", "assistant", "done", {"prompt_tokens": 10, "completion_tokens": 2}, (used, used))]
    many = [NewMessage(f"in{n}", "user", f"m{n}", {}) for n in range(MESSAGES_PER_INSERT + 2)]
    ids = store.append_messages(session_id, messages) + store.append_messages(session_id, many)
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    stored = store.transcript(session_id)
    assert [m.id for m in stored] == ids
    assert [m.content for m in stored] == ["hi", None, "result", "done"] + [f"m{n}" for n in range(len(many))]
    assert stored[0].meta == {"time": 1.0} and stored[1].tool_calls == calls and stored[2].tool_call_id == "c1"
    assert stored[0].tool_calls is None and stored[2].meta is None
    with store.engine.connect() as conn:
        keys = conn.execute(select(UsageRow.call_key).order_by(UsageRow.call_key)).scalars().all()
    assert keys == [f"message:{ids[3]}", f"message:{ids[3]}:1"]
    with pytest.raises(ValueError, match="not a messages column"):
        store.append_messages(session_id, [NewMessage("in9", "user", "x", {"colour": "red"})])


def test_a_lanes_session_opens_with_its_window_exactly_as_stored(store):
    """The session and its window (one statement on PostgreSQL) give back every message after the
    newest summary's cut exactly as the transcript read gives them: text with quotes, newlines and
    non-Latin script, JSON with the same keys, order and numbers (the window is rendered into the
    model's prompt, whose bytes must not change from turn to turn), empty JSON as ``None``; and no
    more than ``window`` of them."""
    from gateway.store.sql import NewMessage

    session_id = store.new_session("k", "prompt", None)
    calls = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"q\": \"é\"}"}}]
    meta = {"time": 1764780000.123456, "z": 1, "a": [1.5e-07, None, True], "text": "line\n\"quoted\" 日本語"}
    ids = store.append_messages(session_id, [
        NewMessage("in1", "user", "first", {"meta": meta}),
        NewMessage("in1", "assistant", "cut here", {}),
        NewMessage("in2", "user", "Ünïcødé \"q\"\n\ttab 中文 🙂", {"meta": meta, "platform_message_id": "5:2"}),
        NewMessage("in2", "assistant", None, {"tool_calls": calls, "prompt_tokens": 3}),
        NewMessage("in2", "tool", "{\"ok\": true}", {"tool_call_id": "c1", "name": "f"}),
        NewMessage("in2", "assistant", "done", {"tool_calls": None, "meta": None})])
    store.save_summary(session_id, ids[1], "what came before")
    opened = store.open_session("k", lambda: "unused", 40)
    assert opened.session_id == session_id and opened.summary.covers_to_id == ids[1]
    assert opened.window == store.load_window(session_id, 40)[2:]
    assert [m.id for m in opened.window] == ids[2:]
    assert opened.window[0].meta == meta and list(opened.window[0].meta) == list(meta)
    assert opened.window[1].tool_calls == calls and opened.window[3].tool_calls is None
    assert [m.id for m in store.open_session("k", lambda: "unused", 3).window] == ids[3:]
    empty = store.new_session("k2", "prompt", None)
    assert store.open_session("k2", lambda: "unused", 40).window == [] and empty


def test_deleting_a_session_erases_what_its_turns_left_in_the_inbox_and_outbox(store):
    """``gateway sessions delete``: the transcript goes, and the user's words in the inbox and the
    replies in the outbox with it (those rows stay for deduplication until they are pruned)."""
    from sqlalchemy import select

    from gateway.store.models import InboxRow, OutboxRow, table
    from gateway.store.sql import NewMessage

    session_id = store.new_session("k", "prompt", None)
    other = store.new_session("k2", "prompt", None)
    for key, session, n in (("k", session_id, 1), ("k2", other, 2)):
        store.insert_inbound(message(f"5:{n}", chat=str(n), text=f"my secret plan {n}"), key)
        [pending] = store.next_pending(key)
        store.finish_turn([pending.inbox_id], "done", [OutboundMessage(ChatAddress("telegram", "1", str(n)),
                                                                       f"about your plan {n}", f"r{n}")],
                          session_id=session, session_key=key,
                          messages=[NewMessage(f"in{pending.inbox_id}", "user", f"my secret plan {n}", {}),
                                    NewMessage(f"in{pending.inbox_id}", "assistant", f"about your plan {n}", {})])
        [item] = store.claim_due("me", 10, 60).items
        store.mark_sent(item.id, "me", ["p"])
    assert store.delete_session(session_id)
    with store.engine.connect() as conn:
        inbox = [str(p) for p in conn.execute(select(table(InboxRow).c.payload)).scalars()]
        outbox = list(conn.execute(select(table(OutboxRow).c.text)).scalars())
    assert not any("plan 1" in p for p in inbox) and any("my secret plan 2" in p for p in inbox)
    assert "about your plan 1" not in outbox and "about your plan 2" in outbox and len(outbox) == 2
