"""Command line: ``gateway run | chat | db upgrade | doctor | jobs ... | skills ... | sessions export``
(also ``python -m gateway``)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys

from gateway.config import GatewayConfig, load_config
from gateway.errors import ConfigError

log = logging.getLogger("gateway.cli")


async def _run(config: GatewayConfig) -> None:
    from gateway.app import Gateway
    from gateway.telemetry import setup_tracing
    from gateway.wiring import build_adapters

    gateway = Gateway(config, build_adapters(config))
    provider = setup_tracing(config, gateway.instance_id)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await gateway.start()
    if not gateway.adapters:
        log.warning("no platform is enabled: set telegram.enabled (see deploy/gateway.example.toml), "
                    "or try `gateway chat` for a terminal conversation")
    if "web" in gateway.adapters and gateway.http_port is not None:
        admin = "admin pages at /admin" if config.secret(config.web.admin_password_env) else \
            f"admin pages off: set {config.web.admin_password_env} to turn them on"
        log.info("web chat: open http://%s:%s/ (%s)", config.http.host, gateway.http_port, admin)
    try:
        await stop.wait()
    finally:
        log.info("shutting down")
        await gateway.stop()
        if provider is not None:
            provider.shutdown()  # type: ignore[attr-defined]  # flushes the last spans


async def _chat(config: GatewayConfig) -> None:
    from adapters.local.adapter import LocalAdapter
    from gateway.app import Gateway
    from gateway.instance import instance_id_for

    done = asyncio.Event()
    loop = asyncio.get_running_loop()
    local = LocalAdapter(on_eof=lambda: loop.call_soon_threadsafe(done.set))
    # Its own instance id: a terminal chat beside `gateway run` must not take over the gateway's leases.
    config = config.model_copy(update={"instance_id": instance_id_for(config.instance_id, config.database.url,
                                                                      "chat")})
    gateway = Gateway(config, [local], serve_http=False)
    await gateway.start()
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
    from gateway.store.db import create_db_engine, upgrade
    from gateway.store.directory import CodeError, Directory

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gateway", description="LLM agent gateway for Telegram, Slack and Feishu")
    parser.add_argument("--config", help="TOML config file (default: $GATEWAY_CONFIG, else built-in defaults)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("run", help="serve the enabled platforms")
    sub.add_parser("chat", help="talk to the agent in this terminal (platform 'local')")
    db = sub.add_parser("db", help="database commands")
    db.add_argument("action", choices=["upgrade"])
    sub.add_parser("doctor", help="check config, database, model endpoint and platforms")
    pairing = sub.add_parser("pairing", help="DM pairing: let an unknown user in")
    pairing.add_argument("action", choices=["approve"])
    pairing.add_argument("code", help="the code the user was given")
    from gateway.jobs_cli import add_parser as add_jobs_parser

    add_jobs_parser(sub)
    from gateway.skills_cli import add_parser as add_skills_parser

    add_skills_parser(sub)
    args = parser.parse_args(argv)

    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from gateway.logs import setup_logging

    setup_logging(config.logging.level, config.secret_values())
    try:
        if args.command == "run":
            asyncio.run(_run(config))
        elif args.command == "chat":
            logging.getLogger().setLevel(logging.WARNING)
            asyncio.run(_chat(config))
        elif args.command == "db":
            _upgrade(config)
        elif args.command == "pairing":
            return _approve(config, args.code)
        elif args.command == "doctor":
            from gateway.doctor import run_doctor

            return asyncio.run(run_doctor(config))
        elif args.command == "jobs":
            from gateway.jobs_cli import run_jobs_command

            return run_jobs_command(config, args)
        elif args.command == "skills":
            from gateway.skills_cli import run_skills_command

            return run_skills_command(config, args)
        elif args.command == "sessions":
            from gateway.skills_cli import run_sessions_command

            return run_sessions_command(config, args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0
