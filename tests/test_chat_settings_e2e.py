"""Per-chat settings end to end, through python-telegram-bot and the openai SDK against the fakes:
``[[chats]]`` rules choose a chat's persona, route and toolset; admins change the model, persona and
busy policy in the chat; a change reaches the chat's next session while the running one keeps its
byte-identical system prompt and tools; overrides survive a restart (stored in ``chat_settings``)."""

from __future__ import annotations

import threading

from tests.conftest import gateway_config, start_gateway
from tests.fakes import openai as oa
from tests.helpers import wait_until
from tests.test_sessions_e2e import tg_command, tg_texts
from tests.test_telegram_e2e import dm_update, sends_to

ADMINS = (5557001, 5557011, 5557021, 5557031)
"""One admin per test (the fake Bot API lives for the whole module: each test its own chats)."""
PIRATE = "Answer like a friendly pirate."


def config(tmp_path, fake_openai, fake_telegram, **sections):
    return gateway_config(tmp_path, fake_openai, fake_telegram,
                          access={"admins": [f"telegram:{a}" for a in ADMINS]},
                          llm={"routes": {"alt": {"models": ["default:gpt-4o"], "description": "the big one"}}},
                          **sections)


def requests_of(fake_openai, user_id: int) -> list[dict]:
    """The chat requests made for ``user_id``'s DM (its last user message carries the message)."""
    return [r["json"] for r in fake_openai.requests
            if any(m["role"] == "user" and f"#{user_id}" in str(m["content"]) for m in r["json"]["messages"])]


def system_prompt(request: dict) -> str:
    assert request["messages"][0]["role"] == "system"
    return request["messages"][0]["content"]


async def say(fake_telegram, user_id: int, text: str, message_id: int, replies: int) -> None:
    """Sends ``text`` from ``user_id`` in its DM and waits for the chat's ``replies``-th reply."""
    update = tg_command(text, message_id, user_id) if text.startswith("/") else dm_update(text, message_id, user_id)
    fake_telegram.inject(update)
    await wait_until(lambda: len(sends_to(fake_telegram, user_id)) >= replies, what=f"reply {replies} to {text!r}")


async def test_model_by_an_admin_changes_the_next_session_not_the_running_one_and_others_are_refused(
        tmp_path, fake_telegram, fake_openai, running):
    ADMIN, USER = 5557001, 5557002
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text("ok")
    gateway = await start_gateway(config(tmp_path, fake_openai, fake_telegram), running)

    # A user who is not an admin may ask, not change.
    await say(fake_telegram, USER, f"hello #{USER}", 9001, 1)
    await say(fake_telegram, USER, "/model alt", 9002, 2)
    assert tg_texts(fake_telegram, USER)[1] == "Only an admin can change this chat's settings."
    await say(fake_telegram, USER, "/model", 9003, 3)
    assert tg_texts(fake_telegram, USER)[2].startswith("Model of this chat: default (default:gpt-4o-mini)")
    await say(fake_telegram, USER, "/new", 9004, 4)
    await say(fake_telegram, USER, f"still small? #{USER}", 9005, 5)
    assert [r["model"] for r in requests_of(fake_openai, USER)] == ["gpt-4o-mini", "gpt-4o-mini"]

    # The admin's /model: the running session keeps its model and its prefix, the next one gets the new one.
    await say(fake_telegram, ADMIN, f"opening #{ADMIN}", 9101, 1)
    await say(fake_telegram, ADMIN, "/model nosuch", 9102, 2)
    assert "no model named 'nosuch'" in tg_texts(fake_telegram, ADMIN)[1]
    await say(fake_telegram, ADMIN, "/model alt", 9103, 3)
    answer = tg_texts(fake_telegram, ADMIN)[2]
    assert answer.startswith("The model of this chat is now alt (default:gpt-4o).") and "next conversation" in answer
    await say(fake_telegram, ADMIN, f"second #{ADMIN}", 9104, 4)
    await say(fake_telegram, ADMIN, "/new", 9105, 5)
    await say(fake_telegram, ADMIN, f"third #{ADMIN}", 9106, 6)
    await say(fake_telegram, ADMIN, "/status", 9109, 7)
    assert tg_texts(fake_telegram, ADMIN)[6].startswith("Model: gpt-4o\n")  # the conversation's model
    first, second, third = requests_of(fake_openai, ADMIN)
    assert [first["model"], second["model"], third["model"]] == ["gpt-4o-mini", "gpt-4o-mini", "gpt-4o"]
    assert second["messages"][0] == first["messages"][0] and second["tools"] == first["tools"]  # byte-stable
    assert "opening" not in str(third["messages"][1:])  # a new session

    # Stored in the database: a restarted gateway keeps the chat's choice; other chats keep the default.
    await gateway.stop()
    running.remove(gateway)
    await start_gateway(config(tmp_path, fake_openai, fake_telegram), running)
    await say(fake_telegram, ADMIN, "/new", 9107, 8)
    await say(fake_telegram, ADMIN, f"after restart #{ADMIN}", 9108, 9)
    await say(fake_telegram, USER, "/new", 9006, 6)
    await say(fake_telegram, USER, f"and me? #{USER}", 9007, 7)
    assert requests_of(fake_openai, ADMIN)[-1]["model"] == "gpt-4o"
    assert requests_of(fake_openai, USER)[-1]["model"] == "gpt-4o-mini"


