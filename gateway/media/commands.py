"""``/files`` and ``/forget_files``: see how many files of yours the bot keeps, and delete them all.

Files belong to the user who sent them (their linked user, on every platform), in DMs and groups
alike. ``/forget_files`` deletes every file that user sent, in every conversation: the originals
and the renditions made for the model, from the blob store too (a blob someone else also sent
stays for them). The transcript keeps the file's name, type and size, so the conversation still
reads right; the model is then told the file is no longer stored.
"""

from __future__ import annotations

from gateway.core.i18n import _, ngettext, sentences
from gateway.core.types import InboundMessage
from gateway.media.index import MediaIndex
from gateway.media.render import human_size
from gateway.sessions.directory import Directory


class MediaCommands:
    """Answers ``/files`` and ``/forget_files`` for the sender's user."""

    def __init__(self, index: MediaIndex, directory: Directory, retention_days: float | None) -> None:
        self.index = index
        self.directory = directory
        self.retention_days = retention_days

    def handle(self, message: InboundMessage) -> str | None:
        """The reply to a file command, or ``None`` for any other message. Blocks on the database."""
        if message.command not in ("files", "forget_files"):
            return None
        user_id = self.directory.identify(message).user_id
        if message.command == "files":
            files, size = self.index.count(owner_user_id=user_id)
            kept = (_("Files are deleted {days:g} days after they were sent.", days=self.retention_days)
                    if self.retention_days else _("Files are kept as long as their conversation."))
            if not files:
                return sentences(_("I keep no files of yours."), kept)
            return sentences(ngettext("I keep {n} file you sent ({size}).", "I keep {n} files you sent ({size}).",
                                      files, n=files, size=human_size(size)),
                             kept, _("/forget_files deletes all of them now."))
        done = self.index.forget_user(user_id)
        if not done.files:
            return _("I keep no files of yours; nothing to delete.")
        return ngettext("Deleted {n} stored file you sent ({size} freed). The conversations keep only their names.",
                        "Deleted {n} stored files you sent ({size} freed). The conversations keep only their names.",
                        done.files, n=done.files, size=human_size(done.bytes))
