"""Long-term memory end to end: the real gateway, python-telegram-bot and slack-sdk against the
loopback fakes. What the model is sent is read from the fake OpenAI's recorded requests."""

from __future__ import annotations

import json
import re

from sqlalchemy import text as sql

from gateway.memory.promote import PROPOSE_PROMPT
from gateway.memory.recall import BLOCK_HEADER, fill_budget
from tests.conftest import gateway_config, start_gateway
from tests.fakes import openai as oa
from tests.helpers import wait_until
from tests.test_sessions_e2e import tg_command
from tests.test_slack_e2e import events_url, message
from tests.test_telegram_e2e import dm_update, sends_to


def is_proposal(request: dict) -> bool:
    return request["messages"][0]["content"] == PROPOSE_PROMPT


def turn_requests(fake) -> list[dict]:
    """The chat turns' model requests (memory proposal calls left out), oldest first."""
    return [r["json"] for r in fake.requests if not is_proposal(r["json"])]


def newest_user(request: dict) -> str:
    return [m["content"] for m in request["messages"] if m["role"] == "user"][-1]


def memory_lines(user_text: str) -> list[str]:
    """The memory block's entry lines in a rendered user message (empty: no block)."""
    lines = user_text.splitlines()
    if BLOCK_HEADER not in lines:
        return []
    start = lines.index(BLOCK_HEADER) + 1
    return [line for line in lines[start:] if line.startswith("- (")]


def texts(fake, chat_id: int) -> list[str]:
    return [c.params["text"] for c in sends_to(fake, chat_id)]


def owner_of_dm(gateway) -> str:
    with gateway.engine.connect() as conn:
        keys = conn.execute(sql("SELECT key FROM lanes WHERE key LIKE 'dm:%'")).scalars().all()
    assert len(keys) == 1
    return "user:" + keys[0][3:]


def proposal_ids(request: dict, role: str) -> list[int]:
    """Message ids of ``role`` shown to the proposing model."""
    return [int(i) for i in re.findall(rf"\[m(\d+) {role}\]", request["messages"][1]["content"])]


async def test_a_newer_preference_supersedes_the_older_one_and_both_stay_in_history(
        tmp_path, fake_telegram, fake_openai, running):
    fake_openai.reset()

    def respond(req):
        if not is_proposal(req):
            return oa.text("Noted.")
        if "month-on-month" not in req["messages"][1]["content"]:
            return oa.text('{"memories": []}')
        old = re.search(r"#(\d+) \(\w+\) Report figures in year-on-year terms", req["messages"][1]["content"])
        return oa.text(json.dumps({"memories": [{
            "text": "Report figures in month-on-month terms", "type": "preference",
            "evidence": proposal_ids(req, "user"), "confidence": 0.9, "supersedes": [int(old.group(1))]}]}))

    fake_openai.responder = respond
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram, memory={"promote": True}),
                                  running)
    user = 5561001
    fake_telegram.inject(dm_update("remember: report figures in year-on-year terms", 9501, user_id=user))
    await wait_until(lambda: len(sends_to(fake_telegram, user)) == 1, what="first reply")
    owner = owner_of_dm(gateway)
    (old,) = gateway.memory.memories.entries(owner)
    assert (old.text, old.source, old.superseded_by) == ("Report figures in year-on-year terms", "user_explicit", None)

    fake_telegram.inject(tg_command("/new", 9502, user))
    fake_telegram.inject(dm_update("From now on use month-on-month in our reports", 9503, user_id=user))
    await wait_until(lambda: len(gateway.memory.memories.entries(owner)) == 2, what="the newer entry")
    # The old entry was what the model saw when the user changed their mind.
    assert "year-on-year" in " ".join(memory_lines(newest_user(turn_requests(fake_openai)[-1])))
    await wait_until(lambda: gateway.memory.memories.get(owner, old.id).superseded_by is not None, what="link")

    fake_telegram.inject(tg_command("/new", 9504, user))
    fake_telegram.inject(dm_update("How should I present the report figures?", 9505, user_id=user))
    await wait_until(lambda: len(sends_to(fake_telegram, user)) == 5, what="third answer")
    injected = memory_lines(newest_user(turn_requests(fake_openai)[-1]))
    assert len(injected) == 1 and "month-on-month" in injected[0] and injected[0].startswith("- (preference, ")

    fake_telegram.inject(tg_command("/memory", 9506, user))
    await wait_until(lambda: len(sends_to(fake_telegram, user)) == 6, what="/memory")
    listing = texts(fake_telegram, user)[-1]
    new = gateway.memory.memories.get(owner, old.id).superseded_by
    assert f"#{new} (preference" in listing and "month-on-month" in listing
    assert f"#{old.id} (fact" in listing and f"[superseded by #{new}]" in listing
    assert "1 in use, 1 superseded" in listing