async def test_a_persona_from_chats_reaches_only_that_chat_s_new_sessions(tmp_path, fake_telegram, fake_openai,
                                                                         running):
    ADMIN, USER, OTHER = 5557011, 5557012, 5557013
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text("ok")
    await start_gateway(config(tmp_path, fake_openai, fake_telegram, personas={"pirate": PIRATE},
                               chats=[{"platform": "telegram", "chat": str(USER), "persona": "pirate"}]), running)
    await say(fake_telegram, USER, f"ahoy #{USER}", 9201, 1)
    await say(fake_telegram, OTHER, f"hello #{OTHER}", 9301, 1)
    pirate, plain = requests_of(fake_openai, USER)[0], requests_of(fake_openai, OTHER)[0]
    assert system_prompt(pirate).endswith(f"\n\n{PIRATE}") or f"\n\n{PIRATE}\n\n" in system_prompt(pirate)
    assert PIRATE not in system_prompt(plain)
    assert system_prompt(pirate).replace(f"\n\n{PIRATE}", "", 1) == system_prompt(plain)  # only the persona added

    # /persona TEXT by an admin in their chat: the running session keeps its prompt, the next one has it.
    await say(fake_telegram, ADMIN, f"before #{ADMIN}", 9401, 1)
    await say(fake_telegram, ADMIN, "/persona Always answer in haiku.", 9402, 2)
    assert "applies to the next conversation" in tg_texts(fake_telegram, ADMIN)[1]
    await say(fake_telegram, ADMIN, f"same session #{ADMIN}", 9403, 3)
    await say(fake_telegram, ADMIN, "/new", 9404, 4)
    await say(fake_telegram, ADMIN, f"new session #{ADMIN}", 9405, 5)
    before, same, new = requests_of(fake_openai, ADMIN)
    assert system_prompt(before) == system_prompt(same) == system_prompt(plain)
    assert "Always answer in haiku." in system_prompt(new) and PIRATE not in system_prompt(new)
    # A named persona, and off again.
    await say(fake_telegram, ADMIN, "/persona pirate", 9406, 6)
    await say(fake_telegram, ADMIN, "/new", 9407, 7)
    await say(fake_telegram, ADMIN, f"named #{ADMIN}", 9408, 8)
    assert PIRATE in system_prompt(requests_of(fake_openai, ADMIN)[-1])
    await say(fake_telegram, ADMIN, "/persona off", 9409, 9)
    await say(fake_telegram, ADMIN, "/new", 9410, 10)
    await say(fake_telegram, ADMIN, f"plain again #{ADMIN}", 9411, 11)
    assert system_prompt(requests_of(fake_openai, ADMIN)[-1]) == system_prompt(plain)


async def test_chats_rules_choose_route_and_toolset_of_a_chat(tmp_path, fake_telegram, fake_openai, running):
    USER, OTHER = 5557022, 5557023
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text("ok")
    rules = [{"platform": "telegram", "route": "alt"},  # every Telegram chat
             {"platform": "telegram", "chat": str(OTHER), "route": "default", "toolset": ["web_fetch"]}]
    await start_gateway(config(tmp_path, fake_openai, fake_telegram, chats=rules), running)
    await say(fake_telegram, USER, f"hi #{USER}", 9501, 1)
    await say(fake_telegram, OTHER, f"hi #{OTHER}", 9601, 1)
    platform_rule, chat_rule = requests_of(fake_openai, USER)[0], requests_of(fake_openai, OTHER)[0]
    assert platform_rule["model"] == "gpt-4o" and chat_rule["model"] == "gpt-4o-mini"  # the chat's rule wins
    assert [t["function"]["name"] for t in chat_rule["tools"]] == ["web_fetch"]
    assert len(platform_rule["tools"]) > 1


