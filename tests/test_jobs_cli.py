"""``gateway jobs add | list | run | remove`` against a SQLite file and the fake model."""

from __future__ import annotations

import argparse

import pytest

from gateway.app.gateway import Gateway
from gateway.core.errors import ConfigError
from gateway.scheduler.cli import add_parser, run_jobs_command
from gateway.scheduler.store import JobStore
from gateway.store.db import create_db_engine
from gateway.store.sql import Store
from tests.conftest import gateway_config
from tests.fakes import openai as oa


def jobs_cli(config, *argv: str) -> int:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command"))
    return run_jobs_command(config, parser.parse_args(["jobs", *argv]), lambda c: Gateway(c, [], serve_http=False))


def test_add_list_run_remove(tmp_path, fake_openai, fake_telegram, capsys):
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text("cli report")
    config = gateway_config(tmp_path, fake_openai, fake_telegram)
    assert jobs_cli(config, "add", "--schedule", "0 9 * * 1", "--tz", "Europe/Warsaw", "--to",
                    "telegram:7000000001:-1001000000001:77", "--notify", "telegram:7000000001:5550001",
                    "Weekly", "KPI", "summary") == 0
    added = capsys.readouterr().out
    assert added.startswith("added ") and "0 9 * * 1 Europe/Warsaw -> telegram:7000000001:-1001000000001:77" in added
    job_id = added.split()[1].rstrip(":")
    with pytest.raises(ConfigError, match="unknown time zone"):
        jobs_cli(config, "add", "--schedule", "0 9 * * 1", "--tz", "Europe/Warsw", "--to", "telegram:1:2", "x")
    with pytest.raises(ConfigError, match="platform 'slack' is not enabled"):
        jobs_cli(config, "add", "--schedule", "0 9 * * 1", "--tz", "UTC", "--to", "slack:T1:C1", "x")

    assert jobs_cli(config, "run", job_id) == 0
    assert "answer queued for telegram:7000000001:-1001000000001:77" in capsys.readouterr().out
    engine = create_db_engine(config.database.url)
    [row] = Store(engine).outbox_rows()
    assert (row["text"], row["status"], row["address"]["thread_id"]) == ("cli report", "pending", "77")
    [run] = JobStore(engine).runs(job_id)
    assert (run.status, run.trigger, run.outbox_id) == ("delivering", "manual", row["id"])
    engine.dispose()

    assert jobs_cli(config, "list") == 0
    listing = capsys.readouterr().out
    assert job_id in listing and "(delivering)" in listing and "next 20" in listing and "Weekly KPI summary" in listing
    assert jobs_cli(config, "remove", job_id) == 0 and jobs_cli(config, "remove", job_id) == 1
    assert jobs_cli(config, "run", job_id) == 1
    capsys.readouterr()
    assert jobs_cli(config, "list") == 0 and capsys.readouterr().out == "no jobs\n"
