"""One skill: a folder with ``SKILL.md`` (YAML front matter + instructions) and optional files.

Layout::

    daily-report/
      SKILL.md          front matter (below), then the instructions in Markdown
      references/       knowledge the instructions point to (read with load_skill(name, file=...))
      templates/        shapes of the output
      scripts/          code the model may copy into its workspace and run there (run_shell,
                        sandboxed); nothing here is ever executed by the host
      evals/*.json      example tasks with expected properties (``agent.skills.evals``)

Front matter fields: ``name`` (the folder's name, ``[a-z0-9-]``), ``description`` (one line, shown
in the catalogue), ``when_to_use``, ``version``, optional ``toolset`` (tools the skill needs) and
``acceptance_checks`` (the checklist the model confirms against its work before it answers).
Unknown fields are errors, so a typo never silently drops a check.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

SKILL_FILE = "SKILL.md"
NAME_RULE = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")
REQUIRED = ("name", "description", "when_to_use", "version")
OPTIONAL = ("toolset", "acceptance_checks")
FILE_DIRS = ("references", "templates", "scripts")
_MENTIONED = re.compile(r"(?<![\w/])((?:references|templates|scripts)/[\w./-]*\w)")
_LINKED = re.compile(r"\]\((?!https?:|mailto:|#)([^)\s]+)\)")


class SkillError(ValueError):
    """A skill that cannot be used: ``path`` is the file, ``field`` the front-matter field (or
    ``None``), and the message says what is wrong with it."""

    def __init__(self, path: Path, message: str, field: str | None = None) -> None:
        where = f"{path}: " + (f"field '{field}': " if field else "")
        super().__init__(where + message)
        self.path = path
        self.field = field


@dataclass(frozen=True)
class Skill:
    """A parsed skill.

    Attributes:
        name, description, when_to_use, version: from the front matter (``version`` as a string).
        toolset: tools the skill needs (the catalogue leaves it out where one is missing).
        checks: acceptance checks, in order.
        body: the instructions (Markdown after the front matter), stripped.
        folder: the skill's directory.
    """

    name: str
    description: str
    when_to_use: str
    version: str
    toolset: tuple[str, ...]
    checks: tuple[str, ...]
    body: str
    folder: Path

    def files(self) -> list[str]:
        """Relative paths of the skill's references, templates and scripts, sorted; a file that
        resolves outside the skill's folder (a symlink out of it) is not one of them
        (``outside_files``)."""
        return [f for f in _listed_files(self.folder) if inside(self.folder, f)]

    def read_file(self, relative: str) -> str:
        """The text of one of ``files()``.

        Raises:
            ValueError: the path resolves outside the skill's folder (``..``, a symlink out of it),
                or is not one of the skill's files; ``SkillError`` (a ``ValueError``): it cannot be
                read or is not UTF-8.
        """
        if not inside(self.folder, relative):
            raise ValueError(f"skill {self.name}: {relative!r} resolves outside the skill's folder; refused")
        if relative not in self.files():
            listed = ", ".join(self.files()) or "none"
            raise ValueError(f"skill {self.name} has no file {relative!r}; its files: {listed}")
        return read_text(self.folder / relative)

    def eval_files(self) -> list[Path]:
        """The skill's ``evals/*.json`` files, sorted by name (``agent.skills.evals``)."""
        root = self.folder / "evals"
        return sorted(root.glob("*.json")) if root.is_dir() else []


def _listed_files(folder: Path) -> list[str]:
    out = []
    for sub in FILE_DIRS:
        root = folder / sub
        if root.is_dir():
            out += [p.relative_to(folder).as_posix() for p in sorted(root.rglob("*")) if p.is_file()]
    return out


def inside(folder: Path, relative: str) -> bool:
    """Whether ``folder / relative``, symlinks and ``..`` resolved, is inside ``folder``."""
    try:
        return (folder / relative).resolve().is_relative_to(folder.resolve())
    except (OSError, RuntimeError):  # a symlink loop
        return False


def outside_files(folder: Path) -> list[str]:
    """The files under ``references/``, ``templates/``, ``scripts/`` that resolve outside ``folder``
    (symlinks out of it): refused by ``load_skill``, reported by ``problems``."""
    return [f for f in _listed_files(folder) if not inside(folder, f)]


