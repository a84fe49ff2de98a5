"""``/skills`` and the plan lines of ``/status`` (issue 13), answered without the model."""

from __future__ import annotations

from collections.abc import Iterable

from agent.plan import render_plan
from agent.skills import SkillLibrary
from gateway.core.i18n import _
from gateway.delivery.progress import latest_plan
from gateway.store.sql import Store

PLAN_SCAN = 200
"""Transcript messages read back to find the latest turn's plan."""


def used_skills(store: Store, session_id: str) -> dict[str, tuple[str, str]]:
    """Skill name -> ``(version, turn id)`` of the latest turn of the session that used it (from
    ``meta.skills`` of the turns' last messages)."""
    used: dict[str, tuple[str, str]] = {}
    for message in store.load_window(session_id, PLAN_SCAN):
        for name, version in ((message.meta or {}).get("skills") or {}).items():
            used[name] = (str(version), message.turn_id or "")
    return used


def skills_reply(library: SkillLibrary | None, store: Store, session_id: str | None,
                 tools: Iterable[str] | None = None) -> str:
    """The answer to ``/skills``: the skills on offer (the same ones as a new session's catalogue:
    ``SkillLibrary.skills(tools)``, ``tools`` being what chat turns mount) with their versions,
    and the versions this conversation's turns used."""
    if library is None:
        return _("Skills are switched off here (skills.enabled = false).")
    tools = set(tools) if tools is not None else None
    if tools is not None and "load_skill" not in tools:
        return _("Skills are not offered here (agent.toolset has no load_skill).")
    skills = library.skills(tools)
    if not skills:
        return _("No skills are installed.")
    lines = [_("Skills (I load one when a task matches it):")]
    lines += [f"{s.name} v{s.version} - {s.description}" for s in skills.values()]
    used = used_skills(store, session_id) if session_id else {}
    if used:
        lines.append(_("Used in this conversation: {skills}", skills=", ".join(
            _("{name} v{version} (turn {turn})", name=name, version=version, turn=turn)
            for name, (version, turn) in sorted(used.items()))))
    return "\n".join(lines)


def plan_lines(store: Store, session_id: str) -> list[str]:
    """``/status`` lines for the latest turn's plan (none when it made no plan)."""
    plan = latest_plan(store.load_window(session_id, PLAN_SCAN))
    return [render_plan(plan)] if plan else []
