"""``gateway skills list | show | validate | eval`` and ``gateway sessions export ID --as-eval``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import Engine

from agent.skills import SkillLibrary, parse_skill, problems
from agent.skills.skill import NAME_RULE, SKILL_FILE, SkillError
from gateway.core.config import GatewayConfig
from gateway.core.errors import ConfigError


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Registers ``skills`` and ``sessions`` on the top-level parser."""
    skills = sub.add_parser("skills", help="skills: list, show, validate, eval")
    actions = skills.add_subparsers(dest="action", required=True)
    actions.add_parser("list", help="every skill with its version and description")
    show = actions.add_parser("show", help="a skill's front matter, instructions, files and checks")
    show.add_argument("name")
    validate = actions.add_parser("validate", help="check front matter, referenced files and evals")
    validate.add_argument("paths", nargs="*", help="skill folders or directories of skills "
                                                   "(default: the bundled and configured ones)")
    run = actions.add_parser("eval", help="run a skill's evals/*.json against a model and print pass rates")
    run.add_argument("name")
    run.add_argument("--model", help="model name at llm.base_url (default: llm.model)")
    run.add_argument("--runs", type=int, default=1, help="runs per case (pass rates over several runs)")
    sessions = sub.add_parser("sessions", help="stored sessions")
    session_actions = sessions.add_subparsers(dest="action", required=True)
    export = session_actions.add_parser("export", help="a session's turns as a skill eval file (JSON)")
    export.add_argument("id", help="the session id (or its first characters, as /sessions shows)")
    export.add_argument("--as-eval", action="store_true", required=True, help="write eval cases")
    export.add_argument("--turn", help="only this turn (e.g. in42)")
    export.add_argument("--all", action="store_true", help="every turn, not only the failed ones")
    export.add_argument("--out", help="write to this file (default: stdout)")
    remove = session_actions.add_parser("delete", help="delete a session: its transcript, summaries and files")
    remove.add_argument("id", help="the session id (or its first characters, as /sessions shows)")


def run_skills_command(config: GatewayConfig, args: argparse.Namespace) -> int:
    """Carries out ``gateway skills ...``; prints the result. Returns the exit status."""
    library = SkillLibrary(config.skills.dirs())
    if args.action == "list":
        return _list(config, library)
    if args.action == "show":
        return _show(config, library, args.name)
    if args.action == "validate":
        return _validate(config, library, [Path(p) for p in args.paths])
    return _eval(config, library, args.name, args.model, args.runs)


def _list(config: GatewayConfig, library: SkillLibrary) -> int:
    folders = library.folders()
    strays = library.strays()
    if not folders and not strays:
        print("no skills (skills.directory: " + ", ".join(str(d) for d in library.dirs) + ")")
        return 0
    usable, left_out = library.review(_tools_for(config, list(folders.values())))
    for name, folder in folders.items():
        if name in usable:
            skill = usable[name]
            print(f"{skill.name}  v{skill.version}  {skill.description}\n    {folder}")
        else:
            first, *rest = left_out[name]
            more = f" (+{len(rest)} more: see `gateway skills validate`)" if rest else ""
            print(f"{name}  INVALID  {first}{more}")
    for folder in strays:
        print(f"{folder.name}  NOT A SKILL  {_stray(folder)}")
    return 0


def _stray(folder: Path) -> str:
    return f"{folder}: has no {SKILL_FILE}, so it is not a skill (left out)"


def _show(config: GatewayConfig, library: SkillLibrary, name: str) -> int:
    if not NAME_RULE.match(name):
        print(f"{name!r} is not a skill name (lowercase letters, digits and '-'); see `gateway skills list`",
              file=sys.stderr)
        return 1
    try:
        skill = library.get(name)
    except KeyError:
        print(f"no skill {name!r}; see `gateway skills list`", file=sys.stderr)
        return 1
    except SkillError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{skill.name} v{skill.version}  ({skill.folder})")
    print(f"description: {skill.description}\nwhen to use: {skill.when_to_use}")
    print(f"toolset: {', '.join(skill.toolset) or '(none)'}")
    print("acceptance checks:" + "".join(f"\n  - {c}" for c in skill.checks) if skill.checks else
          "acceptance checks: (none)")
    print(f"files: {', '.join(skill.files()) or '(none)'}")
    print(f"evals: {', '.join(p.name for p in skill.eval_files()) or '(none)'}\n")
    print(skill.body)
    found = problems(skill.folder, _tools_for(config, [skill.folder]))
    for problem in found:  # shown, but not usable: the catalogue leaves it out
        print(f"error: {problem}", file=sys.stderr)
    return 1 if found else 0


def _skill_folders(library: SkillLibrary, paths: list[Path]) -> tuple[list[Path], list[Path]]:
    """``(skill folders, folders without SKILL.md)`` to validate."""
    if not paths:
        return list(library.folders().values()), library.strays()
    out, strays = [], []
    for path in paths:
        if (path / SKILL_FILE).exists() or not path.is_dir():
            out.append(path)
        else:
            inner = SkillLibrary([path])
            out += list(inner.folders().values())
            strays += inner.strays()
    return out, strays


def known_tools(config: GatewayConfig) -> set[str]:
    """Tool names this configuration offers (MCP tools as ``server__*`` prefixes are checked apart)."""
    from agent.bridge import AsyncBridge
    from gateway.tools.catalog import build_catalog

    return set(build_catalog(config, AsyncBridge()).tools) | {"load_skill", "update_plan", "schedule_report"}


