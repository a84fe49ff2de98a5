"""``gateway skills list | show | validate | eval`` and ``gateway sessions export --as-eval``,
against skill folders on disk, a SQLite file and the fake OpenAI model."""

from __future__ import annotations

import argparse
import json

import pytest

from agent.skills.evals import load_cases
from gateway.core.errors import ConfigError
from gateway.skills.cli import add_parser, run_sessions_command, run_skills_command
from gateway.store.db import create_db_engine, upgrade
from gateway.store.sql import NewMessage, Store
from tests.conftest import gateway_config
from tests.fakes import openai as oa
from tests.test_skills_e2e import write_skill, write_undecodable_skill


def cli(config, *argv: str) -> int:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(list(argv))
    return (run_skills_command if args.command == "skills" else run_sessions_command)(config, args)


def test_validate_names_the_file_and_the_missing_field(tmp_path, fake_openai, capsys):
    skills = tmp_path / "skills"
    write_skill(skills, "good-one", description="Fine.", version="1.0.0", extra="See `templates/out.md`.")
    (skills / "good-one" / "templates").mkdir()
    (skills / "good-one" / "templates" / "out.md").write_text("shape")
    broken = write_skill(skills, "no-version", description="Lacks a version.", version="1.0.0")
    text = (broken / "SKILL.md").read_text().replace("version: 1.0.0\n", "")
    (broken / "SKILL.md").write_text(text)
    bare = skills / "no-front-matter"
    bare.mkdir()
    (bare / "SKILL.md").write_text("# Just instructions\nDo the thing.\n")
    dangling = write_skill(skills, "dangling", description="Points nowhere.", version="1",
                           extra="Use references/gone.md.")
    config = gateway_config(tmp_path, fake_openai, skills={"directory": str(skills), "bundled": False})

    assert cli(config, "skills", "validate") == 1
    out = capsys.readouterr().out
    assert f"error: {broken / 'SKILL.md'}: field 'version': is missing" in out
    assert f"error: {bare / 'SKILL.md'}: no front matter" in out
    assert f"error: {dangling / 'SKILL.md'}: references references/gone.md, which does not exist" in out
    assert f"ok: good-one ({skills / 'good-one' / 'SKILL.md'})" in out and "1 valid, 3 invalid" in out

    # What validate rejects is left out of the catalogue, and `list` says why.
    assert cli(config, "skills", "list") == 0
    listing = capsys.readouterr().out
    assert "good-one  v1.0.0  Fine." in listing and "no-version  INVALID" in listing
    assert f"dangling  INVALID  {dangling / 'SKILL.md'}: references references/gone.md" in listing
    from agent.skills import SkillLibrary

    assert [line.split(":")[0] for line in SkillLibrary(config.skills.dirs()).catalogue().splitlines()[2:]] == \
        ["- good-one"]

    assert cli(config, "skills", "validate", str(skills / "good-one")) == 0
    assert "1 valid, 0 invalid" in capsys.readouterr().out


def test_validate_rejects_unknown_fields_tools_and_bad_evals(tmp_path, fake_openai, capsys):
    skills = tmp_path / "skills"
    typo = write_skill(skills, "typo", description="Has a typo.", version="1")
    (typo / "SKILL.md").write_text((typo / "SKILL.md").read_text().replace("version: 1", "version: 1\nchecks: [a]"))
    tools = write_skill(skills, "needs-tools", description="Needs a tool.", version="1")
    (tools / "SKILL.md").write_text((tools / "SKILL.md").read_text().replace("version: 1",
                                                                             "version: 1\ntoolset: [teleport]"))
    evals = write_skill(skills, "bad-evals", description="Bad evals.", version="1")
    (evals / "evals").mkdir()
    (evals / "evals" / "a.json").write_text('{"cases": [{"task": "x", "expect": {"contain": ["y"]}}]}')
    config = gateway_config(tmp_path, fake_openai, skills={"directory": str(skills), "bundled": False})
    assert cli(config, "skills", "validate") == 1
    out = capsys.readouterr().out
    assert f"{typo / 'SKILL.md'}: field 'checks': unknown field" in out
    assert f"{tools / 'SKILL.md'}: field 'toolset': tool 'teleport' is not offered" in out
    assert f"{evals / 'evals' / 'a.json'}: case 1: unknown expectation 'contain'" in out


