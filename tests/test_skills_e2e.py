"""Skills and the plan end to end: the real gateway and python-telegram-bot against the fake
Telegram Bot API and the scripted fake OpenAI model."""

from __future__ import annotations

import asyncio
from pathlib import Path

from agent.skills.library import FINGERPRINT_TTL_S
from tests.conftest import gateway_config, start_gateway
from tests.fakes import openai as oa
from tests.helpers import wait_until
from tests.test_sessions_e2e import tg_command
from tests.test_telegram_e2e import dm_update, sends_to

CHECKS = ["Every claim names the page it came from.", "The answer ends with the word DONE."]


def write_skill(root: Path, name: str, *, description: str, version: str, checks: list[str] | None = None,
                extra: str = "") -> Path:
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    lines = ["---", f"name: {name}", f"description: {description}", "when_to_use: a release needs checking.",
             f"version: {version}"]
    if checks:
        lines += ["acceptance_checks:", *(f"  - {c}" for c in checks)]
    (folder / "SKILL.md").write_text("\n".join([*lines, "---", "# Steps", "1. Fetch the notes.", extra, ""]))
    return folder


def system_prompt(request: dict) -> str:
    return request["json"]["messages"][0]["content"]


async def test_a_running_session_keeps_its_system_prompt_when_a_skill_changes(tmp_path, fake_telegram, fake_openai,
                                                                             running):
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text("ok")
    skills = tmp_path / "skills"
    write_skill(skills, "release-check", description="Checks a release against its notes.", version="1.0.0")
    config = gateway_config(tmp_path, fake_openai, fake_telegram, skills={"directory": str(skills)})
    await start_gateway(config, running)
    alice, bob = 5561001, 5561002

    fake_telegram.inject(dm_update("hello", 9801, user_id=alice))
    await wait_until(lambda: len(fake_openai.requests) == 1, what="alice's first turn")
    first = system_prompt(fake_openai.requests[0])
    assert "- release-check: Checks a release against its notes." in first
    assert "- daily-report:" in first and "load_skill(name)" in first  # bundled skills are listed too

    write_skill(skills, "release-check", description="Audits a release, step by step.", version="2.0.0")
    fake_telegram.inject(dm_update("and again", 9802, user_id=alice))
    await wait_until(lambda: len(fake_openai.requests) == 2, what="alice's second turn")
    assert system_prompt(fake_openai.requests[1]).encode() == first.encode()  # byte for byte

    await asyncio.sleep(FINGERPRINT_TTL_S)  # the skill folders are walked at most once a second

    fake_telegram.inject(dm_update("hi, new here", 9803, user_id=bob))
    await wait_until(lambda: len(fake_openai.requests) == 3, what="bob's first turn")
    fresh = system_prompt(fake_openai.requests[2])
    assert "- release-check: Audits a release, step by step." in fresh and "Checks a release" not in fresh

    fake_telegram.inject(tg_command("/new", 9804, alice))  # alice's next conversation sees the change too
    await wait_until(lambda: len(sends_to(fake_telegram, alice)) == 3, what="/new answered")
    fake_telegram.inject(dm_update("fresh start", 9805, user_id=alice))
    await wait_until(lambda: len(fake_openai.requests) == 4, what="alice's new session")
    assert system_prompt(fake_openai.requests[3]) == fresh


def plan(*statuses: str) -> dict:
    names = ["Fetch the release notes", "Compare with the changelog", "Write the verdict"]
    return {"steps": [{"step": n, "status": s} for n, s in zip(names, statuses, strict=True)]}


