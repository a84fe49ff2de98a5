"""Skills and the plan inside the agent loop, with the real openai client against the fake model:
the checklist is asked once and only when a loaded skill has checks; sub-agents never ask it; the
plan tool keeps the state; skills are read from disk at each load."""

from __future__ import annotations

import pytest

from agent.budget import Limits
from agent.context import RunContext
from agent.delegate import delegate_tool
from agent.loop import run_turn
from agent.model import OpenAIChatModel
from agent.plan import update_plan_tool
from agent.skills import SkillLibrary, load_skill_tool, parse_skill
from agent.tools import ToolRegistry
from agent.turn_state import TurnState
from tests.fakes import openai as oa
from tests.test_skills_e2e import write_skill


@pytest.fixture
def model(fake_openai):
    fake_openai.reset()
    return OpenAIChatModel(base_url=f"{fake_openai.url}/v1", api_key="sk-test", model="gpt-4o-mini", max_retries=0)


def tools_for(library: SkillLibrary) -> ToolRegistry:
    tools = ToolRegistry()
    for tool in (load_skill_tool(library), update_plan_tool(), delegate_tool()):
        tools.add(tool)
    return tools


def run(model, tools, state: TurnState):
    recorded: list[tuple[dict, dict | None]] = []
    outcome = run_turn(system_prompt="sys", history=[{"role": "user", "content": "go"}], model=model, tools=tools,
                       bridge=None, limits=Limits(), record=lambda m, u, meta: recorded.append((m, meta)),
                       context=RunContext(state=state))
    return outcome, recorded


def test_the_checklist_is_asked_once_even_when_the_model_works_on_after_it(tmp_path, model, fake_openai):
    write_skill(tmp_path, "strict", description="Strict.", version="7", checks=["Say DONE."])
    state = TurnState()
    fake_openai.script(oa.tool_calls(oa.call("load_skill", {"name": "strict"})), oa.text("draft"),
                       oa.tool_calls(oa.call("update_plan", {"steps": [{"step": "fix", "status": "done"}]})),
                       oa.text("fixed. DONE"))
    outcome, recorded = run(model, tools_for(SkillLibrary([tmp_path])), state)
    assert outcome.reply == "fixed. DONE" and outcome.steps == 4 and fake_openai.pending == 0
    kinds = [(m["role"], (meta or {}).get("kind"), (meta or {}).get("draft")) for m, meta in recorded]
    assert kinds.count(("user", "checklist", None)) == 1 and ("assistant", None, True) in kinds
    final_meta = recorded[-1][1]
    assert final_meta["skills"] == {"strict": "7"} and final_meta["plan"] == [{"step": "fix", "status": "done"}]
    assert state.plan == [{"step": "fix", "status": "done"}]


def test_no_checklist_without_checks_and_none_for_a_sub_agents_answer(tmp_path, model, fake_openai):
    write_skill(tmp_path, "loose", description="No checks.", version="1")
    write_skill(tmp_path, "strict", description="Strict.", version="2", checks=["Say DONE."])
    fake_openai.script(oa.tool_calls(oa.call("load_skill", {"name": "loose"})), oa.text("plain answer"))
    outcome, recorded = run(model, tools_for(SkillLibrary([tmp_path])), TurnState())
    assert outcome.reply == "plain answer" and not [m for m, _ in recorded if m["role"] == "user"]

    fake_openai.reset()
    # The sub-agent loads the strict skill and answers: the child's answer is not held back, the
    # parent's is (the task used the skill).
    fake_openai.script(
        oa.tool_calls(oa.call("delegate", {"task": "sub", "toolset": ["load_skill"]})),
        oa.tool_calls(oa.call("load_skill", {"name": "strict"})), oa.text("child result"),
        oa.text("parent draft"), oa.text("parent final DONE"))
    outcome, recorded = run(model, tools_for(SkillLibrary([tmp_path])), TurnState())
    assert outcome.reply == "parent final DONE"
    assert "child result" in recorded[1][0]["content"]
    assert [m["role"] for m, meta in recorded if (meta or {}).get("kind") == "checklist"] == ["user"]


def test_load_skill_reads_the_disk_at_each_call_and_explains_bad_names(tmp_path, model, fake_openai):
    folder = write_skill(tmp_path, "evolving", description="Changes.", version="1")
    (folder / "references").mkdir()
    (folder / "references" / "notes.md").write_text("reference text")
    library = SkillLibrary([tmp_path])
    tool = load_skill_tool(library)
    state = TurnState()
    ctx = RunContext(state=state)
    assert tool.fn(ctx, "evolving").startswith("Skill evolving (version 1)")
    write_skill(tmp_path, "evolving", description="Changes.", version="2")
    assert tool.fn(ctx, "evolving").startswith("Skill evolving (version 2)")
    assert state.facts() == {"skills": {"evolving": "2"}}
    assert tool.fn(ctx, "evolving", "references/notes.md") == "reference text"
    with pytest.raises(ValueError, match=r"'\.\./SKILL\.md' resolves outside the skill's folder; refused"):
        tool.fn(ctx, "evolving", "../SKILL.md")
    with pytest.raises(ValueError, match=r"no file 'references/gone\.md'"):
        tool.fn(ctx, "evolving", "references/gone.md")
    with pytest.raises(ValueError, match="no skill named 'nope'; available: evolving"):
        tool.fn(ctx, "nope")


