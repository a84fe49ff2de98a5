"""``gateway run --workers 2`` (here ``workers = 2`` in the config) on PostgreSQL against the loopback
fakes: real processes, one webhook port shared by both workers, replies counted per chat in the
fake Telegram. The supervisor is started once for the module; the tests run in file order and the
last one stops it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from bench.workers import INSTANCE_ID, burst, count_replies, rig
from tests.fakes import openai as oa

pytestmark = pytest.mark.timeout(240)

W1, W2 = f"{INSTANCE_ID}-w1", f"{INSTANCE_ID}-w2"


def pg_scratch() -> tuple[str, Any]:
    """A scratch PostgreSQL database ``(url, drop)``; skipped when PostgreSQL is unreachable, except
    in CI (``CI`` set), where that is a failure."""
    from bench.multi_instance import scratch_database

    try:
        return scratch_database()
    except Exception as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"PostgreSQL unreachable ({type(exc).__name__})")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    db_url, drop = pg_scratch()
    try:
        with rig(tmp_path_factory.mktemp("workers"), db_url, 2, worker_threads=32) as r:
            yield r
    finally:
        drop()


def _until(predicate, timeout: float, what: str) -> None:
    """Polls ``predicate`` every 50 ms; fails the test after ``timeout`` s (a bound, not a measurement)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _echo(request):
    return oa.text(f"re: {_last_line(request)}", pieces=1)


def _last_line(request) -> str:
    content = next(m["content"] for m in reversed(request["messages"]) if m["role"] == "user")
    return str(content).splitlines()[-1]


def test_both_workers_run_as_children_and_answer_on_the_one_port(cluster):
    instances = cluster.instances()
    assert set(instances) == {W1, W2}, instances
    assert sorted(instances.values()) == sorted(cluster.worker_pids())
    assert all(_ppid(pid) == cluster.proc.pid for pid in instances.values())
    seen: set[str] = set()
    for _ in range(200):  # each urlopen is a new connection; the kernel spreads them over the workers
        with urllib.request.urlopen(f"http://127.0.0.1:{cluster.port}/readyz", timeout=5) as resp:
            seen.add(json.loads(resp.read())["instance"])
        if seen == {W1, W2}:
            break
    assert seen == {W1, W2}


def test_a_burst_of_new_chats_is_answered_exactly_once(cluster):
    cluster.model.responder = _echo
    chats = 80
    asyncio.run(burst(cluster.webhook, chats, prefix="burst"))
    _until(lambda: count_replies(cluster.telegram, chats, "burst")["lost"] == 0, 90, "every chat's reply")
    time.sleep(1.0)  # a late duplicate would show now
    counted = count_replies(cluster.telegram, chats, "burst")
    assert counted == {"replies": chats, "lost": 0, "duplicated": 0, "wrong": 0}
    stored = cluster.query("SELECT count(*) FROM inbox WHERE status = 'done'")[0][0]
    assert stored == chats


def test_a_killed_worker_is_restarted_and_its_turns_are_taken_over(cluster):
    gate = threading.Event()
    cluster.model.responder = lambda req: oa.HeldReply(gate, _echo(req))
    chats, prefix, first = 24, "held", 1000  # new chats, not those of the burst above
    before = len(cluster.model.requests)
    asyncio.run(burst(cluster.webhook, chats, prefix, first))
    # Every turn is in its model call: each lane is leased by the worker running it.
    _until(lambda: len(cluster.model.requests) - before >= chats, 60, "every turn's model call")
    owners = dict(cluster.query("SELECT key, lease_owner FROM lanes WHERE key LIKE 'dm:%' AND lease_until > :now",
                                now=time.time()))
    assert set(owners.values()) == {W1, W2}, owners  # both workers took turns of the burst
    killed = cluster.instances()[W1]
    os.kill(killed, signal.SIGKILL)
    # The supervisor starts worker 1 again; with its instance id it takes the dead process's
    # leases over at once and runs those turns again (the model is asked again: still held).
    _until(lambda: cluster.instances().get(W1) not in (None, killed), 90, "worker 1 started again")
    again = list(owners.values()).count(W1)
    _until(lambda: len(cluster.model.requests) - before >= chats + again, 60, "the dead worker's turns run again")
    gate.set()
    _until(lambda: count_replies(cluster.telegram, chats, prefix, first)["lost"] == 0, 90, "every chat's reply")
    time.sleep(1.0)
    assert count_replies(cluster.telegram, chats, prefix, first) == {"replies": chats, "lost": 0, "duplicated": 0,
                                                              "wrong": 0}
    log = cluster.log.read_text()
    assert f"worker 1 exited (signal {signal.SIGKILL.value})" in log
    assert "took over" in log
    assert sorted(cluster.instances().values()) == sorted(cluster.worker_pids())