async def test_busy_changes_the_busy_policy_of_the_chat(tmp_path, fake_telegram, fake_openai, running):
    ADMIN, USER = 5557031, 5557032
    fake_openai.reset()
    gate = threading.Event()
    held = []

    def respond(req: dict) -> oa.Reply:
        users = [m["content"].splitlines()[-1] for m in req["messages"] if m["role"] == "user"]
        if not held:
            held.append(True)
            return oa.hold(gate, oa.text("seen: " + ", ".join(users)))
        return oa.text("seen: " + ", ".join(users))

    fake_openai.responder = respond
    gateway = await start_gateway(config(tmp_path, fake_openai, fake_telegram), running)
    await say(fake_telegram, ADMIN, "/busy", 9701, 1)
    assert tg_texts(fake_telegram, ADMIN)[0].startswith("While I am answering, new messages here are: queue")
    await say(fake_telegram, USER, "/busy merge", 9702, 1)
    assert tg_texts(fake_telegram, USER)[0] == "Only an admin can change this chat's settings."
    await say(fake_telegram, ADMIN, "/busy merge", 9703, 2)
    assert tg_texts(fake_telegram, ADMIN)[1].startswith("From the next message on, messages sent while I am "
                                                        "answering are: merge")

    fake_telegram.inject(dm_update("one", 9704, user_id=ADMIN))
    await wait_until(lambda: len(fake_openai.requests) == 1, what="first turn running")
    fake_telegram.inject(dm_update("two", 9705, user_id=ADMIN))
    fake_telegram.inject(dm_update("three", 9706, user_id=ADMIN))
    await wait_until(lambda: gateway.store.count_inbox("pending") == 3, what="two messages waiting")
    gate.set()
    await wait_until(lambda: len(sends_to(fake_telegram, ADMIN)) == 4, what="two answers")
    assert tg_texts(fake_telegram, ADMIN)[2:] == ["seen: one", "seen: one, two, three"]  # merged into one turn
    assert len(fake_openai.requests) == 2


async def test_a_chat_routed_to_a_local_server_gets_requests_that_server_accepts(tmp_path, fake_telegram,
                                                                                fake_openai, running):
    """Ollama/llama.cpp-style server (``lacks = [stream_options, parallel_tool_calls, vision]``): the
    fake refuses ``stream_options`` and image parts with a 400 as such servers do; the chat a rule routes
    there gets answers, with the image replaced by a note, while another chat's requests to OpenAI keep
    ``stream_options`` and the image."""
    from tests.test_media_telegram_e2e import jpeg, photo_update

    USER, OTHER = 5557042, 5557043
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text("a picture")
    fake_telegram.add_file("chats-photo", jpeg(64, 48))
    with oa.FakeOpenAI(api_key="not-needed", models=("qwen2.5:7b",),
                       lacks=("stream_options", "parallel_tool_calls", "vision")) as local:
        local.responder = lambda req: oa.text("a picture, I am told")
        llm = {"providers": [{"name": "local", "base_url": f"{local.url}/v1",
                              "lacks": ["stream_options", "parallel_tool_calls", "vision"],
                              "models": {"qwen2.5:7b": {"context_window_tokens": 32_768}}}],
               "routes": {"local": {"models": ["local:qwen2.5:7b"]}}}
        config_ = gateway_config(tmp_path, fake_openai, fake_telegram, llm=llm, access={"admins": []},
                                 chats=[{"platform": "telegram", "chat": str(USER), "route": "local"}])
        await start_gateway(config_, running)
        for user, message_id in ((USER, 9801), (OTHER, 9802)):
            fake_telegram.inject(photo_update(user, message_id, [("chats-photo", 64, 48, 900)],
                                              caption=f"what is this? #{user}"))
        await wait_until(lambda: sends_to(fake_telegram, USER) and sends_to(fake_telegram, OTHER), what="answers")
        assert tg_texts(fake_telegram, USER) == ["a picture, I am told"]
        assert tg_texts(fake_telegram, OTHER) == ["a picture"]
        (to_local,) = [r for r in local.requests if f"#{USER}" in str(r["json"])]
        assert to_local["status"] == 200 and to_local["json"]["model"] == "qwen2.5:7b"
        assert "stream_options" not in to_local["json"] and "parallel_tool_calls" not in to_local["json"]
        assert oa.image_parts(to_local) == [] and "this model cannot see images" in str(to_local["json"]["messages"])
        (to_openai,) = [r for r in fake_openai.requests if f"#{OTHER}" in str(r["json"])]
        assert to_openai["json"]["stream_options"] == {"include_usage": True} and len(oa.image_parts(to_openai)) == 1
        assert not [r for r in fake_openai.requests if f"#{USER}" in str(r["json"])]  # that chat never went there