async def test_skill_plan_and_checklist_show_one_progress_message_and_one_reply(tmp_path, fake_telegram, fake_openai,
                                                                                running):
    fake_openai.reset()
    skills = tmp_path / "skills"
    write_skill(skills, "release-check", description="Checks a release against its notes.", version="2.1.0",
                checks=CHECKS)
    final = "Release 2.0 matches its notes (per the release page). DONE"
    fake_openai.script(
        oa.tool_calls(oa.call("load_skill", {"name": "release-check"})),
        oa.tool_calls(oa.call("update_plan", plan("in_progress", "pending", "pending"))),
        oa.tool_calls(oa.call("update_plan", plan("done", "done", "in_progress"))),
        oa.text("Draft: release 2.0 looks fine."),
        oa.text(final),
    )
    agent = {"stream_edit_interval_s": {"telegram": 0.0}}
    config = gateway_config(tmp_path, fake_openai, fake_telegram, skills={"directory": str(skills)}, agent=agent)
    gateway = await start_gateway(config, running)
    chat = 5561101
    fake_telegram.inject(dm_update("check release 2.0 please", 9811, user_id=chat))
    await wait_until(lambda: any(m["text"] == final for m in fake_telegram.sent_messages(chat)), what="the reply")
    await wait_until(lambda: all(r["status"] == "sent" for r in gateway.store.outbox_rows()), what="outbox settled")
    await asyncio.sleep(0.3)  # nothing more may arrive

    # Two messages in the chat: the plan (sent once, edited in place) and the reply (sent once).
    sends = sends_to(fake_telegram, chat)
    assert [c.params["text"].splitlines()[0] for c in sends] == ["Plan (0/3 done)", final]
    stored = fake_telegram.sent_messages(chat)
    assert len(stored) == 2 and stored[1]["text"] == final
    plan_id = stored[0]["message_id"]
    assert stored[0]["text"] == "Plan (2/3 done)\n✅ Fetch the release notes\n✅ Compare with the changelog\n" \
                                "⏳ Write the verdict"
    edits = [c for c in fake_telegram.calls("editMessageText") if int(c.params["chat_id"]) == chat]
    assert edits and {int(c.params["message_id"]) for c in edits} == {plan_id}  # the reply is never an edit target
    assert not any("Draft" in c.params["text"] for c in [*sends, *edits])  # the draft is never shown

    # The checklist was asked once, before the final answer, with the skill's checks.
    requests = fake_openai.requests
    assert len(requests) == 5
    asked = requests[4]["json"]["messages"][-1]
    assert asked["role"] == "user" and "release-check" in asked["content"]
    assert all(f"- [ ] {check}" in asked["content"] for check in CHECKS)
    loaded = next(m for m in requests[1]["json"]["messages"] if m["role"] == "tool")
    assert loaded["content"].startswith("Skill release-check (version 2.1.0)")  # host text, not wrapped
    assert "Acceptance checks" in loaded["content"]

    # The turn records the skill version and the plan on its last message.
    session_id = gateway.store.current_session_id(next(iter(gateway.store.outbox_rows()))["session_key"])
    transcript = gateway.store.transcript(session_id)
    last = transcript[-1]
    assert last.role == "assistant" and last.content == final
    assert last.meta["skills"] == {"release-check": "2.1.0"} and last.meta["stop_reason"] == "stop"
    assert [s["status"] for s in last.meta["plan"]] == ["done", "done", "in_progress"]
    assert [m.meta.get("kind") for m in transcript if m.role == "user"] == [None, "checklist"]

    # /status shows the plan; /skills lists versions and the one this conversation used.
    fake_telegram.inject(tg_command("/status", 9812, chat))
    fake_telegram.inject(tg_command("/skills", 9813, chat))
    await wait_until(lambda: len(sends_to(fake_telegram, chat)) == 4, what="/status and /skills")
    status, listing = (c.params["text"] for c in sends_to(fake_telegram, chat)[2:])
    assert "Plan (2/3 done)" in status and "⏳ Write the verdict" in status
    assert "release-check v2.1.0" in listing and "Used in this conversation: release-check v2.1.0" in listing
    assert len(fake_openai.requests) == 5  # commands never reach the model


async def test_a_simple_question_gets_no_plan_message_and_no_checklist(tmp_path, fake_telegram, fake_openai, running):
    fake_openai.reset()
    fake_openai.script(oa.text("It is 4."))
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram), running)
    chat = 5561201
    fake_telegram.inject(dm_update("what is 2+2?", 9821, user_id=chat))
    await wait_until(lambda: fake_telegram.sent_messages(chat), what="reply")
    await asyncio.sleep(0.2)
    assert [c.params["text"] for c in sends_to(fake_telegram, chat)] == ["It is 4."]
    assert len(fake_openai.requests) == 1
    tools = {t["function"]["name"]: t["function"] for t in fake_openai.requests[0]["json"]["tools"]}
    described = tools["update_plan"]["description"]
    assert "multi-step" in described and "simple question" in described
    assert {"load_skill", "update_plan"} <= set(tools)
    assert not [r for r in gateway.store.outbox_rows() if r["idempotency_key"].endswith(":plan")]


