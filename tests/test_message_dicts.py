"""Messages as stored (inbox payloads, outbox addresses, transcript metas): ``to_dict`` gives what
``dataclasses.asdict`` gives, and ``from_dict`` reads it back to the same message."""

from __future__ import annotations

import dataclasses

from gateway.core.types import (
    Attachment,
    ChatAddress,
    ContextMessage,
    InboundMessage,
    MediaRef,
    OutboundAttachment,
    Sender,
)


def _message() -> InboundMessage:
    photo = Attachment("image", "AgAD-1", name="cat.jpg", mime_type="image/jpeg", size=51_200, width=1280,
                       height=960)
    quoted = ContextMessage("5:40", "the picture", "Ann", 1_700_000_000.5, (photo,), from_bot=True, partial=True)
    return InboundMessage(ChatAddress("telegram", "77", "-1005", "12"), "-1005:41", "group",
                          Sender("5", "Ann Lee", "ann", False), "what is this?", reply_to_id="40", command=None,
                          attachments=(photo, Attachment("voice", "AwAD-2", duration_s=3.5)), received_at=1.25,
                          event_id="u1", addressed=True, quoted=quoted, media_group_id="g1", language="de",
                          locale="en")


def test_an_inbound_message_is_stored_as_asdict_gives_it_and_read_back_whole():
    message = _message()
    stored = message.to_dict()
    assert stored == dataclasses.asdict(message)
    assert isinstance(stored["attachments"], tuple) and isinstance(stored["attachments"][0], dict)
    assert InboundMessage.from_dict(stored) == message


def test_stored_dicts_are_copies_not_views_of_the_message():
    ref = MediaRef("image", "image/png", 10, sha256="ab", image={"sha256": "cd", "size": 4})
    stored = ref.to_dict()
    stored["image"]["size"] = 99  # a later edit of the stored dict never changes the message
    assert ref.image == {"sha256": "cd", "size": 4}
    assert MediaRef("voice", "audio/ogg", 5).to_dict() == {"kind": "voice", "mime_type": "audio/ogg", "size": 5}


def test_addresses_and_outbound_files_are_stored_as_asdict_gives_them():
    address = ChatAddress("slack", "T1", "C2", None)
    assert address.to_dict() == dataclasses.asdict(address)
    assert ChatAddress.from_dict(address.to_dict()) == address
    attachment = OutboundAttachment("image", "chart.png", "image/png", 2_048, "ab" * 32, caption="Q3", width=640,
                                    height=480)
    assert attachment.to_dict() == dataclasses.asdict(attachment)


def test_a_usage_entry_is_stored_with_every_field():
    from gateway.store.sql import UsageEntry

    entry = UsageEntry("u1", "telegram:1:5", "dm:u1", "telegram", "default", "gpt-4o-mini", "2026-12-01", 120, 64, 30,
                       0.00042)
    assert entry.columns() == dataclasses.asdict(entry)