async def test_a_chat_s_skills_are_the_only_ones_its_sessions_list_and_load(tmp_path, fake_telegram, fake_openai,
                                                                           running):
    USER, OTHER = 5557052, 5557053

    def respond(req: dict) -> oa.Reply:
        last = req["messages"][-1]
        if last["role"] == "tool":
            return oa.text(f"tool said: {last['content'][:120]}")
        return oa.tool_calls(oa.call("load_skill", {"name": "summarize-web-page"}))

    fake_openai.reset()
    fake_openai.responder = respond
    await start_gateway(config(tmp_path, fake_openai, fake_telegram,
                               chats=[{"platform": "telegram", "chat": str(USER), "skills": ["daily-report"]}]),
                        running)
    await say(fake_telegram, USER, f"summarise it #{USER}", 9901, 1)
    await say(fake_telegram, OTHER, f"summarise it #{OTHER}", 9902, 1)
    limited, full = requests_of(fake_openai, USER)[0], requests_of(fake_openai, OTHER)[0]
    assert "- daily-report:" in system_prompt(limited) and "summarize-web-page" not in system_prompt(limited)
    assert "- daily-report:" in system_prompt(full) and "- summarize-web-page:" in system_prompt(full)
    assert "there is no skill named 'summarize-web-page'; available: daily-report\n" in tg_texts(fake_telegram, USER)[0]
    assert tg_texts(fake_telegram, OTHER)[0].startswith("tool said: Skill summarize-web-page (version")


async def test_rules_by_chat_thread_and_user_apply_with_their_precedence(tmp_path, fake_telegram, fake_openai,
                                                                        running):
    """A forum group with a rule for the chat and one for a topic, and a rule for one user: the
    topic's rule beats the chat's, which beats the user's; in the user's DM the user's rule applies."""
    forum, member = -1003000000077, 5557062

    def topic_message(text: str, message_id: int, topic: int) -> dict:
        update = dm_update(f"@gateway_test_bot {text}", message_id, user_id=member)
        update["message"]["chat"] = {"id": forum, "title": "Forum", "type": "supergroup", "is_forum": True}
        update["message"].update(message_thread_id=topic, is_topic_message=True)
        update["message"]["entities"] = [{"type": "mention", "offset": 0, "length": 17}]
        return update

    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text("ok")
    rules = [{"platform": "telegram", "chat": str(forum), "thread": "11", "persona": "TOPIC RULE"},
             {"platform": "telegram", "chat": str(forum), "persona": "CHAT RULE"},
             {"platform": "telegram", "user": str(member), "persona": "USER RULE"}]
    await start_gateway(config(tmp_path, fake_openai, fake_telegram, chats=rules), running)
    fake_telegram.inject(topic_message("in topic 11 #t11", 9951, topic=11))
    fake_telegram.inject(topic_message("in topic 22 #t22", 9952, topic=22))
    await say(fake_telegram, member, f"in my DM #{member}", 9953, 1)
    await wait_until(lambda: len(fake_openai.requests) == 3, what="three turns")

    def persona_of(marker: str) -> list[str]:
        (request,) = [r["json"] for r in fake_openai.requests if marker in str(r["json"]["messages"][1:])]
        return [p for p in ("TOPIC RULE", "CHAT RULE", "USER RULE") if p in system_prompt(request)]

    assert persona_of("#t11") == ["TOPIC RULE"]  # chat + thread (12) beats chat (4) and user (2)
    assert persona_of("#t22") == ["CHAT RULE"]   # another topic: chat (4) beats user (2)
    assert persona_of(f"#{member}") == ["USER RULE"]  # the DM: only the user's rule applies