def test_sigterm_stops_every_worker_and_releases_their_ids(cluster):
    pids = cluster.worker_pids()
    assert len(pids) == 2
    assert cluster.stop() == 0
    assert not any(Path(f"/proc/{pid}").exists() for pid in pids)  # stopped and reaped
    assert cluster.instances() == {}  # both released their ids (and leases) at a graceful stop
    assert cluster.query("SELECT count(*) FROM lanes WHERE lease_owner IS NOT NULL")[0][0] == 0
    assert "all workers stopped" in cluster.log.read_text()


def test_several_workers_on_sqlite_are_refused_with_one_line(tmp_path):
    import subprocess
    import sys

    config = tmp_path / "gateway.toml"
    config.write_text(f'[database]\nurl = "sqlite:///{tmp_path / "gw.db"}"\n')
    done = subprocess.run([sys.executable, "-m", "gateway", "--config", str(config), "run", "--workers", "3"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "error: 3 workers (--workers or the workers key) need PostgreSQL"), done.stderr
    assert not (tmp_path / "gw.db").exists()


def test_telegram_long_polling_with_two_workers_has_one_poller(tmp_path):
    """Polling mode: the receiver lease lets one worker poll ``getUpdates`` (two pollers would get
    409 Conflict from Telegram, and from the fake); every update is answered once."""
    from bench.workers import CHAT_BASE

    db_url, drop = pg_scratch()
    chats = 20
    try:
        with rig(tmp_path, db_url, 2, worker_threads=8, mode="polling") as r:
            r.model.responder = _echo
            for c in range(chats):
                user = {"id": CHAT_BASE + c, "is_bot": False, "first_name": f"U{c}"}
                r.telegram.inject({"message": {"message_id": 1, "from": user, "date": int(time.time()),
                                               "chat": {"id": CHAT_BASE + c, "type": "private"}, "text": f"poll{c}"}})
            _until(lambda: count_replies(r.telegram, chats, "poll")["lost"] == 0, 90, "every chat's reply")
            time.sleep(1.0)
            assert count_replies(r.telegram, chats, "poll") == {"replies": chats, "lost": 0, "duplicated": 0,
                                                                "wrong": 0}
            poller = r.query("SELECT lease_owner FROM lanes WHERE key LIKE 'receiver:telegram:%'")
            assert [row[0] for row in poller] in ([W1], [W2])
            assert r.stop() == 0
        assert "getUpdates failed" not in r.log.read_text()  # no 409: never two pollers at once
    finally:
        drop()


def test_a_start_up_error_of_the_workers_stops_the_supervisor_with_status_2(tmp_path):
    """A worker that cannot start (here: Telegram webhook mode without its secret) is not restarted
    in a loop: the supervisor stops the others and exits 2 under the worker's one-line error."""
    import subprocess
    import sys

    db_url, drop = pg_scratch()
    config = tmp_path / "gateway.toml"
    config.write_text(f'workers = 2\n[database]\nurl = "{db_url}"\n[http]\nport = 0\n'
                      '[telegram]\nenabled = true\nmode = "webhook"\ntoken_env = "NO_SUCH_TOKEN_VAR"\n'
                      '[logging]\nlevel = "WARNING"\n')
    env = {k: v for k, v in os.environ.items() if k != "NO_SUCH_TOKEN_VAR"}
    try:
        done = subprocess.run([sys.executable, "-m", "gateway", "--config", str(config), "run"],
                              capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    finally:
        drop()
    assert done.returncode == 2, done.stderr
    assert "error: telegram is enabled but environment variable NO_SUCH_TOKEN_VAR is not set" in done.stderr
    assert "could not start (exit status 2" in done.stderr, done.stderr
    assert "restarting it" not in done.stderr
