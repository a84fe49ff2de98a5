"""What Slack refuses of an outbound file, and the raw upload step of files upload v2. Pure rules
plus one HTTP call.

Slack Web API, "Uploading files" (files.getUploadURLExternal -> POST the bytes to the returned
``upload_url`` -> files.completeUploadExternal): a file is at most 1 GB; the file appears in the
channel (or thread) only when the upload is completed, so an upload cut before completion shows
nothing and may be done again.
"""

from __future__ import annotations

import aiohttp

from gateway.core.files import MB, human_size
from gateway.core.types import OutboundAttachment

MAX_FILE_BYTES = 1000 * MB
UPLOAD_TIMEOUT_S = 120.0


class UploadFailed(Exception):
    """The POST to ``upload_url`` did not answer 200 (nothing is visible; the part may be redone)."""


def attachment_problem(attachment: OutboundAttachment) -> str | None:
    """``None`` when Slack takes the file, else why not."""
    if attachment.size <= 0:
        return f"{attachment.name} is empty; Slack does not take empty files."
    if attachment.size > MAX_FILE_BYTES:
        return (f"Slack takes files up to {human_size(MAX_FILE_BYTES)} (files.getUploadURLExternal); "
                f"{attachment.name} is {human_size(attachment.size)}.")
    return None


async def upload_bytes(url: str, data: bytes) -> None:
    """Step 2 of files upload v2: the bytes as the POST body to the URL Slack returned (it carries
    its own authorization; no token is sent). Raises ``UploadFailed`` on any status but 200, and
    ``aiohttp.ClientError`` / ``TimeoutError`` on network failures."""
    timeout = aiohttp.ClientTimeout(total=UPLOAD_TIMEOUT_S)
    async with aiohttp.ClientSession(trust_env=True, timeout=timeout) as session, \
            session.post(url, data=data, headers={"Content-Type": "application/octet-stream"}) as response:
        await response.read()
        if response.status != 200:
            raise UploadFailed(f"upload answered HTTP {response.status}")
