"""Who uses which blob (``gateway.media.index``) on SQLite and PostgreSQL: deleting a user's files,
a session's files and expired files removes the blobs nobody else uses, and only those."""

from __future__ import annotations

import pytest

from gateway.core.errors import BlobMissing
from gateway.media.index import MediaIndex, Use
from gateway.media.store import FileBlobStore
from gateway.store.db import create_db_engine


@pytest.fixture
def media(db_url, tmp_path):
    engine = create_db_engine(db_url)
    blobs = FileBlobStore(tmp_path / "blobs")
    yield MediaIndex(engine, blobs), blobs
    engine.dispose()


def _put(blobs, index, data: bytes, *, session: str, owner: str, turn: str) -> str:
    ref = blobs.put(data, "image/png")
    index.record([Use(ref.sha256, "image", "image/png", ref.size, "a.png")], session_id=session, owner_user_id=owner,
                 turn_id=turn)
    return ref.sha256


def test_forgetting_a_user_keeps_a_blob_another_user_also_sent(media):
    index, blobs = media
    shared = _put(blobs, index, b"same meme", session="s1", owner="alice", turn="in1")
    _put(blobs, index, b"same meme", session="s2", owner="bob", turn="in2")
    own = _put(blobs, index, b"alice only", session="s1", owner="alice", turn="in3")
    assert index.count(owner_user_id="alice") == (2, len(b"same meme") + len(b"alice only"))

    gone = index.forget_user("alice")
    assert (gone.files, gone.blobs) == (2, 1)  # two files; the shared blob stays
    assert blobs.get(shared) == b"same meme"  # bob still has it
    with pytest.raises(BlobMissing):
        blobs.get(own)
    assert index.count(owner_user_id="alice") == (0, 0)


def test_forgetting_a_session_and_expiry(media):
    index, blobs = media
    first = _put(blobs, index, b"first", session="s1", owner="alice", turn="in1")
    second = _put(blobs, index, b"second", session="s2", owner="alice", turn="in2")
    assert index.forget_session("s1").files == 1
    assert not blobs.exists(first) and blobs.exists(second)
    assert index.expire(older_than_s=3600).files == 0  # recorded just now
    assert index.expire(older_than_s=-1).files == 1 and not blobs.exists(second)


def test_a_turn_run_again_records_its_files_once(media):
    index, blobs = media
    for _ in range(2):
        _put(blobs, index, b"photo", session="s1", owner="alice", turn="in7")
    assert index.count(session_id="s1")[0] == 1