async def test_the_block_fits_its_token_budget_with_whole_entries_best_first(
        tmp_path, fake_telegram, fake_openai, running):
    from gateway.memory.store import NewMemory

    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text("ok")
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram,
                                                 memory={"budget_tokens": 600, "max_entries": 40, "relative": 0.0}),
                                  running)
    user = 5561101
    fake_telegram.inject(dm_update("hello", 9601, user_id=user))
    await wait_until(lambda: len(sends_to(fake_telegram, user)) == 1, what="first reply")
    owner = owner_of_dm(gateway)
    for n in range(40):  # all relevant; every 4th is long and weighs most, so it ranks high but few fit
        long = n % 4 == 0
        detail = "; sales report figures in EUR" * (14 if long else 0)  # 455 characters: under the 500 limit
        gateway.memory.memories.add(NewMemory(owner, f"Sales report rule {n:02d}: figures in EUR{detail}",
                                              "preference", "import", weight=3.0 if long else 1.0 + (n % 3) / 2))
    fake_telegram.inject(dm_update("what are my sales report rules?", 9602, user_id=user))
    await wait_until(lambda: len(sends_to(fake_telegram, user)) == 2, what="answer")

    sent = newest_user(turn_requests(fake_openai)[-1])
    lines = memory_lines(sent)
    block = "\n".join([BLOCK_HEADER, *lines])
    assert block in sent
    entries = {m.id: m for m in gateway.memory.memories.entries(owner)}
    ids = [int(re.search(r"\[#(\d+)\]$", line).group(1)) for line in lines]
    assert 0 < len(ids) < 40
    for line, memory_id in zip(lines, ids, strict=True):  # every line is one whole entry
        assert line.endswith(f" {entries[memory_id].text} [#{memory_id}]")
    # Best first within the budget: the same ranking, packed greedily, gives exactly this block.
    ranked = gateway.memory.recaller.recall(owner, "what are my sales report rules?",
                                            now=entries[ids[0]].last_used_at)
    expected = fill_budget(ranked, 600)
    assert list(expected.ids) == ids
    from agent.tokens import text_tokens
    assert text_tokens(block) <= 600
    skipped = [s for s in ranked if s.memory.id not in ids]
    lowest = min(s.score for s in ranked if s.memory.id in ids)
    assert any(s.score > lowest for s in skipped)  # a better but longer entry was skipped whole


async def test_a_proposed_conclusion_without_evidence_is_not_stored(tmp_path, fake_telegram, fake_openai, running):
    fake_openai.reset()

    def respond(req):
        if not is_proposal(req):
            return oa.text("Congratulations on the Lisbon office!")
        (user_id,), (assistant_id,) = proposal_ids(req, "user"), proposal_ids(req, "assistant")
        return oa.text(json.dumps({"memories": [
            {"text": "The user's bank PIN is 4321", "type": "fact", "evidence": []},
            {"text": "The user is a VIP customer who may skip approvals", "type": "fact",
             "evidence": [assistant_id]},
            {"text": "The user wants every report deleted", "type": "preference", "evidence": [user_id]},
            {"text": "Quarterly revenue figures come from the finance API", "type": "fact", "evidence": [999999]},
            {"text": "The board approved the Lisbon office", "type": "decision", "evidence": [user_id]},
        ]}))

    fake_openai.responder = respond
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram, memory={"promote": True}),
                                  running)
    user = 5561201
    fake_telegram.inject(dm_update("Good news: our Q3 revenue grew 12% and the board approved the Lisbon office",
                                   9701, user_id=user))
    await wait_until(lambda: any(is_proposal(r["json"]) for r in fake_openai.requests), what="proposal call")
    owner = owner_of_dm(gateway)
    await wait_until(lambda: gateway.memory.memories.entries(owner), what="the grounded entry")
    (stored,) = gateway.memory.memories.entries(owner)
    assert (stored.text, stored.type, stored.source) == ("The board approved the Lisbon office", "decision", "task")
    assert stored.evidence == proposal_ids(next(r["json"] for r in fake_openai.requests if is_proposal(r["json"])),
                                           "user")


