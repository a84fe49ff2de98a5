"""``gateway jobs list | add | remove | run``: scheduled reports from the command line.

The CLI is the operator: its jobs skip the chat permission rule (the target must still parse and
its platform be enabled). ``run`` fires a job in this process (claim, agent, answer queued in
the outbox, exactly as a scheduled fire); a running gateway delivers the answer.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable
from typing import Any

from gateway.core.config import GatewayConfig
from gateway.core.errors import ConfigError
from gateway.scheduler.planner import JobError, JobPlanner, format_address, job_schedule, local_time, next_fire_of

GatewayFactory = Callable[[GatewayConfig], Any]
"""Builds a ``gateway.app.Gateway`` for ``config`` with no adapters and no HTTP server."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Registers ``jobs`` and its actions on the top-level parser."""
    jobs = sub.add_parser("jobs", help="scheduled reports: list, add, remove, run")
    actions = jobs.add_subparsers(dest="action", required=True)
    actions.add_parser("list", help="every job with its last run and next fire")
    add = actions.add_parser("add", help="schedule a report")
    add.add_argument("--schedule", required=True, help='crontab line (0/7 = Sunday), @daily, "every 2h", '
                                                        '"at 2026-12-01 09:00"')
    add.add_argument("--tz", required=True, help="IANA time zone, e.g. Asia/Shanghai")
    add.add_argument("--to", required=True, help="target: platform:tenant:chat[:thread], e.g. slack:T123:C456")
    add.add_argument("--notify", help="where failures are reported (same form as --to)")
    add.add_argument("prompt", nargs="+", help="what the report should contain")
    remove = actions.add_parser("remove", help="remove a job")
    remove.add_argument("id")
    run = actions.add_parser("run", help="fire a job now (a running gateway delivers the answer)")
    run.add_argument("id")


def run_jobs_command(config: GatewayConfig, args: argparse.Namespace, gateway_factory: GatewayFactory) -> int:
    """Carries out ``gateway jobs ...``; prints the result. Returns the exit status.

    ``gateway_factory(config)`` builds a gateway without adapters or HTTP server (``jobs run``
    fires through the same push runner a running gateway uses)."""
    from gateway.scheduler.store import JobStore
    from gateway.store.db import create_db_engine, upgrade

    if args.action == "run":
        return asyncio.run(_run(config, args.id, gateway_factory))
    engine = create_db_engine(config.database.url)
    try:
        upgrade(engine)
        jobs = JobStore(engine)
        if args.action == "list":
            _list(jobs)
        elif args.action == "remove":
            if not jobs.delete_job(args.id):
                print(f"no job {args.id}")
                return 1
            print(f"removed {args.id} (running gateways drop it within scheduler.reload_interval_s)")
        elif args.action == "add":
            planner = JobPlanner(jobs, platforms=config.platforms(), toolsets=("default", "none"))
            try:
                notify = planner.resolve_target(args.notify, None) if args.notify else None
                new = planner.plan(schedule=args.schedule, timezone=args.tz, prompt=" ".join(args.prompt),
                                   target=args.to, requester=None, owner_dm=notify)
            except JobError as exc:
                raise ConfigError(str(exc)) from None
            job, _ = jobs.create_job(new)
            print(f"added {job.id}: {job_schedule(job).describe()} {job.timezone} -> {format_address(job.target)}; "
                  f"next {local_time(next_fire_of(job), job.timezone)}")
    finally:
        engine.dispose()
    return 0


def _list(jobs) -> None:
    rows = jobs.list_jobs()
    if not rows:
        print("no jobs")
        return
    last = jobs.last_runs([job.id for job in rows])
    for job in rows:
        run = last.get(job.id)
        last_text = f"{local_time(run.scheduled_at, job.timezone)} ({run.status})" if run else "never"
        state = "" if job.enabled else " [finished]"
        print(f"{job.id}  {job_schedule(job).describe()}  {job.timezone}  -> {format_address(job.target)}{state}\n"
              f"    owner {job.owner}  last {last_text}  next {local_time(next_fire_of(job), job.timezone)}\n"
              f"    {job.prompt}")


async def _run(config: GatewayConfig, job_id: str, gateway_factory: GatewayFactory) -> int:
    from gateway.ops.instance import instance_id_for
    from gateway.store.db import upgrade

    # Its own instance id: the run's claim must not look like a running gateway's (whose restart frees it).
    config = config.model_copy(update={"instance_id": instance_id_for(config.instance_id, config.database.url,
                                                                      "jobs")})
    gateway = gateway_factory(config)
    try:
        await gateway.run_db(upgrade, gateway.engine)
        if gateway.pushes is None:
            raise ConfigError("the scheduler is disabled (scheduler.enabled = false)")
        job = await gateway.run_db(gateway.jobs.get_job, job_id)
        if job is None:
            print(f"no job {job_id}")
            return 1
        gateway.bridge.start()
        run_id = await gateway.pushes.fire(job_id, time.time(), "manual")
        run = await gateway.run_db(gateway.jobs.get_run, run_id) if run_id is not None else None
        if run is None:
            print("the run was claimed elsewhere")
            return 1
        if run.status == "failed":
            print(f"run {run.id} of {job_id} failed: {run.error}")
            return 1
        print(f"run {run.id} of {job_id}: answer queued for {format_address(job.target)} "
              "(a running gateway delivers it)")
        return 0
    finally:
        await gateway.stop()  # never started: only closes the bridge, pools and engine
