"""Command line: ``gateway run | chat | db upgrade | doctor | jobs ... | skills ... | sessions export``
(also ``python -m gateway``)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import os
import signal
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gateway.core.config import GatewayConfig, load_config
from gateway.core.errors import ConfigError
from gateway.ops.logs import install_hooks, loop_exception_handler, setup_logging

if TYPE_CHECKING:
    from gateway.app.gateway import Gateway

log = logging.getLogger("gateway.app.cli")


class StartupFailed(Exception):
    """The gateway could not be built or started; ``cause`` is why (the CLI prints one line)."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(type(cause).__name__)
        self.cause = cause


async def _started(build: Callable[[], Gateway]) -> Gateway:
    """``build()`` then ``start()`` the gateway. On failure, stops what had started (threads, HTTP
    server, SDK sessions: nothing is left for interpreter shutdown to complain about) and raises
    ``StartupFailed``."""
    try:
        gateway = build()
    except Exception as exc:
        raise StartupFailed(exc) from exc
    try:
        await gateway.start()
    except BaseException as exc:
        try:
            await gateway.stop()
        except Exception:
            log.debug("stopping after a failed start-up", exc_info=True)
        if isinstance(exc, Exception):
            raise StartupFailed(exc) from exc
        raise
    return gateway


GC_THRESHOLDS = (20_000, 20, 20)
"""The collector's thresholds once the gateway serves (CPython's default: 700, 10, 10): the youngest
generation is collected after 20,000 net container allocations instead of 700, the older ones after
20 collections of the younger instead of 10. In a burst of 200 new chats the collector then runs
3 times (9-20 ms, every thread stopped) instead of 103 (94 young, 9 middle: 24 ms). Side by side
(``bench.side_by_side``, fourteenth round in bench/README.md), CPU per turn in a 200-chat burst was
lower in 7 of 8, 2 of 6 and 6 of 8 rounds of three runs (medians 6.32 -> 5.70, 5.40 -> 5.25,
5.99 -> 5.58 ms), and in 3 of 4 with 500 chats (5.38 -> 4.66 ms); more than the collections' own
time accounts for, and why was not established. Peak RSS with 500 turns in flight 194 -> 196 MB."""


