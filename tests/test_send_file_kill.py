"""``send_file`` exactly once across a ``kill -9`` during delivery: the gateway runs as a subprocess
(``python -m gateway run``), the fake holds the upload's answer, the gateway is killed and
restarted. Afterwards one upload is visible to the user, or the part in doubt is recorded
``unconfirmed`` and never resent, as for text (``bench/fault_injection.py`` does the same for text).

- Telegram: ``sendPhoto`` uploads and posts in one call, so the photo killed in flight is there and
  the row ends ``unconfirmed``: nothing is sent again.
- Slack: files upload v2 shares a file only at ``files.completeUploadExternal``; an upload killed
  before it is invisible, so the restarted gateway uploads again and completes once.
- Feishu: an upload killed in flight leaves an unused key; the restart uploads again and the
  message (one ``uuid``) is created once.
"""

from __future__ import annotations

import socket
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.fault_injection import TOKEN, GatewayProcess
from tests.conftest import FIXTURES
from tests.fakes.feishu import FakeFeishu
from tests.fakes.openai import FakeOpenAI
from tests.fakes.slack import FakeSlack
from tests.fakes.telegram import FakeTelegram
from tests.sendfile_flows import answer, flow, png, send, sha, shell, write_with_shell

pytestmark = pytest.mark.timeout(240)
CHART = png(480, 320)
TEXT = "Here is the chart."
CHANNEL, MENTION_TS = "C0GENERAL1", "1735689660.000200"
P2P = "oc_fakep2p000000000000000000000001"


@pytest.fixture(scope="module")
def fakes() -> Iterator[dict[str, Any]]:
    with FakeTelegram(token=TOKEN) as telegram, FakeSlack() as slack, FakeFeishu() as feishu, \
            FakeOpenAI(api_key="sk-test") as model:
        model.responder = flow(shell(write_with_shell("chart.png", CHART)), send("chart.png", "The chart"),
                               answer(TEXT))
        yield {"telegram": telegram, "slack": slack, "feishu": feishu, "model": model}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _gateway(workdir: Path, model: FakeOpenAI, platform: str) -> GatewayProcess:
    port = _port()
    (workdir / "gateway.toml").write_text(f"""
[database]
url = "sqlite:///{workdir / 'gateway.db'}"
[http]
port = {port}
[llm]
base_url = "{model.url}/v1"
api_key_env = "FAULT_OPENAI_KEY"
max_retries = 0
[delivery]
backoff_base_s = 0.05
claim_s = 60
[tools]
workspace = "shell"
workspace_root = "{workdir / 'workspaces'}"
[media]
directory = "{workdir / 'media'}"
[approvals]
require_for = []
[memory]
promote = false
[web]
enabled = false
[logging]
level = "WARNING"
{platform}
""")
    gateway = GatewayProcess(workdir / "gateway.toml", port, workdir)
    gateway.env_extra = {"FAULT_SLACK_BOT": "xoxb-fake-0001", "FAULT_SLACK_SIGNING": "fake-signing-secret-0001",
                         "FAULT_FEISHU_ID": "cli_fake00000000001", "FAULT_FEISHU_SECRET": "fake-app-secret-0001",
                         "FAULT_FEISHU_TOKEN": "fake-verification-token-0001"}
    return gateway


def _reply_row(workdir: Path) -> dict[str, Any] | None:
    """The reply's outbox row (the one carrying the file), read straight from the database file."""
    try:
        with sqlite3.connect(workdir / "gateway.db") as db:
            db.row_factory = sqlite3.Row
            row = db.execute("SELECT status, platform_message_ids, attachments FROM outbox "
                             "WHERE attachments IS NOT NULL AND attachments != 'null'").fetchone()
    except sqlite3.OperationalError:
        return None
    return dict(row) if row is not None else None