def test_the_bundled_skills_are_valid_and_show_prints_one(tmp_path, fake_openai, capsys):
    config = gateway_config(tmp_path, fake_openai, skills={"directory": str(tmp_path / "none")})
    assert cli(config, "skills", "validate") == 0
    assert "2 valid, 0 invalid" in capsys.readouterr().out
    assert cli(config, "skills", "show", "summarize-web-page") == 0
    shown = capsys.readouterr().out
    assert shown.startswith("summarize-web-page v1.0.0") and "toolset: web_fetch" in shown
    assert "files: references/style.md" in shown and "evals: basics.json" in shown
    assert cli(config, "skills", "show", "nope") == 1


def test_eval_prints_pass_rates_against_a_configured_model(tmp_path, fake_openai, capsys):
    skills = tmp_path / "skills"
    folder = write_skill(skills, "release-check", description="Checks a release.", version="3.0.0",
                         checks=["The answer ends with DONE."])
    (folder / "evals").mkdir()
    (folder / "evals" / "cases.json").write_text(json.dumps({"cases": [
        {"name": "alpha", "task": "check alpha", "expect": {"contains": ["DONE"], "max_chars": 100}},
        {"name": "beta", "task": "check beta", "expect": {"contains": ["DONE"]}},
    ]}))

    def model(request: dict) -> oa.TextReply:
        messages = request["messages"]
        task = messages[1]["content"]
        if "[Before your final answer" not in messages[-1]["content"]:
            return oa.text("draft")
        return oa.text("alpha is fine. DONE" if "alpha" in task else "beta: no idea")

    fake_openai.reset()
    fake_openai.responder = model
    config = gateway_config(tmp_path, fake_openai, skills={"directory": str(skills)})
    assert cli(config, "skills", "eval", "release-check", "--model", "gpt-4.1-mini", "--runs", "2") == 0
    out = capsys.readouterr().out
    assert "PASS  alpha" in out and "FAIL  beta: does not contain 'DONE'" in out
    assert "release-check v3.0.0 on gpt-4.1-mini: 2/4 passed (50%)" in out
    assert "  alpha: 2/2 passed (100%)" in out and "  beta: 0/2 passed (0%)" in out
    first = fake_openai.requests[0]["json"]
    assert first["model"] == "gpt-4.1-mini" and "- release-check: Checks a release." in first["messages"][0]["content"]
    assert first["messages"][3]["content"].startswith("Skill release-check (version 3.0.0)")
    assert len(fake_openai.requests) == 8  # each run: the draft, then the answer after the checklist

    with pytest.raises(ConfigError, match="no skill 'nope'"):
        cli(config, "skills", "eval", "nope")