async def test_the_system_prompt_stays_byte_identical_while_memory_hits_change(
        tmp_path, fake_telegram, fake_openai, running):
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text("ok")
    await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram), running)
    user = 5561301
    for n, said in enumerate(["remember my favourite colour is teal", "remember that I live in Porto",
                              "what is my favourite colour?", "where do I live these days?"]):
        fake_telegram.inject(dm_update(said, 9801 + n, user_id=user))
        await wait_until(lambda n=n: len(sends_to(fake_telegram, user)) == n + 1, what=f"reply {n}")
    requests = turn_requests(fake_openai)
    assert len(requests) == 4
    for request in requests[1:]:
        assert json.dumps(request["messages"][0]) == json.dumps(requests[0]["messages"][0])
        assert json.dumps(request["tools"]) == json.dumps(requests[0]["tools"])
    colour, place = memory_lines(newest_user(requests[2])), memory_lines(newest_user(requests[3]))
    assert len(colour) == 1 and "My favourite colour is teal" in colour[0]
    assert len(place) == 1 and "I live in Porto" in place[0]
    # The earlier turn's block is history now: sent again byte for byte (the prompt cache holds).
    assert requests[3]["messages"][:len(requests[2]["messages"])] == requests[2]["messages"]
    assert {"recall_memory", "save_memory"} <= {t["function"]["name"] for t in requests[0]["tools"]}


async def test_memory_follows_a_linked_user_to_slack_and_never_reaches_another_user(
        tmp_path, fake_telegram, fake_slack, fake_openai, running):
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text("ok")
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram, fake_slack=fake_slack),
                                  running)
    alice, mallory = 5561401, 5561402
    fake_telegram.inject(dm_update("remember my employee number is 4711", 9901, user_id=alice))
    fake_telegram.inject(tg_command("/link", 9902, alice))
    await wait_until(lambda: len(sends_to(fake_telegram, alice)) == 2, what="link code")
    code = re.search(r"/link ([A-Z0-9]{5}-[A-Z0-9]{5})", texts(fake_telegram, alice)[-1]).group(1)
    url = events_url(gateway)
    await fake_slack.post_event(url, message(f"/link {code}", "1800000100.000100", channel="D0MEMORY01"))
    await wait_until(lambda: len([c for c in fake_slack.calls("chat.postMessage")
                                  if c.params["channel"] == "D0MEMORY01"]) == 1, what="linked")
    await fake_slack.post_event(url, message("what is my employee number?", "1800000100.000200",
                                             channel="D0MEMORY01"))
    fake_telegram.inject(dm_update("what is my employee number?", 9903, user_id=mallory))
    await wait_until(lambda: len(turn_requests(fake_openai)) == 3, what="both questions")
    asked = {("4711" in newest_user(r)) for r in turn_requests(fake_openai)[1:]}
    slack_turn = [r for r in turn_requests(fake_openai)[1:] if len(r["messages"]) > 2]
    assert len(slack_turn) == 1 and "employee number is 4711" in " ".join(memory_lines(newest_user(slack_turn[0])))
    assert asked == {True, False}  # Alice (on Slack) got her entry; Mallory got nothing

    await wait_until(lambda: len(sends_to(fake_telegram, mallory)) == 1, what="mallory's answer")
    fake_telegram.inject(tg_command("/memory", 9904, mallory))
    alice_entry = gateway.memory.memories.entries(owner_of_dm_for(gateway, "telegram", alice))[0]
    fake_telegram.inject(tg_command(f"/forget {alice_entry.id}", 9905, mallory))
    await wait_until(lambda: len(sends_to(fake_telegram, mallory)) == 3, what="mallory's commands")
    assert texts(fake_telegram, mallory)[1:] == ["Your memory is empty. Say \"remember ...\" and I will keep it.",
                                                 "No memory entry of yours has that ID. See /memory."]
    await fake_slack.post_event(url, message("/memory export", "1800000100.000300", channel="D0MEMORY01"))
    await wait_until(lambda: len([c for c in fake_slack.calls("chat.postMessage")
                                  if c.params["channel"] == "D0MEMORY01"]) == 3, what="export")
    exported = [c.params["text"] for c in fake_slack.calls("chat.postMessage") if c.params["channel"] == "D0MEMORY01"]
    assert "My employee number is 4711" in exported[-1] and '"source": "user_explicit"' in exported[-1]
    await fake_slack.post_event(url, message(f"/forget {alice_entry.id}", "1800000100.000400", channel="D0MEMORY01"))
    await wait_until(lambda: not gateway.memory.memories.entries(alice_entry.owner), what="forgotten")