def tune_collector() -> None:
    """Moves every object alive once the gateway has started (modules, SDK clients, config: some
    230,000 tracked objects) out of the garbage collector's view (``gc.freeze``), so a full
    collection walks only what turns created since: measured in a burst of 500 new chats, the full
    collection took 164 ms (every thread stopped meanwhile) before, 25 ms after; the collector's
    CPU per turn 0.55 -> 0.2 ms. Then collects less often (``GC_THRESHOLDS``)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def raise_open_files_limit() -> tuple[int, int] | None:
    """Raises this process's soft limit of open descriptors (``RLIMIT_NOFILE``) to its hard limit,
    as Go's runtime and nginx's ``worker_rlimit_nofile`` do: every turn in flight holds a model
    connection (on libcurl, three descriptors) and often a platform's, so 512 turns need more than
    the 1024 many systems start a process with. Returns ``(before, after)`` when it changed, else
    ``None`` (already there, or not a POSIX system)."""
    try:
        import resource
    except ImportError:
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == soft or (soft == resource.RLIM_INFINITY):
        return None
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError):  # a hard limit the kernel refuses as a soft one (macOS: OPEN_MAX)
        return None
    return soft, hard


async def _run(config: GatewayConfig, supervisor_fd: int | None = None) -> None:
    """Serves until SIGTERM, SIGINT or SIGHUP (the terminal closed), then stops gracefully.
    ``supervisor_fd``: this is a worker of ``gateway run --workers N``; it writes to that pipe once
    started and stops when the supervisor is gone."""
    from gateway.app.gateway import Gateway
    from gateway.app.wiring import build_adapters
    from gateway.app.workers import signal_ready, watch_supervisor
    from gateway.ops.telemetry import setup_tracing

    loop = asyncio.get_running_loop()
    loop.set_exception_handler(loop_exception_handler)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        if sig is not None:
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
    watcher = asyncio.create_task(watch_supervisor(stop.set)) if supervisor_fd is not None else None
    provider = None
    cut = 0  # turns the stop timeout cut (their rows are pending: resumed after the restart)

    def build() -> Gateway:
        nonlocal provider
        gateway = Gateway(config, build_adapters(config))
        provider = setup_tracing(config, gateway.instance_id)
        return gateway

    if raised := raise_open_files_limit():
        log.info("open files limit raised from %d to %d", *raised)
    try:
        gateway = await _started(build)
        tune_collector()
        if not gateway.adapters:
            log.warning("no platform is enabled: set telegram.enabled (see deploy/gateway.example.toml), "
                        "or try `gateway chat` for a terminal conversation")
        if "web" in gateway.adapters and gateway.http_port is not None:
            admin = "admin pages at /admin" if config.secret(config.web.admin_password_env) else \
                f"admin pages off: set {config.web.admin_password_env} to turn them on"
            log.info("web chat: open http://%s:%s/ (%s)", config.http.host, gateway.http_port, admin)
        signal_ready(supervisor_fd)
        try:
            await stop.wait()
        finally:
            if watcher is not None:
                watcher.cancel()
            log.info("shutting down")
            await gateway.stop()
            cut = gateway.unfinished_turns
    finally:
        if provider is not None:
            provider.shutdown()  # type: ignore[attr-defined]  # flushes the last spans
        if cut:
            logging.shutdown()
            os._exit(0)  # the interpreter would wait for their worker threads (a model call in flight)


async def _chat(config: GatewayConfig) -> None:
    from adapters.local.adapter import LocalAdapter
    from gateway.app.gateway import Gateway
    from gateway.ops.instance import instance_id_for

    done = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(loop_exception_handler)
    local = LocalAdapter(on_eof=lambda: loop.call_soon_threadsafe(done.set))  # type: ignore[arg-type]
    # Its own instance id: a terminal chat beside `gateway run` must not take over the gateway's leases.
    config = config.model_copy(update={"instance_id": instance_id_for(config.instance_id, config.database.url,
                                                                      "chat")})
    gateway = await _started(lambda: Gateway(config, [local], serve_http=False))
    print("Chatting with the agent (Ctrl-D to quit).", flush=True)
    try:
        await done.wait()
    finally:
        await gateway.stop()


def _upgrade(config: GatewayConfig) -> None:
    from gateway.store.db import create_db_engine, upgrade

    engine = create_db_engine(config.database.url)
    upgrade(engine)
    engine.dispose()
    print(f"database is up to date ({engine.url.render_as_string(hide_password=True)})")


def _approve(config: GatewayConfig, code: str) -> int:
    from gateway.sessions.directory import CodeError, Directory
    from gateway.store.db import create_db_engine, upgrade

    engine = create_db_engine(config.database.url)
    upgrade(engine)
    try:
        Directory(engine).approve(code)
    except CodeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        engine.dispose()
    print("approved: that user can talk to the agent now")
    return 0


CONFIG_HELP = "TOML config file (default: $GATEWAY_CONFIG, else built-in defaults)"


def _delete_session_files(config: GatewayConfig) -> Callable[[Any, str], None]:
    """Deletes a deleted session's files (``gateway sessions delete``): blobs nobody else uses, and
    its workspace folder (the uploads saved for the tools, what the agent wrote there)."""
    def delete(engine: Any, session_id: str) -> None:
        from agent.workspace import Workspace
        from gateway.media.index import MediaIndex
        from gateway.media.store import open_blob_store

        gone = MediaIndex(engine, open_blob_store(config.media, engine)).forget_session(session_id)
        print(f"deleted {gone.files} stored file(s) of it ({gone.blobs} blob(s))")
        if Workspace(config.tools.workspace_root).remove(session_id):
            print("deleted its workspace folder")

    return delete


SLACK_URL_EXAMPLE = "https://gateway.example.com/slack/events"
MANIFEST_HEADER = ("# Slack app manifest for agent-gateway (`gateway slack-manifest --url https://your.host/slack/events`\n"
                   "# prints it for your configuration: slack.mode, slack.command_prefix, slack.command_names,\n"
                   "# slack.suggested_prompts). Paste it at api.slack.com/apps -> Create New App -> From a manifest.\n")


def build_parser() -> argparse.ArgumentParser:
    """The ``gateway`` argument parser. ``--config PATH`` is accepted before or after any
    (sub)command: ``gateway --config F run`` and ``gateway run --config F`` are the same."""
    parser = argparse.ArgumentParser(prog="gateway", description="LLM agent gateway for Telegram, Slack and Feishu")
    parser.add_argument("--config", help=CONFIG_HELP)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="serve the enabled platforms")
    run.add_argument("--workers", type=int, default=None, metavar="N",
                     help="processes on this machine, sharing http.port (default: the config's workers, 1); "
                          "more than one needs PostgreSQL")
    run.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)  # set by the supervisor
    run.add_argument("--supervisor-fd", type=int, default=None, help=argparse.SUPPRESS)
    sub.add_parser("chat", help="talk to the agent in this terminal (platform 'local')")
    db = sub.add_parser("db", help="database commands")
    db.add_argument("action", choices=["upgrade"])
    sub.add_parser("doctor", help="check config, database, model endpoint and platforms")
    pairing = sub.add_parser("pairing", help="DM pairing: let an unknown user in")
    pairing.add_argument("action", choices=["approve"])
    pairing.add_argument("code", help="the code the user was given")
    manifest = sub.add_parser("slack-manifest", help="print the Slack app manifest for this configuration (YAML)")
    manifest.add_argument("--url", default=SLACK_URL_EXAMPLE,
                          help="the public Events API URL (events mode), e.g. https://your.host/slack/events")
    from gateway.scheduler.cli import add_parser as add_jobs_parser

    add_jobs_parser(sub)
    from gateway.skills.cli import add_parser as add_skills_parser

    add_skills_parser(sub)
    _config_everywhere(parser)
    return parser


def _config_everywhere(parser: argparse.ArgumentParser) -> None:
    """Adds ``--config`` to every subcommand parser, nested ones included. ``SUPPRESS`` as their
    default keeps a value given before the subcommand when none is given after it."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for subparser in action.choices.values():
                subparser.add_argument("--config", default=argparse.SUPPRESS, help=CONFIG_HELP)
                _config_everywhere(subparser)


