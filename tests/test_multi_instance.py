"""Two gateway processes on one PostgreSQL, webhook mode, every update posted to both."""

from __future__ import annotations

import pytest

from bench.multi_instance import run_multi_instance


@pytest.mark.timeout(400)  # 2,000 turns through two subprocesses: about a minute on an idle 2-core machine
def test_two_instances_lose_nothing_duplicate_nothing_keep_order(pg_database, tmp_path):
    figures = run_multi_instance(instances=2, sessions=200, messages=10, db_url=pg_database, workdir=tmp_path)
    print("multi-instance:", figures)
    assert figures["lost"] == 0, figures
    assert figures["duplicated"] == 0, figures
    assert figures["sessions_out_of_order"] == 0, figures
    assert figures["replies"] == 2000, figures