async def test_status_shows_a_running_plan_and_stop_leaves_no_plan_row_streaming(tmp_path, fake_telegram,
                                                                                 fake_openai, running):
    fake_openai.reset()
    fake_openai.script(oa.tool_calls(oa.call("update_plan", plan("in_progress", "pending", "pending"))),
                       oa.delay(2.0, oa.text("too late")))
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram), running)
    chat = 5561301
    fake_telegram.inject(dm_update("do the three things", 9831, user_id=chat))
    await wait_until(lambda: sends_to(fake_telegram, chat), what="plan message")
    fake_telegram.inject(tg_command("/status", 9833, chat))  # answered while the turn runs, not after it
    await wait_until(lambda: len(sends_to(fake_telegram, chat)) == 2, what="/status")
    status = sends_to(fake_telegram, chat)[1].params["text"]
    assert "Plan (0/3 done)\n⏳ Fetch the release notes\n▫️ Compare with the changelog" in status
    assert gateway.store.lane_busy(gateway.store.outbox_rows()[0]["session_key"])
    fake_telegram.inject(tg_command("/stop", 9832, chat))
    await wait_until(lambda: any(r["idempotency_key"].endswith(":plan") and r["status"] == "cancelled"
                                 for r in gateway.store.outbox_rows()), timeout=15, what="plan row cancelled")
    await asyncio.sleep(1.5)
    texts = [c.params["text"] for c in sends_to(fake_telegram, chat)]
    assert texts[0].startswith("Plan (0/3 done)") and "too late" not in texts
    assert not [r for r in gateway.store.outbox_rows() if r["status"] == "streaming"]


async def test_a_scheduled_push_follows_the_bundled_daily_report_skill(tmp_path, fake_telegram, fake_openai, running):
    from tests.test_jobs_e2e import MONDAY_9_SHANGHAI, ask

    fake_openai.reset()
    report = "**Daily report: sales, 2035-01-01**\nHighlights\n- 12 orders\nGaps\n- refunds unknown"

    def model(request: dict) -> oa.Reply:
        messages = request["messages"]
        if messages[-1]["role"] == "user" and "[Before your final answer" in messages[-1]["content"]:
            return oa.text(report)
        if messages[-1]["role"] == "user":
            return oa.tool_calls(oa.call("load_skill", {"name": "daily-report"}))
        return oa.text("Sales: 12 orders.")  # the draft, before the checklist

    fake_openai.responder = model
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram), running)
    user = 5561401
    created = await ask(fake_telegram, '/schedule "0 9 * * 1-5" Asia/Shanghai Sales: 12 orders yesterday', 8401,
                        user_id=user)
    job_id = created.split("Scheduled report ")[1].split()[0].strip(":.")
    run_id = await gateway.pushes.fire(job_id, MONDAY_9_SHANGHAI)
    await wait_until(lambda: any(m["text"].startswith("Daily report: sales") for m in
                                 fake_telegram.sent_messages(user)), what="report delivered")
    prompt = system_prompt(fake_openai.requests[0])
    assert "- daily-report:" in prompt and "load it first" in prompt  # the push session's stored prompt
    loaded = next(m for m in fake_openai.requests[1]["json"]["messages"] if m["role"] == "tool")
    assert loaded["content"].startswith("Skill daily-report (version 1.0.0)")
    assert "templates/report.md" in loaded["content"] and "Gaps" in loaded["content"]
    assert "bold title line" in fake_openai.requests[2]["json"]["messages"][-1]["content"]  # its checklist
    assert not any(m["text"] == "Sales: 12 orders." for m in fake_telegram.sent_messages(user))
    with gateway.engine.connect() as conn:
        session_id = conn.exec_driver_sql("SELECT session_id FROM job_runs WHERE id = ?", (run_id,)).scalar_one()
    last = gateway.store.transcript(session_id)[-1]
    assert last.content == report and last.meta["skills"] == {"daily-report": "1.0.0"}


async def test_slack_plan_is_one_post_updated_in_place_and_the_reply_another(tmp_path, fake_slack, fake_openai,
                                                                             running):
    from tests.test_slack_e2e import events_url, message

    fake_openai.reset()
    fake_openai.script(oa.tool_calls(oa.call("update_plan", plan("in_progress", "pending", "pending"))),
                       oa.tool_calls(oa.call("update_plan", plan("done", "in_progress", "pending"))),
                       oa.tool_calls(oa.call("update_plan", plan("done", "done", "done"))),
                       oa.text("All three done."))
    config = gateway_config(tmp_path, fake_openai, fake_slack=fake_slack,
                            agent={"stream_edit_interval_s": {"slack": 0.0}})
    gateway = await start_gateway(config, running)
    channel = "D0PLAN0001"
    fake_slack.add_channel(channel)
    since_posts, since_updates = len(fake_slack.calls("chat.postMessage")), len(fake_slack.calls("chat.update"))
    status = await fake_slack.post_event(events_url(gateway), fake_slack.envelope(
        message("do the three things", "1735800000.000100", channel=channel)))
    assert status.status == 200
    await wait_until(lambda: [m["text"] for m in fake_slack.posted(channel)][-1:] == ["All three done."],
                     what="reply")
    await wait_until(lambda: all(r["status"] == "sent" for r in gateway.store.outbox_rows()), what="settled")
    await asyncio.sleep(0.3)
    posts = [c for c in fake_slack.calls("chat.postMessage")[since_posts:] if c.params["channel"] == channel]
    updates = [c for c in fake_slack.calls("chat.update")[since_updates:] if c.params["channel"] == channel]
    assert [c.params["text"].splitlines()[0] for c in posts] == ["Plan (0/3 done)", "All three done."]
    plan_ts = fake_slack.posted(channel)[0]["ts"]
    assert len(updates) >= 2 and {c.params["ts"] for c in updates} == {plan_ts}
    assert [m["text"].splitlines()[0] for m in fake_slack.posted(channel)] == ["Plan (3/3 done)", "All three done."]


