"""Skills (issue 13): versioned procedures on disk, a catalogue in the stored system prompt,
bodies loaded on demand by ``load_skill``, acceptance checks, and evals. Platform-agnostic."""

from agent.skills.library import BUNDLED_DIR, SkillLibrary, with_catalogue
from agent.skills.skill import Skill, SkillError, parse_skill, problems
from agent.skills.tool import load_skill_tool

__all__ = ["BUNDLED_DIR", "Skill", "SkillError", "SkillLibrary", "load_skill_tool", "parse_skill", "problems",
           "with_catalogue"]