def split_front_matter(text: str, path: Path) -> tuple[dict[str, Any], str]:
    """``(front matter, body)`` of a ``SKILL.md``.

    Raises:
        SkillError: no front matter block (``---`` lines), invalid YAML, or not a mapping.
    """
    lines = text.splitlines()
    if not lines or lines[0].strip() != "---":
        raise SkillError(path, "no front matter: the file must start with a '---' line, then YAML, then '---'")
    end = next((i for i in range(1, len(lines)) if lines[i].strip() == "---"), None)
    if end is None:
        raise SkillError(path, "the front matter is not closed by a '---' line")
    try:
        data = yaml.safe_load("\n".join(lines[1:end]))
    except (yaml.YAMLError, ValueError, TypeError, RecursionError) as exc:  # ValueError: a date like 2024-13-45
        raise SkillError(path, f"front matter is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise SkillError(path, "front matter must be a YAML mapping of fields")
    return data, "\n".join(lines[end + 1:]).strip()


def _text(data: dict[str, Any], key: str, path: Path) -> str:
    value = data.get(key)
    if value is None or (isinstance(value, str) and not value.strip()):
        raise SkillError(path, "is missing", key)
    if not isinstance(value, str | int | float) or isinstance(value, bool):
        raise SkillError(path, f"must be text, not {type(value).__name__}", key)
    return str(value).strip()


def _list(data: dict[str, Any], key: str, path: Path) -> tuple[str, ...]:
    value = data.get(key) or []
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise SkillError(path, "must be a list of non-empty strings", key)
    return tuple(v.strip() for v in value)


def read_text(path: Path) -> str:
    """The UTF-8 text of one of a skill's files.

    Raises:
        SkillError: the file cannot be read (``OSError``) or is not UTF-8 (naming the first bad byte).
    """
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise SkillError(path, f"not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}); "
                               "save it as UTF-8") from None
    except OSError as exc:
        raise SkillError(path, f"cannot be read ({exc.strerror or exc})") from None


def parse_skill(folder: Path) -> Skill:
    """Reads and checks the skill in ``folder``. Never raises anything but ``SkillError``, so one
    broken skill can be left out without breaking the others.

    Raises:
        SkillError: no ``SKILL.md``, a file that cannot be read or is not UTF-8, bad front matter
            (naming the file and the field), a name that differs from the folder's, a description
            longer than one line.
    """
    path = folder / SKILL_FILE
    if not path.is_file():
        raise SkillError(path, "not found")
    data, body = split_front_matter(read_text(path), path)
    unknown = sorted(set(data) - set(REQUIRED) - set(OPTIONAL))
    if unknown:
        raise SkillError(path, f"unknown field (known: {', '.join(REQUIRED + OPTIONAL)})", unknown[0])
    name = _text(data, "name", path)
    if not NAME_RULE.match(name):
        raise SkillError(path, f"{name!r} must be lowercase letters, digits and '-'", "name")
    if name != folder.name:
        raise SkillError(path, f"{name!r} must equal the folder's name {folder.name!r}", "name")
    description = _text(data, "description", path)
    if "\n" in description or len(description) > 200:
        raise SkillError(path, "must be one line of at most 200 characters", "description")
    if not body:
        raise SkillError(path, "has no instructions after the front matter")
    return Skill(name=name, description=description, when_to_use=" ".join(_text(data, "when_to_use", path).split()),
                 version=_text(data, "version", path), toolset=_list(data, "toolset", path),
                 checks=_list(data, "acceptance_checks", path), body=body, folder=folder)


def problems(folder: Path, known_tools: set[str] | None = None) -> list[str]:
    """Everything wrong with the skill in ``folder``, each naming its file (empty: valid).

    Checks the front matter, that every file the instructions mention (``references/...``,
    ``templates/...``, ``scripts/...``, relative Markdown links) exists inside the skill's folder,
    that no file of the skill resolves outside it (a symlink out of it), that the required tools
    are known (when ``known_tools`` is given), and that each ``evals/*.json`` parses into cases.
    """
    try:
        skill = parse_skill(folder)
    except SkillError as exc:
        return [str(exc)]
    found: list[str] = []
    path = folder / SKILL_FILE
    mentioned = set(_MENTIONED.findall(skill.body)) | {m.split("#")[0] for m in _LINKED.findall(skill.body)}
    for relative in sorted(m for m in mentioned if m):
        if not inside(folder, relative):
            found.append(f"{path}: references {relative}, which resolves outside {folder} (refused)")
        elif not (folder / relative).exists():
            found.append(f"{path}: references {relative}, which does not exist in {folder}")
    found += [f"{folder / f}: resolves outside {folder} (a symlink out of the skill's folder); "
              "load_skill refuses it" for f in outside_files(folder)]
    if known_tools is not None:
        for name in skill.toolset:
            if name not in known_tools:
                found.append(f"{path}: field 'toolset': tool {name!r} is not offered by this gateway")
    from agent.skills.evals import load_cases  # evals import this module

    for eval_file in skill.eval_files():
        try:
            load_cases(eval_file)
        except ValueError as exc:
            found.append(str(exc))
    return found


def read_json(path: Path) -> Any:
    """Parses a JSON file. Raises ``ValueError`` naming the file and the position (``SkillError``
    when the file cannot be read or is not UTF-8)."""
    try:
        return json.loads(read_text(path))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
