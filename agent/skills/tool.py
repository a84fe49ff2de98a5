"""``load_skill(name, file?)``: a skill's instructions enter the transcript as a tool result.

The call records the skill's name and version in the turn's state (``TurnState.skills``), so the
turn's last message says which version it used, and its acceptance checks are asked for before
the final reply. With ``file``, it returns one of the skill's references, templates or scripts
instead (scripts are text for the workspace: the host never runs them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

from agent.context import RunContext
from agent.skills.library import SkillLibrary
from agent.skills.skill import SkillError, problems
from agent.tools import Tool, tool

DESCRIPTION = (
    "Load a skill from the Skills list in your instructions: returns its procedure, which you then "
    "follow. Load it before you start the task it is for. With `file`, returns one of the skill's "
    "reference, template or script files instead."
)


CHECKS_HEADER = "Acceptance checks (you will confirm each against your work before your final answer):\n"


def render_skill(name: str, version: str, body: str, files: list[str], checks: tuple[str, ...],
                 missing_tools: list[str]) -> str:
    """The tool result for a loaded skill: header, instructions, files, checklist."""
    parts = [f"Skill {name} (version {version})", body]
    if files:
        parts.append("Files of this skill (read one with load_skill(name, file=PATH)): " + ", ".join(files))
        if any(f.startswith("scripts/") for f in files):
            parts.append("Scripts run only in your workspace: write the file there with write_file and run it "
                         "with run_shell.")
    if missing_tools:
        parts.append(f"Note: this skill needs {', '.join(missing_tools)}, which you do not have here; "
                     "say so if the task cannot be done without them.")
    if checks:
        parts.append(CHECKS_HEADER + "\n".join(f"- {c}" for c in checks))
    return "\n\n".join(parts)


def load_skill_tool(library: SkillLibrary,
                    allowed: Callable[[RunContext], Iterable[str] | None] | None = None) -> Tool:
    """The ``load_skill`` Tool over ``library`` (reads the skill from disk at each call).

    ``allowed(ctx)``: the skill names the call's conversation may load (``None``: every skill); a
    skill not among them is answered as if it did not exist (per-chat ``skills``).
    """

    def load_skill(ctx: RunContext, name: str, file: str | None = None) -> str:
        """Load a skill's procedure (or one of its files).

        Args:
            name: the skill's name, as in the Skills list.
            file: a path from the skill's file list, e.g. references/format.md (omit for the procedure).
        """
        mounted = set(ctx.tools.tools) if ctx.tools is not None else None
        names = allowed(ctx) if allowed is not None else None
        wanted = set(names) if names is not None else None
        try:
            if wanted is not None and name not in wanted:
                raise KeyError(name)
            skill = library.get(name)
            found = problems(skill.folder)
        except KeyError:
            available = ", ".join(n for n in library.skills(mounted) if wanted is None or n in wanted) or "none"
            raise ValueError(f"there is no skill named {name!r}; available: {available}") from None
        except SkillError as exc:
            found = [exc.args[0]]
        if found:  # what `gateway skills validate` rejects is never used (and not in the catalogue)
            raise ValueError(f"skill {name} is broken and cannot be used ({'; '.join(found)})")
        if file:
            return skill.read_file(file)
        if ctx.state is not None:
            ctx.state.add_skill(skill.name, skill.version, skill.checks)
        return render_skill(skill.name, skill.version, skill.body, skill.files(), skill.checks,
                            [t for t in skill.toolset if mounted is not None and t not in mounted])

    built: Tool = tool(load_skill, takes_context=True, side_effect="none", idempotent=True, description=DESCRIPTION)
    return dataclasses.replace(built, trusted_output=True, retries=0)
