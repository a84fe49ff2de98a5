"""The blob store contract (``gateway.media.store``), on files and in the database (SQLite and
PostgreSQL): content addressing, idempotent puts, atomic files, damaged or missing blobs."""

from __future__ import annotations

import dataclasses
import hashlib
import threading

import pytest

from gateway.core.config import MediaConfig
from gateway.core.errors import BlobMissing
from gateway.core.types import Attachment, BlobRef, InboundMessage, MediaRef
from gateway.media.store import DatabaseBlobStore, FileBlobStore, open_blob_store
from gateway.store.db import create_db_engine, upgrade
from gateway.store.sql import Store


@pytest.fixture(params=["files", "sqlite", "postgres"])
def blobs(request, tmp_path):
    if request.param == "files":
        yield FileBlobStore(tmp_path / "media")
        return
    url = f"sqlite:///{tmp_path / 'g.db'}" if request.param == "sqlite" else request.getfixturevalue("pg_database")
    engine = create_db_engine(url)
    upgrade(engine)
    Store(engine).purge_all()
    yield DatabaseBlobStore(engine)
    engine.dispose()


def test_put_returns_the_content_address_and_get_returns_the_bytes(blobs):
    data = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 40
    ref = blobs.put(data, "image/png")
    assert ref == BlobRef(hashlib.sha256(data).hexdigest(), len(data), "image/png")
    assert blobs.get(ref) == data
    assert blobs.get(ref.sha256) == data
    assert blobs.exists(ref.sha256)
    assert blobs.reads == 2


def test_equal_bytes_are_stored_once_even_when_put_concurrently(blobs):
    data = b"same bytes" * 1000
    refs: list[BlobRef] = []
    threads = [threading.Thread(target=lambda: refs.append(blobs.put(data, "application/pdf"))) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({r.sha256 for r in refs}) == 1
    assert blobs.get(refs[0]) == data
    if isinstance(blobs, FileBlobStore):
        files = [p for p in blobs.root.rglob("*") if p.is_file()]
        assert [p.name for p in files] == [refs[0].sha256]  # no temporary file left behind


def test_missing_and_malformed_addresses_raise_blob_missing(blobs):
    with pytest.raises(BlobMissing):
        blobs.get("0" * 64)
    with pytest.raises(BlobMissing):
        blobs.get("../../etc/passwd")
    assert not blobs.exists("f" * 64)


def test_delete_removes_only_the_named_blobs(blobs):
    keep = blobs.put(b"keep", "text/plain")
    gone = blobs.put(b"gone", "text/plain")
    assert blobs.delete([gone.sha256, "e" * 64]) == 1
    assert blobs.get(keep) == b"keep"
    with pytest.raises(BlobMissing):
        blobs.get(gone)


def test_blobs_stored_before_a_time_are_listed_and_deleted_only_when_not_stored_again(blobs):
    """The sweep of unused blobs lists those last stored before a cutoff, and deletes with the
    same cutoff: a blob stored again in between (the same bytes uploaded anew) is kept."""
    import time

    old, renewed = blobs.put(b"old upload", "text/plain"), blobs.put(b"renewed upload", "text/plain")
    cutoff = time.time() + 0.05  # both were stored before it
    time.sleep(0.1)
    assert sorted(blobs.stored_before(cutoff)) == sorted([old.sha256, renewed.sha256])
    new = blobs.put(b"new upload", "text/plain")
    blobs.put(b"renewed upload", "text/plain")  # stored again after the cutoff
    assert new.sha256 not in set(blobs.stored_before(cutoff))
    assert blobs.delete([old.sha256, renewed.sha256, new.sha256], stored_before=cutoff) == 1
    assert not blobs.exists(old.sha256) and blobs.exists(renewed.sha256) and blobs.exists(new.sha256)


def test_file_store_shards_and_refuses_a_damaged_file(tmp_path):
    store = FileBlobStore(tmp_path)
    ref = store.put(b"original", "text/plain")
    path = store.path(ref)
    assert path == tmp_path / ref.sha256[:2] / ref.sha256[2:4] / ref.sha256
    path.write_bytes(b"altered")
    with pytest.raises(BlobMissing, match="damaged"):
        store.get(ref)


def test_config_picks_the_store(tmp_path):
    engine = create_db_engine(f"sqlite:///{tmp_path / 'g.db'}")
    assert isinstance(open_blob_store(MediaConfig(directory=str(tmp_path / "m")), engine), FileBlobStore)
    assert isinstance(open_blob_store(MediaConfig(store="database"), engine), DatabaseBlobStore)
    engine.dispose()


def test_attachment_and_reference_shapes_round_trip():
    photo = Attachment("image", "AgAD", "cat.jpg", "image/jpeg", 9775, width=1280, height=960)
    legacy = {"kind": "file", "file_id": "BQAC", "name": "a.pdf", "mime_type": "application/pdf", "size": 3}
    assert Attachment.from_dict(dataclasses.asdict(photo)) == photo
    assert Attachment.from_dict(legacy).kind == "document"
    ref = MediaRef("image", "image/jpeg", 9775, "a" * 64, "cat.jpg")
    assert ref.to_dict() == {"kind": "image", "mime_type": "image/jpeg", "size": 9775, "sha256": "a" * 64,
                             "name": "cat.jpg"}
    assert MediaRef.from_dict(ref.to_dict()) == ref
    assert MediaRef.from_dict({"kind": "file", "name": "x", "mime_type": None, "size": None}).kind == "document"


def test_inbound_messages_stored_before_the_new_fields_still_load():
    from gateway.core.types import ChatAddress, Sender

    message = InboundMessage(ChatAddress("telegram", "1", "2"), "2:3", "dm", Sender("2"), "hi",
                             attachments=(Attachment("image", "AgAD", size=5),), media_group_id="g1")
    data = message.to_dict()
    assert InboundMessage.from_dict(data) == message
    del data["media_group_id"]
    for a in data["attachments"]:
        for key in ("url", "width", "height", "sha256", "duration_s"):
            del a[key]
    assert InboundMessage.from_dict(data).attachments[0].file_id == "AgAD"


def test_postgresql_keeps_blob_bytes_out_of_line_uncompressed(pg_database):
    from sqlalchemy import text

    engine = create_db_engine(pg_database)
    upgrade(engine)
    with engine.connect() as conn:
        storage = conn.execute(text("SELECT attstorage FROM pg_attribute WHERE attrelid = 'blobs'::regclass "
                                    "AND attname = 'data'")).scalar()
    engine.dispose()
    assert storage == "e"  # EXTERNAL: TOASTed out of line, no compression attempt