def main(argv: list[str] | None = None) -> int:
    """Runs one command; returns the exit status (0 ok, 1 a check or command failed, 2 the
    configuration or start-up failed: one line on stderr, the traceback only at DEBUG)."""
    args = build_parser().parse_args(argv)
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from agent.redact import Redactor
    from gateway.app.startup_errors import url_password

    secrets = config.secret_values() + url_password(config.database.url)
    worker = getattr(args, "worker", None)
    if worker is None:
        setup_logging(config.logging.level, secrets)
    else:  # a worker of `gateway run --workers N`: its lines say which
        setup_logging(config.logging.level, secrets, f"w{worker}")
    install_hooks()
    try:
        return _command(config, args)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        from gateway.app.startup_errors import describe

        cause = exc.cause if isinstance(exc, StartupFailed) else exc
        if not isinstance(cause, ConfigError):
            log.debug("gateway %s failed", args.command, exc_info=cause)
        what = "start-up" if isinstance(exc, StartupFailed) else f"gateway {args.command}"
        print(f"error: {describe(cause, config, Redactor(secrets), what)}", file=sys.stderr, flush=True)
        return 2


def _serve(config: GatewayConfig, args: argparse.Namespace) -> int:
    """``gateway run``: this process serves (one process, or worker ``--worker K`` of a supervisor),
    or ``--workers N`` > 1 makes it the supervisor of N workers (``gateway.app.workers``)."""
    from gateway.app import loops, workers

    loops.loop_factory(config.event_loop)  # "uvloop" without uvloop: one line, before a supervisor migrates or forks
    if args.worker is not None:
        loops.run(_run(workers.worker_config(config, args.worker), args.supervisor_fd), config.event_loop)
        return 0
    count = args.workers if args.workers is not None else config.workers
    workers.check_workers(config, count)
    if count == 1:
        loops.run(_run(config), config.event_loop)
        return 0
    return workers.Supervisor(config, count, workers.worker_argv(args.config)).run()


def _command(config: GatewayConfig, args: argparse.Namespace) -> int:
    if args.command == "run":
        return _serve(config, args)
    elif args.command == "chat":
        logging.getLogger().setLevel(logging.WARNING)
        asyncio.run(_chat(config))
    elif args.command == "db":
        _upgrade(config)
    elif args.command == "pairing":
        return _approve(config, args.code)
    elif args.command == "slack-manifest":
        from urllib.parse import urlsplit

        import yaml

        from gateway.app.wiring import slack_manifest

        if config.slack.mode == "events":
            where = urlsplit(args.url)
            if where.scheme != "https" or not where.hostname:
                raise ConfigError(f"--url must be the public https URL of /slack/events, not {args.url!r}")
            if args.url == SLACK_URL_EXAMPLE:
                print(f"note: no --url given: the manifest names {SLACK_URL_EXAMPLE}; pass "
                      "--url https://your.host/slack/events", file=sys.stderr)
        print(MANIFEST_HEADER + yaml.safe_dump(slack_manifest(config, args.url), sort_keys=False, allow_unicode=True),
              end="")
    elif args.command == "doctor":
        from gateway.app.doctor import run_doctor

        return asyncio.run(run_doctor(config))
    elif args.command == "jobs":
        from gateway.app.gateway import Gateway
        from gateway.scheduler.cli import run_jobs_command

        return run_jobs_command(config, args, lambda c: Gateway(c, [], serve_http=False))
    elif args.command == "skills":
        from gateway.skills.cli import run_skills_command

        return run_skills_command(config, args)
    elif args.command == "sessions":
        from gateway.skills.cli import run_sessions_command

        return run_sessions_command(config, args, on_delete=_delete_session_files(config))
    return 0