def _wait(predicate: Callable[[], object], what: str, timeout: float = 40.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _kill_while_held(gateway: GatewayProcess, holds: Any, name: str, deliver: Callable[[], None]) -> None:
    """Starts the gateway, makes the turn (``deliver``), kills -9 while the fake holds ``name``'s
    answer, lets the fake answer the dead connection, and starts the gateway again."""
    holds.hold_next(name)
    gateway.start()
    gateway.wait_ready()
    deliver()
    holds.wait_held(name, timeout=40)
    gateway.kill()
    holds.release()
    gateway.start()
    gateway.wait_ready()


def _settled(workdir: Path) -> dict[str, Any]:
    _wait(lambda: (row := _reply_row(workdir)) is not None and row["status"] in ("sent", "unconfirmed", "failed"),
          "the reply to settle after the restart")
    time.sleep(1.5)  # anything sent twice would arrive now
    row = _reply_row(workdir)
    assert row is not None
    return row


def test_telegram_photo_in_flight_at_the_kill_is_never_sent_twice(tmp_path, fakes):
    telegram, chat = fakes["telegram"], 5563001
    gateway = _gateway(tmp_path, fakes["model"], f"""[telegram]
enabled = true
token_env = "FAULT_TELEGRAM_TOKEN"
base_url = "{telegram.url}"
poll_timeout_s = 1""")
    update = {"message": {"message_id": 10, "from": {"id": chat, "is_bot": False, "first_name": "Ann"},
                          "chat": {"id": chat, "type": "private"}, "date": int(time.time()), "text": "chart please"}}
    try:
        _kill_while_held(gateway, telegram.holds, "sendPhoto", lambda: telegram.inject(update))
        row = _settled(tmp_path)
    finally:
        gateway.terminate()

    photos = [u for u in telegram.uploads if u["chat_id"] == chat]
    assert len(photos) == 1 and photos[0]["sha256"] == sha(CHART)  # it arrived once, before the kill
    assert len([c for c in telegram.calls("sendPhoto") if int(c.params["chat_id"]) == chat]) == 1  # never resent
    assert [m.get("text") for m in telegram.sent_messages(chat) if "text" in m] == [TEXT]
    assert row["status"] == "unconfirmed" and '"?"' in row["platform_message_ids"]


def test_slack_upload_cut_by_the_kill_is_redone_and_shared_once(tmp_path, fakes):
    slack = fakes["slack"]
    gateway = _gateway(tmp_path, fakes["model"], f"""[slack]
enabled = true
bot_token_env = "FAULT_SLACK_BOT"
signing_secret_env = "FAULT_SLACK_SIGNING"
api_url = "{slack.url}/api/"
""")
    shared_before, posts_before = len(slack.uploads.shared()), len(slack.uploads.upload_posts)
    body = (FIXTURES / "slack" / "channel_app_mention.json").read_bytes()
    url = f"http://127.0.0.1:{gateway.port}/slack/events"
    try:
        _kill_while_held(gateway, slack.uploads.holds, "upload",
                         lambda: slack.call(slack.post_event(url, body)))
        row = _settled(tmp_path)
    finally:
        gateway.terminate()

    shared = slack.uploads.shared()[shared_before:]
    assert len(shared) == 1 and shared[0]["sha256"] == sha(CHART)  # one file visible, in the thread
    assert (shared[0]["channel"], shared[0]["thread_ts"]) == (CHANNEL, MENTION_TS)
    assert len(slack.uploads.upload_posts) - posts_before == 2  # the cut upload was never completed
    assert row["status"] == "sent"
    assert [m["text"] for m in slack.posted(CHANNEL, MENTION_TS) if not m.get("subtype")].count(TEXT) == 1


def test_feishu_upload_cut_by_the_kill_is_redone_and_the_message_sent_once(tmp_path, fakes):
    feishu = fakes["feishu"]
    feishu.reset()
    gateway = _gateway(tmp_path, fakes["model"], f"""[feishu]
enabled = true
app_id_env = "FAULT_FEISHU_ID"
app_secret_env = "FAULT_FEISHU_SECRET"
verification_token_env = "FAULT_FEISHU_TOKEN"
encrypt_key_env = "FAULT_FEISHU_NO_KEY"
domain = "{feishu.url}"
""")
    url = f"http://127.0.0.1:{gateway.port}/feishu/events"
    event = feishu.text_event("chart please", chat_id=P2P)
    try:
        _kill_while_held(gateway, feishu.uploads.holds, "images", lambda: feishu.call(feishu.post_event(url, event)))
        row = _settled(tmp_path)
    finally:
        gateway.terminate()

    assert len(feishu.uploads.images) == 2  # the cut upload left an unused key behind
    sent = feishu.sent(P2P)
    images = [m for m in sent if m["msg_type"] == "post" and "img" in str(m["content"])]
    assert len(images) == 1 and images[0]["content"]["zh_cn"]["content"][0][0]["image_key"] in feishu.uploads.images
    assert len([m for m in sent if TEXT in str(m["content"])]) == 1
    assert row["status"] == "sent"