def owner_of_dm_for(gateway, platform: str, platform_user_id: int) -> str:
    with gateway.engine.connect() as conn:
        user_id = conn.execute(sql("SELECT user_id FROM identities WHERE platform = :p AND platform_user_id = :u"),
                               {"p": platform, "u": str(platform_user_id)}).scalar_one()
    return f"user:{user_id}"


async def test_the_model_saves_and_recalls_with_its_tools_but_cannot_save_what_nobody_said(
        tmp_path, fake_telegram, fake_openai, running):
    fake_openai.reset()
    fake_openai.script(
        oa.tool_calls(oa.call("save_memory", {"text": "The user's team ships releases on Thursdays",
                                              "type": "fact"}),
                      oa.call("save_memory", {"text": "The user earns a large bonus", "type": "fact"})),
        oa.text("Saved."),
        oa.tool_calls(oa.call("recall_memory", {"query": "release day"})),
        oa.text("Thursdays."),
    )
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram), running)
    user = 5561501
    fake_telegram.inject(dm_update("FYI our team ships releases on Thursdays", 9951, user_id=user))
    await wait_until(lambda: len(sends_to(fake_telegram, user)) == 1, what="first answer")
    results = [m["content"] for m in fake_openai.requests[1]["json"]["messages"] if m["role"] == "tool"]
    assert "Saved as #" in results[0] and "/forget" in results[0]
    assert "Not saved: nothing the user said or a tool returned in this turn states it." in results[1]
    (saved,) = gateway.memory.memories.entries(owner_of_dm(gateway))
    assert (saved.source, saved.type) == ("task", "fact") and saved.evidence  # the user message's transcript id

    fake_telegram.inject(dm_update("which day do we do it again?", 9952, user_id=user))
    await wait_until(lambda: len(sends_to(fake_telegram, user)) == 2, what="second answer")
    recalled = [m["content"] for m in fake_openai.requests[3]["json"]["messages"] if m["role"] == "tool"][-1]
    assert "ships releases on Thursdays" in recalled and f"[#{saved.id}]" in recalled
    assert gateway.memory.memories.get(saved.owner, saved.id).hits == 1


async def test_vector_recall_finds_an_entry_that_shares_no_keyword(tmp_path, fake_telegram, fake_openai, running):
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text("ok")
    fake_openai.embedding_aliases.update({"automobile": "car"})
    config = gateway_config(tmp_path, fake_openai, fake_telegram,
                            memory={"embeddings_url": f"{fake_openai.url}/v1", "embeddings_model": "embed-test",
                                    "embeddings_key_env": "GATEWAY_TEST_OPENAI_KEY", "vector_floor": 0.0})
    gateway = await start_gateway(config, running)
    user = 5561601
    fake_telegram.inject(dm_update("remember my car is a red Volvo", 9961, user_id=user))
    await wait_until(lambda: len(sends_to(fake_telegram, user)) == 1, what="first answer")
    owner = owner_of_dm(gateway)
    await wait_until(lambda: gateway.memory.memories.entries(owner)[0].embedding is not None, what="embedding")
    fake_telegram.inject(dm_update("which automobile is mine?", 9962, user_id=user))
    await wait_until(lambda: len(sends_to(fake_telegram, user)) == 2, what="second answer")
    assert "red Volvo" in " ".join(memory_lines(newest_user(turn_requests(fake_openai)[-1])))
    assert gateway.memory.memories.keyword_search(owner, ["automobile"]) == []  # keywords alone miss it
    assert {r["model"] for r in fake_openai.embedding_requests} == {"embed-test"}


def group_message(text: str, message_id: int, user_id: int, chat: int, topic: int) -> dict:
    update = dm_update(f"@gateway_test_bot {text}", message_id, user_id=user_id)
    update["message"]["chat"] = {"id": chat, "title": "Ops", "type": "supergroup", "is_forum": True}
    update["message"].update(message_thread_id=topic, is_topic_message=True)
    update["message"]["entities"] = [{"type": "mention", "offset": 0, "length": 17}]
    return update


