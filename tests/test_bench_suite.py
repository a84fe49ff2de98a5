"""The benchmark suite in its short mode: every benchmark still runs and yields sane figures."""

from __future__ import annotations

import pytest

from bench.admit import run_admit
from bench.suite import run_suite


@pytest.mark.timeout(360)  # eight gateway subprocesses one after another (minutes on a loaded machine)
def test_bench_suite_short_mode(tmp_path):
    figures = run_suite(tmp_path, short=True)
    (burst,) = figures["burst"]
    assert burst["gateway"]["answered"] == 5 and burst["floor"]["answered"] == 5
    assert burst["gateway"]["lost"] == [] and burst["gateway"]["duplicated"] == []
    assert burst["gateway"]["previews"] == 5 and burst["floor"]["previews"] == 0  # each reply streamed into one
    assert burst["ratio_to_floor"] > 0 and burst["gateway_cpu_ms_per_turn"] > 0 and burst["rss_peak_mb"] > 0
    # where the burst's time went: first, median and last model request and reply; each reply
    # comes a model call (0.2 s, then 6 words 0.3 s apart) after its request
    asked, replied = burst["gateway"]["model_requests_s"], burst["gateway"]["replies_s"]
    assert len(asked) == len(replied) == 3 and asked == sorted(asked) and replied == sorted(replied)
    assert replied[0] >= asked[0] + 0.2 + 5 * 0.3 and replied[2] == burst["gateway"]["seconds"]
    sequential = figures["overhead_sequential"]["gateway"]
    assert sequential["completed"] == 5 and sequential["cpu_ms_per_turn"] > 0
    timeline = {mark: ms for ms, mark in figures["overhead_sequential"]["timeline_ms"]}
    assert timeline["TelegramAdapter._handle_webhook>"] == 0
    # every turn is a new chat's: its lane is claimed in the admit, with no claim of its own
    assert 0 < timeline["SessionBus.claim_free_in<"] < timeline["SessionBus._drain>"]
    assert timeline["SessionBus._drain>"] < timeline["CurlEndpoint._send>"]  # llm.http_client auto: libcurl
    assert "Store._claim_next>" not in timeline
    assert timeline["CurlEndpoint._send>"] < timeline["Store.finish_turn>"]
    assert timeline["Store.finish_turn<"] < timeline["TelegramAdapter._api>"]
    overhead = figures["overhead"]
    assert overhead["gateway"]["completed"] == 10 and overhead["floor"]["completed"] == 10
    assert overhead["gateway"]["overhead"]["p50_ms"] > 0
    (throughput,) = figures["throughput"]
    assert throughput["completion"] == 1.0 and throughput["turns_per_s"] > 0
    assert figures["rss"]["rss_active_peak_mb"] > 0
    long = figures["long_conversation"]
    assert long["model_requests"] == 12 and long["prefix_stable_share"] == 1.0
    assert long["input_tokens"]["turn_10"] > 0
    assert figures["load_time"]["messages_1000_ms"] > 0
    assert figures["restart"]["idle_chat_max_s"] is not None and figures["restart"]["duplicated"] == []
    store = figures["store_turns"]  # a new chat's claim (in its admit) and finish: 15 planned statements on SQLite
    assert store["claim"] == "admit" and store["statements_per_turn"] == 14 and store["cpu_us_per_turn"] > 0
    # a batch of 4 new chats admitted together: its senders, their chats' settings and its inbox rows
    # in 5 statements for the lot, then 5 a chat for its lane's claim (on SQLite: the lane, its
    # batch, the new session, the lane's pointer to it, the memory candidates)
    admit = figures["admit"]
    assert admit["backend"] == "sqlite" and admit["statements_per_batch"] == 5 + 5 * 4 and admit["cpu_ms_per_batch"] > 0


def test_bench_admit_on_postgresql(tmp_path):
    """On PostgreSQL a batch of new chats is 8 statements, however many chats: 5 for its senders,
    settings and inbox rows, 1 for the lanes' claims with their batches, 2 for the new sessions and
    the lanes' pointers to them: one round trip each."""
    admit = run_admit(tmp_path, batch=4, rounds=1, postgres=True)
    assert admit["backend"] == "postgresql" and admit["statements_per_batch"] == 5 + 1 + 2
    assert admit["wall_ms_per_batch"] > 0 and admit["cpu_ms_per_batch"] > 0
