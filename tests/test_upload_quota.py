"""``UploadQuota`` (the web chat's per-browser upload bound): what one browser may upload in any
hour, the wait it is told when over, and that the quota frees up as its uploads age out."""

from __future__ import annotations

import pytest

from adapters.web.quota import WINDOW_S, UploadQuota


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_files_and_bytes_per_hour_are_bounded_and_freed_as_uploads_age_out():
    clock = Clock()
    quota = UploadQuota(files=2, size=100, clock=clock)
    assert quota.wait_s("a", 60) is None
    quota.add("a", 60)
    clock.now += 600
    assert quota.wait_s("a", 50) == pytest.approx(WINDOW_S - 600)  # 110 bytes: the first upload must age out
    assert quota.wait_s("b", 50) is None  # another browser is not held back
    quota.add("a", 30)
    clock.now += 60
    assert quota.wait_s("a", 1) == pytest.approx(WINDOW_S - 660)  # a third file: the oldest must age out
    clock.now += WINDOW_S - 660
    assert quota.wait_s("a", 60) is None  # the first has aged out; 30 + 60 fit
    assert quota.wait_s("a", 101) == WINDOW_S  # more than a whole hour's quota: never within this hour


def test_a_quota_without_room_for_one_file_is_refused():
    with pytest.raises(ValueError):
        UploadQuota(files=0, size=100)
