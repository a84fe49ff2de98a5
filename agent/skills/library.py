"""``SkillLibrary``: the skills on disk (bundled ones, then the configured directory) and the
catalogue that goes into a new session's system prompt.

Folders are read when asked (a new session's catalogue, a ``load_skill`` call), so a skill
added or changed on disk is seen by the next new session without a restart; a session's stored
system prompt never changes. A skill in the configured directory replaces a bundled one of the
same name. ``SkillLibrary.review`` alone decides which skills are usable: the catalogue,
``/skills`` and ``gateway skills list`` all go through it. A skill ``gateway skills validate``
rejects (``agent.skills.skill.problems``) is left out (logged) and never breaks a turn; so is one
needing a tool the turns do not have, and a folder without ``SKILL.md`` (logged).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from agent.skills.skill import NAME_RULE, SKILL_FILE, Skill, SkillError, parse_skill, problems

log = logging.getLogger("agent.skills")

BUNDLED_DIR = Path(__file__).resolve().parent / "bundled"
"""The skills shipped with the gateway (``daily-report``, ``summarize-web-page``)."""

FINGERPRINT_TTL_S = 1.0
"""How long a walk of the skill directories is trusted (``SkillLibrary.catalogue``)."""

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
        self._catalogues: dict[tuple[Any, ...], str] = {}
        self._lock = threading.Lock()
        self._walked: tuple[float, tuple[tuple[str, int, int, int], ...]] | None = None

    def _recent_fingerprint(self) -> tuple[tuple[str, int, int, int], ...]:
        """``_fingerprint(dirs)``, walked at most once per ``FINGERPRINT_TTL_S``: a skill added,
        changed or removed on disk is offered to sessions started a second later."""
        now = time.monotonic()
        walked = self._walked
        if walked is None or now - walked[0] >= FINGERPRINT_TTL_S:
            walked = self._walked = (now, _fingerprint(self.dirs))
        return walked[1]

    def folders(self) -> dict[str, Path]:
        """Skill folder by folder name (later directories override earlier ones)."""
        out: dict[str, Path] = {}
        for root in self.dirs:
            for folder in _subfolders(root):
                if (folder / SKILL_FILE).is_file():
                    out[folder.name] = folder
        return out

    def strays(self) -> list[Path]:
        """Folders in ``dirs`` that have no ``SKILL.md``, so are no skill (names starting with
        ``.`` or ``_`` are not looked at), in directory order."""
        return [folder for root in self.dirs for folder in _subfolders(root)
                if not (folder / SKILL_FILE).is_file()]

    def review(self, tools: Iterable[str] | None = None) -> tuple[dict[str, Skill], dict[str, list[str]]]:
        """Which skills are usable: ``(usable skill by name, reasons by name for the others)``,
        both sorted by name. A skill is usable when ``problems`` finds nothing wrong with it (what
        ``gateway skills validate`` checks) and, when ``tools`` is given, every tool of its
        ``toolset`` is among them. Never raises for a broken skill."""
        available = set(tools) if tools is not None else None
        usable: dict[str, Skill] = {}
        left_out: dict[str, list[str]] = {}
        for name, folder in sorted(self.folders().items()):
            found = problems(folder)
            if not found:
                try:
                    skill = parse_skill(folder)
                except SkillError as exc:  # changed on disk in between
                    found = [str(exc)]
                else:
                    missing = [t for t in skill.toolset if available is not None and t not in available]
                    if not missing:
                        usable[name] = skill
                        continue
                    found = [f"{folder / SKILL_FILE}: needs the tool(s) {', '.join(missing)}, not offered here"]
            left_out[name] = found
        return usable, left_out

    def skills(self, tools: Iterable[str] | None = None) -> dict[str, Skill]:
        """The usable skills by name, sorted (``review``); the others and the folders without
        ``SKILL.md`` are logged."""
        usable, left_out = self.review(tools)
        for name, reasons in left_out.items():
            log.warning("skill %s left out: %s", name, "; ".join(reasons))
        for folder in self.strays():
            log.warning("skill folder %s has no %s; it is not a skill", folder, SKILL_FILE)
        return usable

    def get(self, name: str) -> Skill:
        """The skill ``name`` as it is on disk now (parsed; ``problems`` may still find fault with it).

        Raises:
            KeyError: no such skill (or ``name`` is no skill name: ``../x``); ``SkillError``: it
                exists but its ``SKILL.md`` is invalid.
        """
        folder = self.folders().get(name) if NAME_RULE.match(name) else None
        if folder is None:
            raise KeyError(name)
        return parse_skill(folder)

    def catalogue(self, tools: Iterable[str] | None = None, names: Iterable[str] | None = None) -> str:
        """The catalogue block for a system prompt: one line per usable skill (``skills(tools)``:
        name, description, when to use), sorted by name; with ``names``, only those skills.
        ``""`` when there is none. Deterministic: the same skills give the same bytes.

        Reparsed only when a file or folder under ``dirs`` changed (``_fingerprint``: paths, sizes
        and modification times, one directory walk, at most once a second): every new session asks
        for it, and parsing the front matter and checking every skill costs milliseconds."""
        wanted = None if names is None else tuple(sorted(set(names)))
        key = (self._recent_fingerprint(), None if tools is None else tuple(sorted(set(tools))), wanted)
        with self._lock:
            cached = self._catalogues.get(key)
        if cached is not None:
            return cached
        lines = [f"- {s.name}: {s.description} Use when: {s.when_to_use}" for s in self.skills(tools).values()
                 if wanted is None or s.name in wanted]
        text = "\n".join([CATALOGUE_HEADER, *lines]) if lines else ""
        with self._lock:
            if len(self._catalogues) > 8:  # a changed tree or toolset: the old entries are dead
                self._catalogues.clear()
            self._catalogues[key] = text
        return text


def _fingerprint(dirs: Sequence[Path]) -> tuple[tuple[str, int, int, int], ...]:
    """``(path, inode, size, mtime_ns)`` of every folder and file under ``dirs`` (symlinks as
    themselves; unreadable or missing ones left out): equal fingerprints mean the same skills."""
    out: list[tuple[str, int, int, int]] = []
    for root in dirs:
        for folder, subfolders, files in os.walk(root):
            subfolders.sort()
            for name in [".", *sorted(files)]:
                path = os.path.join(folder, name)
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                out.append((path, st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(out)


def _subfolders(root: Path) -> list[Path]:
    try:
        return [p for p in sorted(root.iterdir()) if p.is_dir() and not p.name.startswith((".", "_"))] \
            if root.is_dir() else []
    except OSError as exc:
        log.warning("skills directory %s cannot be read: %s", root, exc)
        return []


def with_catalogue(prompt: str, catalogue: str) -> str:
    """``prompt`` followed by the catalogue (unchanged when there is none)."""
    return f"{prompt}\n\n{catalogue}" if catalogue else prompt