def test_sessions_export_as_eval_writes_the_failed_turns(tmp_path, fake_openai, capsys):
    config = gateway_config(tmp_path, fake_openai)
    engine = create_db_engine(config.database.url)
    upgrade(engine)
    store = Store(engine)
    session_id = store.new_session("telegram:1:5", "system", None)
    store.append_messages(session_id, [
        NewMessage("in1", "user", "what is 2+2?", {"meta": {"time": 1.0}}),
        NewMessage("in1", "assistant", "4", {"meta": {"stop_reason": "stop"}}),
        NewMessage("in2", "user", "summarise https://example.com", {"meta": {"time": 2.0}}),
        NewMessage("in2", "assistant", None, {"tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "web_fetch", "arguments": "{}"}}]}),
        NewMessage("in2", "tool", "page", {"tool_call_id": "c1"}),
        NewMessage("in2", "assistant", "⚠️ I stopped before finishing", {"meta": {
            "stop_reason": "iteration_budget", "skills": {"summarize-web-page": "1.0.0"}}}),
    ])
    engine.dispose()
    out = tmp_path / "failed.json"
    assert cli(config, "sessions", "export", session_id[:8], "--as-eval", "--out", str(out)) == 0
    data = json.loads(out.read_text())
    [case] = data["cases"]
    assert case["task"] == "summarise https://example.com" and case["expect"] == {}
    assert case["observed"] == {"reply": "⚠️ I stopped before finishing", "stop_reason": "iteration_budget",
                                "tools_called": ["web_fetch"], "skills": {"summarize-web-page": "1.0.0"}}
    assert "Fill in each case's 'expect'" in data["note"]
    with pytest.raises(ValueError, match=r"case 1: field 'expect' is missing or empty"):
        load_cases(out)  # usable as an eval once someone says what a good answer has

    capsys.readouterr()
    assert cli(config, "sessions", "export", session_id, "--as-eval", "--all") == 0
    assert [c["task"] for c in json.loads(capsys.readouterr().out)["cases"]] == [
        "what is 2+2?", "summarise https://example.com"]
    assert cli(config, "sessions", "export", "ffffffff", "--as-eval") == 1


def test_sessions_delete_takes_percent_and_underscore_as_characters_not_wildcards(tmp_path, fake_openai, capsys):
    """The id prefix went into SQL ``LIKE`` as it was: ``gateway sessions delete %`` (or ``_``, or
    a typo such as ``1_``) deleted whichever session was the only match, with its transcript and
    files. Session ids are hex: such a prefix matches none."""
    config = gateway_config(tmp_path, fake_openai)
    engine = create_db_engine(config.database.url)
    upgrade(engine)
    session_id = Store(engine).new_session("telegram:1:5", "system", None)
    for prefix in ("%", "_", session_id[0] + "_", "%" + session_id[-4:]):
        assert cli(config, "sessions", "delete", prefix) == 1, prefix
        assert cli(config, "sessions", "export", prefix, "--as-eval", "--all") == 1, prefix
        assert f"no session {prefix!r}" in capsys.readouterr().err
    from gateway.skills.sessions_export import find_sessions

    assert find_sessions(engine, session_id) == [session_id]  # still there
    assert cli(config, "sessions", "delete", session_id[:6].upper()) == 0  # a real prefix still works
    assert find_sessions(engine, session_id) == []
    engine.dispose()


async def test_doctor_names_invalid_skills(tmp_path, fake_openai, capsys):
    from gateway.app.doctor import run_doctor

    skills = tmp_path / "skills"
    write_skill(skills, "fine", description="Fine.", version="1")
    (write_skill(skills, "broken", description="Broken.", version="1") / "SKILL.md").write_text("no front matter")
    config = gateway_config(tmp_path, fake_openai, skills={"directory": str(skills)})
    assert await run_doctor(config) == 1
    out = capsys.readouterr().out
    assert f"[FAIL] skills: 3 valid ({skills} and bundled); invalid: broken (see `gateway skills validate`)" in out


async def test_validate_and_doctor_name_a_skill_that_is_not_utf8(tmp_path, fake_openai, capsys):
    from gateway.app.doctor import run_doctor

    skills = tmp_path / "skills"
    write_skill(skills, "fine", description="Fine.", version="1")
    garbled = write_undecodable_skill(skills, "garbled")
    config = gateway_config(tmp_path, fake_openai, skills={"directory": str(skills), "bundled": False})
    assert cli(config, "skills", "validate") == 1
    out = capsys.readouterr().out
    assert f"error: {garbled / 'SKILL.md'}: not UTF-8 text (byte 0xff at offset" in out and "1 valid, 1 invalid" in out
    assert cli(config, "skills", "list") == 0
    assert f"garbled  INVALID  {garbled / 'SKILL.md'}: not UTF-8 text" in capsys.readouterr().out
    assert cli(config, "skills", "show", "garbled") == 1
    assert await run_doctor(config) == 1
    assert "[FAIL] skills: 1 valid" in (out := capsys.readouterr().out) and "invalid: garbled" in out


def test_a_skill_with_a_date_it_cannot_read_is_invalid_not_a_crash(tmp_path, fake_openai, capsys):
    skills = tmp_path / "skills"
    bad_date = write_skill(skills, "bad-date", description="Fine.", version="2024-13-45")
    config = gateway_config(tmp_path, fake_openai, skills={"directory": str(skills), "bundled": False})
    assert cli(config, "skills", "validate") == 1
    assert f"error: {bad_date / 'SKILL.md'}: front matter is not valid YAML" in capsys.readouterr().out


def test_validate_refuses_a_symlink_out_of_the_skill_folder(tmp_path, fake_openai, capsys):
    secret = tmp_path / "passwd"
    secret.write_text("root:x:0:0\n")
    skills = tmp_path / "skills"
    folder = write_skill(skills, "leaky", description="Leaks.", version="1", extra="See references/pw.md.")
    (folder / "references").mkdir()
    (folder / "references" / "pw.md").symlink_to(secret)
    (folder / "references" / "unmentioned.md").symlink_to(secret)
    config = gateway_config(tmp_path, fake_openai, skills={"directory": str(skills), "bundled": False})
    assert cli(config, "skills", "validate") == 1
    out = capsys.readouterr().out
    assert f"error: {folder / 'SKILL.md'}: references references/pw.md, which resolves outside {folder}" in out
    assert f"error: {folder / 'references' / 'unmentioned.md'}: resolves outside {folder}" in out
    assert "does not exist" not in out and "0 valid, 1 invalid" in out


def test_show_fails_for_anything_that_is_not_a_valid_skill_and_validate_names_stray_folders(
        tmp_path, fake_openai, capsys):
    skills = tmp_path / "skills"
    write_skill(skills, "fine", description="Fine.", version="1")
    bad_yaml = write_skill(skills, "badyaml", description="Fine.", version="1")
    (bad_yaml / "SKILL.md").write_text((bad_yaml / "SKILL.md").read_text().replace("version: 1", "version: [1"))
    write_skill(skills, "dangling", description="Points nowhere.", version="1", extra="Use references/gone.md.")
    (skills / "notes").mkdir()
    (skills / "notes" / "README.md").write_text("not a skill")
    config = gateway_config(tmp_path, fake_openai, skills={"directory": str(skills), "bundled": False})
    for name in ("../../etc", "..", "Fine", "nosuch", "badyaml", "dangling", "notes"):
        assert cli(config, "skills", "show", name) == 1, name
    err = capsys.readouterr().err
    assert "'../../etc' is not a skill name" in err and "front matter is not valid YAML" in err
    assert "references references/gone.md, which does not exist" in err and "no skill 'notes'" in err
    assert cli(config, "skills", "show", "fine") == 0

    capsys.readouterr()
    assert cli(config, "skills", "validate") == 1
    out = capsys.readouterr().out
    assert f"error: {skills / 'notes'}: has no SKILL.md, so it is not a skill (left out)" in out
    assert "1 valid, 3 invalid" in out
    assert cli(config, "skills", "list") == 0
    assert f"notes  NOT A SKILL  {skills / 'notes'}: has no SKILL.md" in capsys.readouterr().out


def test_sessions_delete_deletes_the_sessions_workspace_too(tmp_path, capsys, keep_logging):
    """``gateway sessions delete`` removed the transcript and the stored files but left the
    session's workspace folder (the uploads saved for the tools, what the agent wrote) on disk
    (found by a review). Links inside are removed, never followed."""
    from agent.workspace import Workspace
    from gateway.app.cli import main

    path = tmp_path / "gateway.toml"
    path.write_text(f'[database]\nurl = "sqlite:///{tmp_path / "gw.db"}"\n'
                    f'[media]\ndirectory = "{tmp_path / "media"}"\n'
                    f'[tools]\nworkspace = "write"\nworkspace_root = "{tmp_path / "ws"}"\n')
    assert main(["db", "upgrade", "--config", str(path)]) == 0
    engine = create_db_engine(f"sqlite:///{tmp_path / 'gw.db'}")
    session_id = Store(engine).new_session("telegram:1:5", "system", None)
    engine.dispose()
    folder = Workspace(tmp_path / "ws").directory(session_id)
    (folder / "uploads").mkdir()
    (folder / "uploads" / "payslip.pdf").write_bytes(b"%PDF-1.7 private")
    (folder / "outside").symlink_to(tmp_path / "media", target_is_directory=True)
    (tmp_path / "media").mkdir(exist_ok=True)
    (tmp_path / "media" / "kept").write_text("not the session's")
    capsys.readouterr()
    assert main(["sessions", "delete", session_id[:8], "--config", str(path)]) == 0
    assert "deleted its workspace folder" in capsys.readouterr().out
    assert not folder.exists() and (tmp_path / "media" / "kept").read_text() == "not the session's"
