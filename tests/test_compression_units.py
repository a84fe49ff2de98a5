"""Units of the context window: token estimate, sequence repair, cut points, bounded loading."""

from __future__ import annotations

import itertools
import json
import random

import pytest
from sqlalchemy import event

from agent.bridge import AsyncBridge
from agent.loop import Limits, run_turn
from agent.model import OpenAIChatModel
from agent.sequence import INTERRUPTED, problems, repair
from agent.tokens import json_tokens, message_tokens, request_tokens, text_tokens
from agent.tools import ToolRegistry
from gateway.bus.compression import SUMMARY_HEADER, SUMMARY_PROMPT, Compressor, split_turns
from gateway.core.window import WindowPolicy
from gateway.media.render import ImagePolicy
from gateway.store.db import create_db_engine, upgrade
from gateway.store.sql import NewMessage, Store
from tests.fakes import openai as oa


def tc(*ids: str) -> dict:
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}} for i in ids]}


def tr(call_id: str, content: str = "ok") -> dict:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


U = {"role": "user", "content": "q"}
A = {"role": "assistant", "content": "a"}


# -- token estimate -------------------------------------------------------------------------------

@pytest.mark.parametrize("content", ["hello world " * 50, "天气很好，" * 40, "emoji 🙂" * 30])
def test_estimate_is_never_below_the_fakes_count(content):
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": content}]
    fake = len("".join(json.dumps(m, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
                       for m in messages)) // 4
    assert request_tokens(messages) >= fake
    assert text_tokens("abcd") == 1 and text_tokens("abcde") == 2
    assert message_tokens({"role": "user", "content": ""}) > 0


@pytest.mark.parametrize("obj", [
    {"role": "user", "content": "天气很好 🙂 \u2028 </script> \"quoted\" \\ \n", "name": "é"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "function": {"arguments": "{\"a\": 1.5}"}}]},
    [{"type": "object", "properties": {"n": {"type": "integer", "minimum": -3, "default": 0.25}}}, True, None],
    {1: "a key that is not a string", "big": 2 ** 70},  # what orjson refuses is counted through json
])
def test_the_estimate_counts_the_bytes_of_compact_json(obj):
    wire = json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()
    assert json_tokens(obj) == -(-len(wire) // 4)


# -- validator ------------------------------------------------------------------------------------

@pytest.mark.parametrize("messages, expected", [
    ([U, tc("c1"), tr("c1"), A], [U, tc("c1"), tr("c1"), A]),  # valid: unchanged
    ([U, tr("c0"), A], [U, A]),  # orphan tool message dropped
    ([U, tc("c1", "c2"), tr("c2"), U], [U, tc("c1", "c2"), tr("c2"), tr("c1", INTERRUPTED), U]),
    ([U, tc("c1"), tr("c1"), tr("c1", "again"), A], [U, tc("c1"), tr("c1"), A]),  # duplicate answer
    ([U, tc("c1"), U, tr("c1")], [U, tc("c1"), tr("c1", INTERRUPTED), U]),  # a late result is an orphan
    ([U, tc("c1")], [U, tc("c1"), tr("c1", INTERRUPTED)]),  # trailing call answered
])
def test_repair_makes_every_sequence_valid(messages, expected):
    fixed = repair(messages)
    assert fixed == expected
    assert problems(fixed) == []
    oa.validate_chat_request({"model": "m", "messages": fixed})  # the fake accepts it
    assert (problems(messages) == []) == (fixed == messages)


def test_repair_can_leave_the_newest_calls_to_the_loop():
    assert repair([U, tc("c1", "c2"), tr("c1")], keep_trailing_calls=True) == [U, tc("c1", "c2"), tr("c1")]
    assert problems([U, tc("c1", "c2"), tr("c1")]) == ["messages[1]: tool call 'c2' has no answer"]


def test_the_loop_repairs_an_invalid_history_instead_of_sending_it(fake_openai):
    fake_openai.reset()
    fake_openai.script("fine")
    model = OpenAIChatModel(base_url=f"{fake_openai.url}/v1", api_key="sk-test", model="gpt-4o-mini",
                            max_retries=0)
    bridge = AsyncBridge()
    bridge.start()
    try:
        history = [U, tr("ghost"), tc("c1", "c2"), tr("c1"), A, {"role": "user", "content": "now?"}]
        out = run_turn(system_prompt="s", history=history, model=model, tools=ToolRegistry(), bridge=bridge,
                       limits=Limits(), record=lambda *a: None)
    finally:
        bridge.stop()
    assert out.reply == "fine"
    sent = fake_openai.last_request["json"]["messages"]
    assert fake_openai.last_request["status"] == 200
    assert {"role": "tool", "tool_call_id": "c2", "content": INTERRUPTED} in sent
    assert all(m.get("tool_call_id") != "ghost" for m in sent)


# -- cut points -----------------------------------------------------------------------------------

@pytest.fixture
def store(tmp_path):
    engine = create_db_engine(f"sqlite:///{tmp_path / 'u.db'}")
    upgrade(engine)
    yield Store(engine)
    engine.dispose()


def random_turns(rng: random.Random, n: int, start: int = 0) -> list[NewMessage]:
    """``n`` turns: user, then 0-3 tool steps (1-3 parallel calls each, some results missing as
    after a crash), then an answer."""
    rows: list[NewMessage] = []
    for t in range(start, start + n):
        turn = f"t{t}"
        rows.append(NewMessage(turn, "user", f"question {t} " + "x" * rng.randint(10, 300), {}))
        for s in range(rng.randint(0, 3)):
            ids = [f"c{t}_{s}_{k}" for k in range(rng.randint(1, 3))]
            calls = [{"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}} for i in ids]
            rows.append(NewMessage(turn, "assistant", None, {"tool_calls": calls}))
            for i in ids:
                if rng.random() > 0.1:
                    rows.append(NewMessage(turn, "tool", "r" * rng.randint(5, 400), {"tool_call_id": i}))
        rows.append(NewMessage(turn, "assistant", "answer " + "y" * rng.randint(5, 200), {}))
    return rows


@pytest.mark.parametrize("seed", range(12))
def test_cuts_never_split_tool_calls_from_their_results(store, fake_openai, seed):
    fake_openai.reset()
    fake_openai.responder = lambda body: "summary of earlier turns"
    model = OpenAIChatModel(base_url=f"{fake_openai.url}/v1", api_key="sk-test", model="gpt-4o-mini",
                            max_retries=0, stream=False)
    rng = random.Random(seed)
    session_id = store.new_session(f"k{seed}", "system", None)
    store.append_messages(session_id, random_turns(rng, 40))
    policy = WindowPolicy(context_window_tokens=rng.choice([1500, 3000, 6000]))
    compressor = Compressor(store, policy, row_limit=rng.choice([30, 80, 400]))
    for round_ in range(3):  # compress repeatedly, as later turns would
        opened = store.open_session(f"k{seed}", lambda: "system", compressor.row_limit)
        projection = compressor.project(session_id=session_id, system_prompt="system", tools=[],
                                        summary=opened.summary, window=list(opened.window), model=model)
        messages = [{"role": "system", "content": "system"}, *projection.history]
        assert problems(messages) == []
        oa.validate_chat_request({"model": "m", "messages": messages})
        body = projection.history[1:] if projection.summary else projection.history
        assert body[0]["role"] == "user" and not body[0]["content"].startswith(SUMMARY_HEADER)
        summary = store.latest_summary(session_id)
        if summary is not None:
            transcript = store.transcript(session_id)
            after = [m for m in transcript if m.id > summary.covers_to_id]
            assert after and after[0].role == "user"  # the cut is a turn boundary
            before_ids = {c["id"] for m in transcript if m.id <= summary.covers_to_id for c in m.tool_calls or ()}
            assert not any(m.tool_call_id in before_ids for m in after)
        store.append_messages(session_id, random_turns(rng, 5, start=40 + 5 * round_))
    assert any(SUMMARY_PROMPT[:30] in str(r["json"]["messages"][0]["content"]) for r in fake_openai.requests)


def test_split_turns_starts_at_user_messages(store):
    session_id = store.new_session("k", "s", None)
    leading = [NewMessage("t", "tool", "orphan", {"tool_call_id": "x"}), NewMessage("t", "assistant", "late", {})]
    store.append_messages(session_id, [*leading, *random_turns(random.Random(1), 3)])
    turns = split_turns(store.transcript(session_id))
    assert len(turns) == 3 and all(turn[0].role == "user" for turn in turns)
    assert all(row.role != "user" for turn in turns for row in turn[1:])


# -- bounded loading ------------------------------------------------------------------------------

@pytest.mark.parametrize("total", [100, 10_000])
def test_loading_a_session_reads_a_bounded_number_of_rows(store, total):
    session_id = store.new_session("k", "s", None)
    rows = [NewMessage(f"t{i // 2}", "user" if i % 2 == 0 else "assistant", f"m{i}", {}) for i in range(total)]
    ids = store.append_messages(session_id, rows)
    store.save_summary(session_id, ids[total // 2 - 1], "the first half")
    statements: list[str] = []

    def capture(conn, cursor, statement, parameters, context, executemany):
        statements.append(statement)

    event.listen(store.engine, "before_cursor_execute", capture)
    try:
        opened = store.open_session("k", lambda: "s", 50)
    finally:
        event.remove(store.engine, "before_cursor_execute", capture)
    assert opened.summary is not None and opened.summary.text == "the first half"
    assert len(opened.window) == 50 and opened.window[-1].content == f"m{total - 1}"
    assert all(m.id > opened.summary.covers_to_id for m in opened.window)
    reads = [s for s in statements if "FROM messages" in s or "FROM summaries" in s]
    assert len(reads) == 2 and all("LIMIT" in s for s in reads)  # one bounded read of each


def test_only_rows_after_the_summary_cut_are_loaded(store):
    session_id = store.new_session("k", "s", None)
    ids = store.append_messages(session_id, [NewMessage("t", "user", f"m{i}", {}) for i in range(10)])
    store.save_summary(session_id, ids[6], "older")
    opened = store.open_session("k", lambda: "s", 50)
    assert [m.content for m in opened.window] == ["m7", "m8", "m9"]


def test_a_large_system_prompt_and_tool_schemas_still_leave_headroom_after_compressing(store, fake_openai):
    """The kept turns are budgeted with the fixed cost of every request (system prompt + tools)
    counted, so after one summary the next turns fit without summarising again at once."""
    fake_openai.reset()
    fake_openai.responder = lambda body: "summary of earlier turns"
    model = OpenAIChatModel(base_url=f"{fake_openai.url}/v1", api_key="sk-test", model="gpt-4o-mini",
                            max_retries=0, stream=False)
    system = "You are a careful assistant. " * 120  # about 700 tokens, sent with every request
    tools = [{"type": "function", "function": {"name": f"tool_{i}", "description": "does a thing " * 10,
                                               "parameters": {"type": "object", "properties": {}}}}
             for i in range(6)]
    policy = WindowPolicy(context_window_tokens=4000)
    compressor = Compressor(store, policy, row_limit=400)
    session_id = store.new_session("big-prefix", system, None)
    summaries = []
    for turn in range(30):
        store.append_messages(session_id, [NewMessage(f"t{turn}", "user", f"question {turn} " + "q" * 240, {}),
                                           NewMessage(f"t{turn}", "assistant", "answer " + "a" * 240, {})])
        opened = store.open_session("big-prefix", lambda: system, compressor.row_limit)
        projection = compressor.project(session_id=session_id, system_prompt=system, tools=tools,
                                        summary=opened.summary, window=list(opened.window), model=model)
        assert projection.tokens <= policy.compress_at
        if projection.compressed:
            summaries.append(turn)
    assert len(summaries) >= 2
    assert min(b - a for a, b in itertools.pairwise(summaries)) >= 3  # never on consecutive turns


# -- images in the window ---------------------------------------------------------------------------

def _photo_turns(count: int) -> list[NewMessage]:
    """``count`` turns, each a user photo (an image rendition stored) and a short answer."""
    rows = []
    for t in range(count):
        photo = {"kind": "image", "mime_type": "image/jpeg", "size": 90_000, "sha256": f"{t:064x}",
                 "image": {"sha256": f"{t + 1000:064x}", "width": 1280, "height": 960}}
        rows.append(NewMessage(f"t{t}", "user", f"what is in photo {t}?", {"meta": {"attachments": [photo]}}))
        rows.append(NewMessage(f"t{t}", "assistant", f"a cat, number {t}", {}))
    return rows


def test_a_window_full_of_photos_is_estimated_as_it_is_sent(store, fake_openai):
    """Only the newest ``history_images`` photos go along as pixels; the older ones are a line of
    text each. The estimate is that of the request sent, so thirty photos in a 16k window do not
    set off a summary (counted as pixels, they would be ~43k tokens)."""
    fake_openai.reset()
    model = OpenAIChatModel(base_url=f"{fake_openai.url}/v1", api_key="sk-test", model="gpt-4o-mini",
                            max_retries=0, stream=False)
    images = ImagePolicy(vision=True, history_images=4)
    compressor = Compressor(store, WindowPolicy(context_window_tokens=16_000), row_limit=400, images=images)
    session_id = store.new_session("photos", "system", None)
    store.append_messages(session_id, _photo_turns(30))
    opened = store.open_session("photos", lambda: "system", compressor.row_limit)
    projection = compressor.project(session_id=session_id, system_prompt="system", tools=[],
                                    summary=opened.summary, window=list(opened.window), model=model)
    sent_images = sum(1 for m in projection.history if isinstance(m["content"], list)
                      for part in m["content"] if part.get("type") == "image_url")
    assert sent_images == 5  # the newest turn's photo and four earlier ones
    assert not projection.compressed and fake_openai.requests == []  # no summary call
    assert len(projection.history) == 60
    system = message_tokens({"role": "system", "content": "system"})
    assert projection.tokens == system + request_tokens(projection.history)
    assert projection.tokens < 5 * 1_445 + 3_000
