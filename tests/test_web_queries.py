"""The web chat's transcript reader and the admin pages' queries on SQLite and PostgreSQL: who is in
which conversation, what a page shows, search (with LIKE wildcards in the query taken literally),
turns with their tool calls and token counts, users with their identities."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from adapters.web.inbound import message_from_post
from gateway.admin.queries import AdminQueries
from gateway.sessions.conversations import TranscriptReader
from gateway.sessions.directory import Directory
from gateway.store.db import create_db_engine
from gateway.store.models import InboxRow
from gateway.store.sql import NewMessage, Store


@pytest.fixture
def engine(db_url):
    engine = create_db_engine(db_url)
    yield engine
    engine.dispose()


async def no_pool(fn, *args):
    return fn(*args)


def test_the_reader_and_admin_queries_see_one_web_conversation(engine):
    store, directory = Store(engine), Directory(engine)
    message = message_from_post({"id": "web-msg-0001", "text": "100% of the_plan", "name": "<b>Ann</b>"}, "browser1")
    user_id = directory.identify(message).user_id
    key = f"dm:{user_id}"
    reader = TranscriptReader(engine, no_pool)
    assert reader.read_now("web", "web", "browser1", 0) == (None, [])  # no conversation before the first turn
    assert reader.read_now("web", "web", "someone-else", 0) == (None, [])

    assert store.insert_inbound(message, key, user_id=user_id)
    with engine.connect() as conn:
        inbox_id = conn.execute(select(func.max(InboxRow.__table__.c.id))).scalar_one()
    turn = f"in{inbox_id}"
    session_id = store.open_session(key, lambda: "system prompt", 10, user_id).session_id
    call = {"id": "call_1", "type": "function", "function": {"name": "web_fetch", "arguments": '{"url": "http://x"}'}}
    ids = store.append_messages(session_id, [
        NewMessage(turn, "user", "100% of the_plan", {"platform_message_id": "web-msg-0001"}),
        NewMessage(turn, "assistant", None, {"tool_calls": [call], "prompt_tokens": 100, "completion_tokens": 5}),
        NewMessage(turn, "tool", "page text", {"tool_call_id": "call_1"}),
        NewMessage(turn, "assistant", "It says **hi**.", {"prompt_tokens": 150, "completion_tokens": 7}),
    ])

    session, rows = reader.read_now("web", "web", "browser1", 0)
    assert session == session_id
    assert [(r["role"], r["text"], r["platform"], r["message_id"]) for r in rows] == [
        ("user", "100% of the_plan", "web", "web-msg-0001"), ("assistant", "It says **hi**.", "web", None)]
    assert reader.read_now("web", "web", "browser1", ids[-1]) == (session_id, [])

    queries = AdminQueries(engine)
    for query in ("", "100%", "THE_PLAN", session_id[:6], "dm:", "says **hi"):
        assert [s["id"] for s in queries.sessions(query)] == [session_id], query
    for query in ("1000%", "the-plan", "x_y"):  # % and _ are literal characters, not wildcards
        assert queries.sessions(query) == [], query
    listed = queries.sessions()[0]
    assert (listed["messages"], listed["prompt_tokens"], listed["completion_tokens"]) == (4, 250, 12)
    assert listed["title"] == "100% of the_plan"

    opened = queries.session(session_id)
    assert opened is not None and queries.session("0" * 32) is None
    (only,) = opened["turns"]
    assert (only["turn_id"], only["platform"], only["prompt_tokens"], only["completion_tokens"]) == \
        (turn, "web", 250, 12)
    calls, result = only["messages"][1], only["messages"][2]
    assert calls["calls"] == [{"id": "call_1", "name": "web_fetch", "arguments": '{\n  "url": "http://x"\n}'}]
    assert (result["role"], result["tool_name"], result["content"]) == ("tool", "web_fetch", "page text")

    (user,) = queries.users("<b>ann")
    assert user["id"] == user_id and [(i["platform"], i["display_name"]) for i in user["identities"]] == \
        [("web", "<b>Ann</b>")]
    assert queries.users("nobody") == [] and queries.pending_approvals() == []
