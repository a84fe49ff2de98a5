"""``SkillLibrary``: the skills on disk (bundled ones, then the configured directory) and the
catalogue that goes into a new session's system prompt.

Folders are read when asked (a new session's catalogue, a ``load_skill`` call), so a skill
added or changed on disk is seen by the next new session without a restart; a session's stored
system prompt never changes. A skill in the configured directory replaces a bundled one of the
same name. A broken skill is left out (logged) and never breaks a turn; ``gateway skills
validate`` names what is wrong with it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from pathlib import Path

from agent.skills.skill import SKILL_FILE, Skill, SkillError, parse_skill

log = logging.getLogger("agent.skills")

BUNDLED_DIR = Path(__file__).resolve().parent / "bundled"
"""The skills shipped with the gateway (``daily-report``, ``summarize-web-page``)."""

CATALOGUE_HEADER = (
    "## Skills\n"
    "Skills are tested procedures for recurring kinds of tasks. When a task matches one below, call "
    "load_skill(name) first and follow its instructions; do not load a skill for other tasks."
)


class SkillLibrary:
    """The skills found in ``dirs`` (later directories win on equal names).

    Args:
        dirs: directories whose sub-folders hold a ``SKILL.md`` each; missing ones are skipped.
    """

    def __init__(self, dirs: Sequence[Path | str]) -> None:
        self.dirs = [Path(d) for d in dirs]

    def folders(self) -> dict[str, Path]:
        """Skill folder by folder name (later directories override earlier ones)."""
        out: dict[str, Path] = {}
        for root in self.dirs:
            if root.is_dir():
                for folder in sorted(root.iterdir()):
                    if (folder / SKILL_FILE).is_file():
                        out[folder.name] = folder
        return out

    def skills(self) -> dict[str, Skill]:
        """Every valid skill by name, sorted; invalid ones are logged and left out."""
        out: dict[str, Skill] = {}
        for name, folder in sorted(self.folders().items()):
            try:
                out[name] = parse_skill(folder)
            except SkillError as exc:
                log.warning("skill %s left out: %s", name, exc)
        return out

    def get(self, name: str) -> Skill:
        """The skill ``name`` as it is on disk now.

        Raises:
            KeyError: no such skill; ``SkillError``: it exists but is invalid.
        """
        folder = self.folders().get(name)
        if folder is None:
            raise KeyError(name)
        return parse_skill(folder)

    def catalogue(self, tools: Iterable[str] | None = None) -> str:
        """The catalogue block for a system prompt: one line per skill (name, description, when to
        use), sorted by name; skills needing a tool not in ``tools`` are left out. ``""`` when
        there is none. Deterministic: the same skills give the same bytes."""
        available = set(tools) if tools is not None else None
        lines = [f"- {s.name}: {s.description} Use when: {s.when_to_use}"
                 for s in self.skills().values()
                 if available is None or set(s.toolset) <= available]
        return "\n".join([CATALOGUE_HEADER, *lines]) if lines else ""


def with_catalogue(prompt: str, catalogue: str) -> str:
    """``prompt`` followed by the catalogue (unchanged when there is none)."""
    return f"{prompt}\n\n{catalogue}" if catalogue else prompt