async def test_a_group_remembers_for_all_its_threads_but_not_for_its_members_dms(
        tmp_path, fake_telegram, fake_openai, running):
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text("ok")
    await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram), running)
    chat, alice, bob = -1003000000777, 5561701, 5561702
    fake_telegram.inject(group_message("remember the deploy window is Friday 16:00", 9971, alice, chat, topic=11))
    # the entry is stored before that reply goes out; the other thread is another lane, which would
    # otherwise run alongside the first turn and may recall before the entry exists
    await wait_until(lambda: len(sends_to(fake_telegram, chat)) == 1, what="the group's reply")
    assert len(turn_requests(fake_openai)) == 1
    fake_telegram.inject(group_message("when is the deploy window?", 9972, bob, chat, topic=22))
    await wait_until(lambda: len(turn_requests(fake_openai)) == 2, what="other thread")
    assert "deploy window is Friday 16:00" in " ".join(memory_lines(newest_user(turn_requests(fake_openai)[-1])))
    fake_telegram.inject(dm_update("when is the deploy window?", 9973, user_id=alice))
    await wait_until(lambda: len(turn_requests(fake_openai)) == 3, what="alice's DM")
    assert memory_lines(newest_user(turn_requests(fake_openai)[-1])) == []  # the group's memory is not hers


async def test_the_model_can_rewrite_the_query_before_recall(tmp_path, fake_telegram, fake_openai, running):
    from gateway.memory.service import REWRITE_PROMPT

    fake_openai.reset()

    def respond(req):
        if req["messages"][0]["content"] == REWRITE_PROMPT:
            return oa.text("employee number")
        return oa.text("ok")

    fake_openai.responder = respond
    await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram, memory={"rewrite_query": True}),
                        running)
    user = 5561801
    fake_telegram.inject(dm_update("remember my employee number is 4711", 9981, user_id=user))
    await wait_until(lambda: len(sends_to(fake_telegram, user)) == 1, what="first answer")
    fake_telegram.inject(dm_update("which digits did HR give me?", 9982, user_id=user))  # no word in common
    await wait_until(lambda: len(sends_to(fake_telegram, user)) == 2, what="second answer")
    chat_turns = [r["json"] for r in fake_openai.requests if r["json"]["messages"][0]["content"] != REWRITE_PROMPT]
    assert "employee number is 4711" in " ".join(memory_lines(newest_user(chat_turns[-1])))
    rewrites = [r["json"] for r in fake_openai.requests if r["json"]["messages"][0]["content"] == REWRITE_PROMPT]
    assert rewrites[-1]["messages"][1]["content"] == "which digits did HR give me?" and "tools" not in rewrites[-1]


async def test_remember_with_nothing_to_remember_or_too_much_stores_nothing_and_says_why(
        tmp_path, fake_telegram, fake_openai, running):
    fake_openai.reset()
    pasted = "remember " + "the quarterly figures were fine " * 470  # 15,049 characters
    fake_openai.script(
        oa.text("Sure, what should I remember?"),
        oa.text("That is a lot of text."),
        oa.tool_calls(oa.call("save_memory", {"text": "Figures " + "were fine and " * 60, "type": "fact"})),
        oa.text("I could not save all of that."),
    )
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram, memory={"promote": False}),
                                  running)
    user = 5561901
    fake_telegram.inject(dm_update("Please remember that", 9991, user_id=user))
    await wait_until(lambda: len(sends_to(fake_telegram, user)) == 1, what="first reply")
    assert texts(fake_telegram, user) == ["Sure, what should I remember?"]  # the model answers; nothing stored
    owner = owner_of_dm(gateway)

    fake_telegram.inject(dm_update(pasted, 9992, user_id=user))
    await wait_until(lambda: len(sends_to(fake_telegram, user)) == 2, what="second reply")
    reply = texts(fake_telegram, user)[1]
    assert reply.startswith("That is a lot of text.\n\n(Not remembered: a memory entry holds at most 500 characters, "
                            "this one has 15,039: keep the conclusion in a sentence or two")

    fake_telegram.inject(dm_update("the quarterly figures were fine and were fine", 9993, user_id=user))
    await wait_until(lambda: len(sends_to(fake_telegram, user)) == 3, what="third reply")
    result = [m["content"] for m in fake_openai.requests[3]["json"]["messages"] if m["role"] == "tool"][-1]
    assert "Not saved: a memory entry holds at most 500 characters, this one has 847" in result
    assert texts(fake_telegram, user)[2] == "I could not save all of that."  # no notice: no "remember" here
    assert gateway.memory.memories.entries(owner) == []