def write_undecodable_skill(root: Path, name: str) -> Path:
    """A skill whose SKILL.md is not valid UTF-8 (bytes 0xff 0xfe in its description)."""
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "SKILL.md").write_bytes(
        f"---\nname: {name}\ndescription: \"".encode() + b"\xff\xfe bad\"\n"
        b"when_to_use: never.\nversion: 1\n---\n# Steps\n1. Nothing.\n")
    return folder


async def test_a_skill_that_is_not_utf8_is_left_out_and_conversations_go_on(tmp_path, fake_telegram, fake_openai,
                                                                            running):
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text("hello there")
    skills = tmp_path / "skills"
    write_skill(skills, "release-check", description="Checks a release against its notes.", version="1.0.0")
    write_undecodable_skill(skills, "garbled")
    config = gateway_config(tmp_path, fake_telegram=fake_telegram, fake_openai=fake_openai,
                            skills={"directory": str(skills)})
    await start_gateway(config, running)
    chat = 5561501
    fake_telegram.inject(dm_update("hi", 9851, user_id=chat))
    await wait_until(lambda: [c.params["text"] for c in sends_to(fake_telegram, chat)] == ["hello there"],
                     what="the reply of a new session")
    prompt = system_prompt(fake_openai.requests[0])
    assert "- release-check:" in prompt and "garbled" not in prompt
    fake_telegram.inject(tg_command("/skills", 9852, chat))
    await wait_until(lambda: len(sends_to(fake_telegram, chat)) == 2, what="/skills answered")
    listing = sends_to(fake_telegram, chat)[1].params["text"]
    assert "release-check v1.0.0" in listing and "garbled" not in listing


async def test_skills_lists_what_the_catalogue_offers_and_nothing_else(tmp_path, fake_telegram, fake_openai, running,
                                                                      caplog):
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text("ok")
    skills = tmp_path / "skills"
    write_skill(skills, "release-check", description="Checks a release against its notes.", version="1.0.0")
    needs = write_skill(skills, "beam-me-up", description="Needs a tool nobody has.", version="1")
    (needs / "SKILL.md").write_text((needs / "SKILL.md").read_text().replace("version: 1", "version: 1\n"
                                                                            "toolset: [teleport]"))
    write_skill(skills, "dangling", description="Points nowhere.", version="1", extra="Use references/gone.md.")
    (skills / "no-skill-file").mkdir()
    (skills / "no-skill-file" / "skill.md").write_text("lower case: not found")
    config = gateway_config(tmp_path, fake_openai, fake_telegram, skills={"directory": str(skills), "bundled": False})
    await start_gateway(config, running)
    chat = 5561601
    fake_telegram.inject(dm_update("hi", 9861, user_id=chat))
    await wait_until(lambda: len(sends_to(fake_telegram, chat)) == 1, what="the reply")
    fake_telegram.inject(tg_command("/skills", 9862, chat))
    await wait_until(lambda: len(sends_to(fake_telegram, chat)) == 2, what="/skills answered")
    prompt = system_prompt(fake_openai.requests[0])
    offered = [line.split(":")[0] for line in prompt.splitlines() if line.startswith("- ")]
    listing = sends_to(fake_telegram, chat)[1].params["text"].splitlines()
    assert offered == ["- release-check"]
    assert listing[1:] == ["release-check v1.0.0 - Checks a release against its notes."]
    logged = caplog.text
    assert "skill beam-me-up left out" in logged and "teleport" in logged and "skill dangling left out" in logged
    assert f"skill folder {skills / 'no-skill-file'} has no SKILL.md" in logged