def _tools_for(config: GatewayConfig, folders: list[Path]) -> set[str]:
    """``known_tools`` plus the MCP tools (``server__*``) the skills in ``folders`` declare (MCP
    tools are only known once the servers run)."""
    tools = known_tools(config)
    mcp = tuple(f"{server}__" for server in config.mcp.servers)
    return tools | ({name for f in folders for name in _declared_tools(f) if name.startswith(mcp)} if mcp else set())


def _validate(config: GatewayConfig, library: SkillLibrary, paths: list[Path]) -> int:
    folders, strays = _skill_folders(library, paths)
    if not folders and not strays:
        print("no skills to validate")
        return 0
    tools = _tools_for(config, folders)
    bad = 0
    for folder in folders:
        found = problems(folder, tools)
        if found:
            bad += 1
            for problem in found:
                print(f"error: {problem}")
        else:
            print(f"ok: {folder.name} ({folder / SKILL_FILE})")
    for folder in strays:
        print(f"error: {_stray(folder)}")
    print(f"{len(folders) - bad} valid, {bad + len(strays)} invalid")
    return 1 if bad or strays else 0


def _declared_tools(folder: Path) -> tuple[str, ...]:
    try:
        return parse_skill(folder).toolset
    except SkillError:
        return ()


def _eval(config: GatewayConfig, library: SkillLibrary, name: str, model_name: str | None, runs: int) -> int:
    from agent.bridge import AsyncBridge
    from agent.model import ModelError, OpenAIChatModel
    from agent.plan import update_plan_tool
    from agent.skills import load_skill_tool, with_catalogue
    from agent.skills.evals import EvalResult, run_evals, skill_cases
    from gateway.tools.catalog import build_catalog

    try:
        skill = library.get(name)
        cases = skill_cases(skill)
    except KeyError:
        raise ConfigError(f"no skill {name!r}; see `gateway skills list`") from None
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if not cases:
        print(f"{skill.name} has no evals ({skill.folder / 'evals'}/*.json)")
        return 1
    if runs < 1:
        raise ConfigError("--runs must be at least 1")
    model = OpenAIChatModel(base_url=config.llm.base_url, api_key=config.secret(config.llm.api_key_env) or "missing",
                            model=model_name or config.llm.model, timeout_s=config.llm.timeout_s,
                            max_retries=config.llm.max_retries, temperature=config.llm.temperature, stream=False)
    bridge = AsyncBridge()
    bridge.start()
    try:
        tools = build_catalog(config, bridge)
        tools.add(load_skill_tool(library))
        tools.add(update_plan_tool())
        prompt = with_catalogue(config.agent.system_prompt, library.catalogue(tools.tools))

        def show(result: EvalResult) -> None:
            mark = "PASS" if result.passed else "FAIL"
            why = "" if result.passed else ": " + "; ".join(result.failures)
            print(f"{mark}  {result.case.name}{why}", flush=True)

        try:
            results = run_evals(skill, runs, show, system_prompt=prompt, model=model, tools=tools,
                                limits=config.agent.limits(), bridge=bridge)
        except ModelError as exc:
            print(f"error: the model failed: {exc.user_message}", file=sys.stderr)
            return 1
    finally:
        bridge.stop()
    print(f"\n{skill.name} v{skill.version} on {model.model}: {_rate(results)}")
    for case in cases:
        mine = [r for r in results if r.case == case]
        print(f"  {case.name}: {_rate(mine)}")
    return 0


def _rate(results: list) -> str:
    passed = sum(1 for r in results if r.passed)
    return f"{passed}/{len(results)} passed ({100 * passed / len(results):.0f}%)" if results else "no runs"


def run_sessions_command(config: GatewayConfig, args: argparse.Namespace,
                         on_delete: Callable[[Engine, str], None] | None = None) -> int:
    """``gateway sessions export ID --as-eval`` (writes the eval file) or ``gateway sessions delete ID``
    (the session with its transcript; ``on_delete(engine, session_id)`` then deletes what other
    capabilities keep of it: its files); returns the exit status."""
    from gateway.skills.eval_export import FILL_IN, export_cases
    from gateway.skills.sessions_export import find_sessions
    from gateway.store.db import create_db_engine, upgrade
    from gateway.store.sql import Store

    engine = create_db_engine(config.database.url)
    try:
        upgrade(engine)
        found = find_sessions(engine, args.id)
        if len(found) != 1:
            print(f"no session {args.id!r}" if not found else f"{args.id!r} matches {len(found)} sessions; "
                  "give more of the id", file=sys.stderr)
            return 1
        if args.action == "delete":  # the files go too: gateway.app.cli passes the media cleanup in
            Store(engine).delete_session(found[0])
            if on_delete is not None:
                on_delete(engine, found[0])
            print(f"deleted session {found[0]}")
            return 0
        transcript = Store(engine).transcript(found[0])
    finally:
        engine.dispose()
    cases = export_cases(transcript, turn=args.turn, all_turns=args.all)
    if not cases:
        what = f"turn {args.turn}" if args.turn else "failed turns (use --all for every turn)"
        print(f"session {found[0]} has no {what}", file=sys.stderr)
        return 1
    text = json.dumps({"note": FILL_IN, "session": found[0], "cases": cases}, indent=2, ensure_ascii=False)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")
        print(f"wrote {len(cases)} case(s) to {args.out}")
    else:
        print(text)
    return 0