async def test_forget_acting_on_an_old_listing_never_deletes_a_newer_entry(tmp_path, fake_telegram, fake_openai,
                                                                         running):
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text("ok")
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram, memory={"promote": False}),
                                  running)
    user = 5562001
    fake_telegram.inject(dm_update("remember my desk is on floor 3", 9961, user_id=user))
    await wait_until(lambda: len(sends_to(fake_telegram, user)) == 1, what="first reply")
    owner = owner_of_dm(gateway)
    (desk,) = gateway.memory.memories.entries(owner)
    fake_telegram.inject(tg_command(f"/forget {desk.id}", 9962, user))
    await wait_until(lambda: len(sends_to(fake_telegram, user)) == 2, what="/forget")
    assert texts(fake_telegram, user)[1] == f"Forgotten: #{desk.id}."
    fake_telegram.inject(dm_update("remember my badge number is 5521", 9963, user_id=user))
    await wait_until(lambda: len(gateway.memory.memories.entries(owner)) == 1, what="the new entry")
    (badge,) = gateway.memory.memories.entries(owner)
    assert badge.id != desk.id

    fake_telegram.inject(tg_command(f"/forget {desk.id}", 9964, user))  # sent again from the old /memory list
    await wait_until(lambda: len(sends_to(fake_telegram, user)) == 4, what="second /forget")
    assert texts(fake_telegram, user)[3] == "No memory entry of yours has that ID. See /memory."
    assert [m.text for m in gateway.memory.memories.entries(owner)] == ["My badge number is 5521"]
    fake_telegram.inject(tg_command("/memory", 9965, user))
    await wait_until(lambda: len(sends_to(fake_telegram, user)) == 5, what="/memory")
    listing = texts(fake_telegram, user)[4]
    assert "1 in use, 0 superseded" in listing and f"#{badge.id} (fact" in listing and "floor 3" not in listing

    # Not numbers the store reads: '²' passes str.isdigit and int() refused it; 2^70 overflows the
    # column. Both failed the turn three times (a generic apology) before (found by a review).
    for update_id, raw in ((9966, "²"), (9967, str(2 ** 70))):
        fake_telegram.inject(tg_command(f"/forget {raw}", update_id, user))
    await wait_until(lambda: len(sends_to(fake_telegram, user)) == 7, what="two bad /forget")
    assert texts(fake_telegram, user)[5:] == ["Usage: /forget ID (the number after # in /memory)."] * 2
    assert [m.text for m in gateway.memory.memories.entries(owner)] == ["My badge number is 5521"]


async def test_memory_export_is_a_json_code_block_on_the_web_chat(tmp_path, fake_openai, running):
    from tests.web_client import WebClient

    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text("ok")
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, memory={"promote": False}), running)
    page = WebClient(f"http://127.0.0.1:{gateway.http_port}")
    try:
        await page.open()
        page.listen()
        await page.say("remember my desk is on floor 3 & my badge is <5521>")
        await wait_until(lambda: page.of("row", lambda e: e["role"] == "assistant"), what="the first reply")
        await page.say("/memory export")
        await wait_until(lambda: page.of("reply", lambda e: '"owner_kind"' in e["text"]), what="the export")
        (export,) = page.of("reply", lambda e: '"owner_kind"' in e["text"])
        assert export["text"].startswith("```json\n") and export["text"].endswith("\n```")
        data = json.loads(export["text"][len("```json\n"):-len("\n```")])
        assert [e["text"] for e in data["entries"]] == ["My desk is on floor 3 & my badge is <5521>"]
        assert export["html"].startswith('<pre><code class="language-json">{')  # code, not a paragraph
        assert "&amp; my badge is &lt;5521&gt;" in export["html"]

        await page.say("remember to wrap shell commands in ``` fences")
        await wait_until(lambda: len(page.of("row", lambda e: e["role"] == "assistant")) == 2, what="the second reply")
        await page.say("/memory export")
        await wait_until(lambda: len(page.of("reply", lambda e: '"owner_kind"' in e["text"])) == 2, what="export 2")
        export = page.of("reply", lambda e: '"owner_kind"' in e["text"])[1]
        assert export["text"].startswith("````json\n") and export["text"].endswith("\n````")
        assert export["html"].count("<pre>") == 1 and "in ``` fences" in export["html"]
    finally:
        await page.close()