def test_a_resumed_turn_keeps_its_skills_plan_and_asks_the_checklist_once(tmp_path, model, fake_openai):
    """What a crash leaves in the transcript is enough: the turn taken over still records the
    skill version, keeps the plan, and asks the checklist only if it was not asked yet."""
    from agent.loop import CHECKLIST_REQUEST
    from agent.resume_state import restore_state

    write_skill(tmp_path, "strict", description="Strict.", version="4.2", checks=["Say DONE.", "Be brief."])
    tools = tools_for(SkillLibrary([tmp_path]))
    load = oa.call("load_skill", {"name": "strict"})
    steps = [{"step": "one", "status": "done"}]
    planned = oa.call("update_plan", {"steps": steps})
    loaded = tools.get("load_skill").fn(RunContext(state=TurnState(), tools=tools), "strict")
    history = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": load.id, "type": "function", "function": {"name": "load_skill", "arguments": load.arguments}},
            {"id": planned.id, "type": "function", "function": {"name": "update_plan",
                                                               "arguments": planned.arguments}}]},
        {"role": "tool", "tool_call_id": load.id, "content": loaded},
        {"role": "tool", "tool_call_id": planned.id, "content": "Plan (1/1 done)\n✅ one\n[budget: 80 left]"},
    ]
    state = restore_state(history)
    assert state.checklist() == [("strict", "Say DONE."), ("strict", "Be brief.")] and state.plan == steps
    fake_openai.script(oa.text("draft"), oa.text("DONE"))
    recorded: list = []
    outcome = run_turn(system_prompt="sys", history=history, model=model, tools=tools, bridge=None,
                       limits=Limits(), record=lambda m, u, meta: recorded.append((m, meta)),
                       context=RunContext(state=state))
    assert outcome.reply == "DONE" and recorded[-1][1]["skills"] == {"strict": "4.2"}
    assert recorded[-1][1]["plan"] == steps and recorded[1][1] == {"kind": "checklist"}

    asked = {"role": "user", "content": CHECKLIST_REQUEST.format(skills="strict", checks="- [ ] Say DONE.")}
    again = restore_state([*history, {"role": "assistant", "content": "draft"}, asked])
    assert again.checks_asked
    fake_openai.reset()
    fake_openai.script(oa.text("DONE again"))
    outcome = run_turn(system_prompt="sys", history=[*history, {"role": "assistant", "content": "draft"}, asked],
                       model=model, tools=tools, bridge=None, limits=Limits(), record=lambda *a: None,
                       context=RunContext(state=again))
    assert outcome.reply == "DONE again" and len(fake_openai.requests) == 1


def test_a_symlink_out_of_the_skill_folder_is_never_read(tmp_path, model, fake_openai):
    secret = tmp_path / "outside" / "passwd"
    secret.parent.mkdir()
    secret.write_text("root:x:0:0:SECRET-LINE\n")
    folder = write_skill(tmp_path / "skills", "leaky", description="Leaks.", version="1",
                         extra="See references/pw.md and references/ok.md.")
    (folder / "references").mkdir()
    (folder / "references" / "ok.md").write_text("fine text")
    (folder / "references" / "pw.md").symlink_to(secret)
    (folder / "templates").symlink_to(secret.parent, target_is_directory=True)
    fake_openai.script(oa.tool_calls(oa.call("load_skill", {"name": "leaky"})),
                       oa.tool_calls(oa.call("load_skill", {"name": "leaky", "file": "references/pw.md"}),
                                     oa.call("load_skill", {"name": "leaky", "file": "templates/passwd"}),
                                     oa.call("load_skill", {"name": "leaky", "file": "references/ok.md"})),
                       oa.text("done"))
    library = SkillLibrary([tmp_path / "skills"])
    assert library.catalogue() == "" and library.skills() == {}  # validate rejects it: not on offer
    outcome, recorded = run(model, tools_for(library), TurnState())
    assert outcome.reply == "done"
    results = [m["content"] for m, _ in recorded if m["role"] == "tool"]
    assert all("skill leaky is broken and cannot be used" in r for r in results)
    assert "references/pw.md, which resolves outside" in results[0]
    assert not any("SECRET-LINE" in r for r in results)

    # Even a Skill parsed directly never reads through the symlinks, nor lists them.
    skill = parse_skill(folder)
    assert skill.files() == ["references/ok.md"] and skill.read_file("references/ok.md") == "fine text"
    for escaping in ("references/pw.md", "templates/passwd", "../../outside/passwd", str(secret)):
        with pytest.raises(ValueError, match="resolves outside the skill's folder; refused"):
            skill.read_file(escaping)
