"""(a) Gateway overhead per turn at a fixed message rate, beside a floor (a bare relay).

Overhead = (model request arrival - webhook post) + (Bot API ``sendMessage`` arrival - model
reply), with an instant fake model: everything the gateway adds on the way in and on the way
out (dedupe/inbox write, lane lease, session load, transcript and outbox writes, delivery). The
floor is the same HTTP in/out through ``bench.relay`` (no database), measured in the same run.

``run_image_overhead``: the same measure for turns that carry a photo (a 1280 x 960 JPEG, as
Telegram's largest photo size, served by the fake Bot API), beside text turns in the same run,
and the two costs an image should add and no more: the download (``getFile`` + the file URL, timed
alone against the same fake) and the re-encode (``gateway.media.images.prepare_image``, timed in
this process). ``python -m bench.overhead --images``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from bench.fault_injection import ROOT, TOKEN, _free_port
from bench.harness import (
    CHAT_BASE,
    Rig,
    cpu_seconds,
    idle_cpu_per_s,
    last_user_line,
    ms,
    percentile,
    positive_int,
    positive_rate,
    post,
    rig,
    update,
    wait_for,
)
from bench.profile import recording, summary
from bench.timeline import hook_env, summarise
from tests.fakes import openai as oa

_MESSAGE_IDS = itertools.count(10_000)


class _Stamps:
    """Model reply times by token (the responder runs when the fake answers)."""

    def __init__(self) -> None:
        self.replied: dict[str, float] = {}

    def responder(self, request: dict[str, Any]) -> oa.TextReply:
        token = last_user_line(request)
        self.replied[token] = time.time()
        return oa.text(f"re: {token}", pieces=1)


async def _drive(url: str, rig_: Rig, tag: str, messages: int, rate: float, chats: int,
                 stamps: _Stamps, timeout: float,
                 make: Callable[[int, int, str], dict[str, Any]] = update) -> dict[str, Any]:
    """Posts ``messages`` at ``rate``/s round-robin over ``chats`` DMs (each update built by ``make``);
    returns the latency figures."""
    posted: dict[str, float] = {}
    start_ids = len(rig_.model.requests), len(rig_.telegram.calls("sendMessage"))
    async with aiohttp.ClientSession() as http:
        tasks = []
        start = time.monotonic()
        for i in range(messages):
            await asyncio.sleep(max(0.0, start + i / rate - time.monotonic()))
            token = f"{tag}-{i:05d}"
            posted[token] = time.time()
            body = make(CHAT_BASE + i % chats, next(_MESSAGE_IDS), token)
            tasks.append(asyncio.create_task(post(http, url, body)))
        await asyncio.gather(*tasks)
        done = await wait_for(lambda: len(rig_.telegram.calls("sendMessage")) - start_ids[1] >= messages, timeout)
    mono_to_wall = time.time() - time.monotonic()
    arrived = {last_user_line(r["json"]): r["time"] for r in rig_.model.requests[start_ids[0]:]}
    sent = {c.params["text"].removeprefix("re: "): c.time + mono_to_wall
            for c in rig_.telegram.calls("sendMessage")[start_ids[1]:]}
    inbound, outbound, total = [], [], []
    for token, t0 in posted.items():
        if token in arrived and token in sent and token in stamps.replied:
            inbound.append(arrived[token] - t0)
            outbound.append(sent[token] - stamps.replied[token])
            total.append(inbound[-1] + outbound[-1])

    def summary(values: list[float]) -> dict[str, float]:
        return {"p50_ms": ms(percentile(values, 0.5)), "p99_ms": ms(percentile(values, 0.99))}

    return {"completed": len(total), "all_replied": done, "inbound_to_model": summary(inbound),
            "model_to_platform": summary(outbound), "overhead": summary(total)}


def run_overhead(workdir: Path, *, messages: int = 1000, rate: float = 50.0, chats: int = 50,
                 warmup: int = 20, profile: bool = False, db_url: str | None = None,
                 timeline: bool = False) -> dict[str, Any]:
    """Runs gateway and floor at the same rate; returns both and the difference at p50/p99, and
    the gateway's CPU per turn (process CPU time / turns, its idle rate subtracted). ``chats`` =
    ``messages``: every turn is the first of a new chat. ``profile``: a py-spy summary of the
    gateway's run (``bench.profile``). ``db_url``: the gateway's database (default: a fresh SQLite
    file in ``workdir``). ``timeline``: the median wall-clock timeline of a turn in the gateway
    (``bench.timeline``; its marks make the gateway a little slower)."""
    stamps = _Stamps()
    marks = workdir / "timeline.json"
    env = hook_env(marks) if timeline else None
    with rig(workdir, env, **({"db_url": db_url} if db_url else {})) as r:
        r.model.responder = stamps.responder
        asyncio.run(_drive(r.webhook, r, "warm", warmup, rate, chats, stamps, 30))
        pid = r.gateway.proc.pid  # type: ignore[union-attr]
        idle = idle_cpu_per_s(pid)
        record = recording(pid, workdir / "overhead.collapsed") if profile else contextlib.nullcontext()
        with record:
            cpu_before, wall_before = cpu_seconds(pid), time.monotonic()
            gateway = asyncio.run(_drive(r.webhook, r, "gw", messages, rate, chats, stamps, 60 + messages / rate))
            cpu = cpu_seconds(pid) - cpu_before - idle * (time.monotonic() - wall_before)
        gateway["cpu_ms_per_turn"] = round(1000 * max(cpu, 0.0) / max(1, gateway["completed"]), 2)
        gateway["idle_cpu_ms_per_s"] = round(1000 * idle, 2)
        port = _free_port()
        relay = subprocess.Popen([sys.executable, "-m", "bench.relay", str(port), f"{r.model.url}/v1",
                                  r.telegram.url, TOKEN], cwd=ROOT)
        try:
            url = f"http://127.0.0.1:{port}/telegram/webhook"
            asyncio.run(_wait_up(f"http://127.0.0.1:{port}/healthz"))
            asyncio.run(_drive(url, r, "rwarm", warmup, rate, chats, stamps, 30))
            floor = asyncio.run(_drive(url, r, "relay", messages, rate, chats, stamps, 60 + messages / rate))
        finally:
            relay.terminate()
            relay.wait(10)
    figures = {"rate_per_s": rate, "messages": messages, "chats": chats, "gateway": gateway, "floor": floor,
               "added_by_gateway_ms": {q: round(gateway["overhead"][q] - floor["overhead"][q], 2)
                                       for q in ("p50_ms", "p99_ms")},
               "p50_ratio_to_floor": {leg: round(gateway[leg]["p50_ms"] / max(floor[leg]["p50_ms"], 1e-6), 2)
                                      for leg in ("inbound_to_model", "model_to_platform", "overhead")}}
    if profile:
        figures["profile"] = summary(workdir / "overhead.collapsed")
    if timeline:
        figures["timeline_ms"] = summarise(marks, skip=warmup)
    return figures


async def _wait_up(url: str, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            try:
                async with http.get(url) as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
    raise TimeoutError(f"{url} did not come up")


def photo_jpeg(width: int = 1280, height: int = 960) -> bytes:
    """A photo-like JPEG (noise compresses like a real photo does, unlike a flat colour)."""
    import io

    from PIL import Image

    out = io.BytesIO()
    noise = Image.effect_noise((width // 4, height // 4), 60).resize((width, height), Image.Resampling.BICUBIC)
    Image.merge("RGB", (noise, noise.rotate(90, expand=False), noise.transpose(Image.Transpose.FLIP_LEFT_RIGHT))
                ).save(out, "JPEG", quality=85)
    return out.getvalue()


def photo_update(chat: int, message_id: int, caption: str, file_id: str, size: int) -> dict[str, Any]:
    body = update(chat, message_id, caption)
    message = body["message"]
    del message["text"]
    message["caption"] = caption
    message["photo"] = [{"file_id": file_id, "file_unique_id": file_id[-32:], "width": 1280, "height": 960,
                         "file_size": size}]
    return body


async def _drive_photos(url: str, rig_: Rig, tag: str, messages: int, rate: float, chats: int,
                        stamps: _Stamps, timeout: float, photo: bytes, first_chat: int = 0) -> dict[str, Any]:
    """Like ``_drive`` with a distinct photo file per message (each is downloaded and re-encoded)."""
    ids = itertools.count()

    def with_photo(chat: int, message_id: int, text: str) -> dict[str, Any]:
        file_id = f"bench-photo-{tag}-{next(ids):06d}"
        rig_.telegram.add_file(file_id, photo)
        return photo_update(chat + first_chat, message_id, text, file_id, len(photo))

    return await _drive(url, rig_, tag, messages, rate, chats, stamps, timeout, with_photo)


async def _time_downloads(rig_: Rig, photo: bytes, runs: int) -> list[float]:
    """``getFile`` + ``GET /file/bot<token>/<path>`` against the same fake, as the adapter does."""
    took = []
    async with aiohttp.ClientSession() as http:
        for i in range(runs):
            file_id = rig_.telegram.add_file(f"bench-dl-{i:05d}", photo)
            start = time.perf_counter()
            async with http.post(f"{rig_.telegram.url}/bot{TOKEN}/getFile", json={"file_id": file_id}) as resp:
                path = (await resp.json())["result"]["file_path"]
            async with http.get(f"{rig_.telegram.url}/file/bot{TOKEN}/{path}") as resp:
                await resp.read()
            took.append(time.perf_counter() - start)
    return took


def run_image_overhead(workdir: Path, *, messages: int = 200, rate: float = 10.0,
                       warmup: int = 10) -> dict[str, Any]:
    """Text turns and photo turns at the same rate in one gateway, and what a photo should add:
    the download and the re-encode, each timed alone. Returns the figures (ms).

    Each photo turn is the first of its chat (``chats`` new chats per run), so a request carries
    exactly one image: later turns of a chat also resend its recent images (``media.history_images``),
    which costs request size, not gateway work."""
    from gateway.media.images import prepare_image

    stamps = _Stamps()
    photo = photo_jpeg()
    encode = []
    for _ in range(max(20, messages // 5)):
        start = time.perf_counter()
        prepare_image(photo)
        encode.append(time.perf_counter() - start)
    with rig(workdir) as r:
        r.model.responder = stamps.responder
        asyncio.run(_drive(r.webhook, r, "warm", warmup, rate, warmup, stamps, 30))
        asyncio.run(_drive_photos(r.webhook, r, "pwarm", warmup, rate, warmup, stamps, 30, photo,
                                  first_chat=2 * messages))
        text = asyncio.run(_drive(r.webhook, r, "text", messages, rate, messages, stamps, 60 + messages / rate))
        photos = asyncio.run(_drive_photos(r.webhook, r, "photo", messages, rate, messages, stamps,
                                           60 + messages / rate, photo, first_chat=messages))
        download = asyncio.run(_time_downloads(r, photo, max(20, messages // 5)))
    p50 = {"download_ms": ms(percentile(download, 0.5)), "reencode_ms": ms(percentile(encode, 0.5))}
    return {"rate_per_s": rate, "messages": messages, "photo_bytes": len(photo), "text": text, "photo": photos,
            "added_by_image_p50_ms": round(photos["overhead"]["p50_ms"] - text["overhead"]["p50_ms"], 2),
            "download_plus_reencode_p50_ms": round(p50["download_ms"] + p50["reencode_ms"], 2), **p50}


if __name__ == "__main__":
    import argparse
    import json
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", action="store_true", help="text turns beside photo turns")
    parser.add_argument("--messages", type=positive_int, default=200)
    parser.add_argument("--rate", type=positive_rate, default=10.0)
    parser.add_argument("--chats", type=positive_int, default=None,
                        help="text turns spread over this many chats (= --messages: each a new chat)")
    parser.add_argument("--postgres", action="store_true",
                        help="the gateway on a scratch PostgreSQL database (bench.multi_instance.PG_ADMIN_URL)")
    parser.add_argument("--profile", action="store_true", help="a py-spy summary of the gateway's run")
    parser.add_argument("--timeline", action="store_true",
                        help="the median wall-clock timeline of a turn in the gateway (bench.timeline)")
    args = parser.parse_args()
    drop = None
    with tempfile.TemporaryDirectory() as tmp:
        if args.images:
            figures = run_image_overhead(Path(tmp), messages=args.messages, rate=args.rate)
        else:
            options: dict[str, Any] = {"profile": args.profile, "timeline": args.timeline}
            if args.chats:
                options["chats"] = args.chats
            if args.postgres:
                from bench.multi_instance import scratch_database

                options["db_url"], drop = scratch_database()
            try:
                figures = run_overhead(Path(tmp), messages=args.messages, rate=args.rate, **options)
            finally:
                if drop is not None:
                    drop()
        print(json.dumps(figures, indent=2))
