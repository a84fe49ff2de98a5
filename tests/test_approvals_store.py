"""Approvals across instances: the waiting turn polls the database, so a decision made through
another engine (another instance) wakes it; decisions are first-wins and end at expiry."""

from __future__ import annotations

import threading
import time

from agent.context import RunContext
from agent.tools import Tool
from gateway.core.types import ChatAddress
from gateway.store.db import create_db_engine, upgrade
from gateway.tools.approvals import ApprovalPolicy, ChatApprover, decide_reply
from gateway.tools.approvals_store import Approvals

WRITE = Tool("write_file", "d", {"type": "object"}, fn=lambda **_: "", side_effect="write")


def engines(tmp_path):
    url = f"sqlite:///{tmp_path / 'a.db'}"
    first = create_db_engine(url)
    upgrade(first)
    return first, create_db_engine(url)


def test_a_decision_on_another_instance_wakes_the_waiting_turn(tmp_path):
    one, two = engines(tmp_path)
    approver = ChatApprover(Approvals(one), ApprovalPolicy(timeout_s=10, poll_s=0.05),
                            ChatAddress("telegram", "1", "42"), "key", "in1", "u1")
    result: list = []
    waiter = threading.Thread(target=lambda: result.append(approver(RunContext(call_id="c1"), WRITE, {"path": "x"})))
    started = time.monotonic()
    waiter.start()
    other = Approvals(two)
    while True:
        with two.connect() as conn:
            row = conn.exec_driver_sql("select id from approvals").first()
        if row:
            break
        time.sleep(0.02)
    assert decide_reply(other, "approve", row[0], "u2", is_admin=False).startswith("Only the person")
    assert decide_reply(other, "approve", row[0].upper(), "u1", is_admin=False) == "Approved: running write_file."
    waiter.join(5)
    assert result == [None] and time.monotonic() - started < 3
    assert decide_reply(other, "deny", row[0], "u1", is_admin=False).startswith(f"Request {row[0]} is already closed")
    with two.connect() as conn:
        prompt = conn.exec_driver_sql("select text from outbox").scalar_one()
    assert f"/approve {row[0]}" in prompt and '"path": "x"' in prompt


def test_no_chat_to_ask_denies_and_reads_need_no_approval(tmp_path):
    one, _ = engines(tmp_path)
    approver = ChatApprover(Approvals(one), ApprovalPolicy(), None, "key", "job1", None)
    assert approver(RunContext(), WRITE, {}).startswith("Denied: write_file needs a person's approval")
    read = Tool("read_file", "d", {"type": "object"}, fn=lambda **_: "", side_effect="read")
    assert approver(RunContext(), read, {}) is None
