"""Seeded hostile requests for the webhook fuzz suite (``tests/test_hostile_payloads.py``).

Each platform's generator yields ``Case`` values of four kinds, mixed at random from one seed:

- ``forged``: a bad, absent or unreadable signature / secret / token / cookie (non-UTF-8 bytes
  included), a stale timestamp, a body altered after signing. Must get 401/403 and never be
  processed. Its body is usually a well-formed message to a chat of its own, so a forgery that
  slipped through would be answered there.
- ``unreadable``: correctly signed, but not an event the gateway can use: not JSON, non-UTF-8
  bytes, deep nesting, fields of the wrong JSON type (``header``/``event``/``user``/chat ids, texts,
  entity offsets), null chats, numbers out of range. Must be acknowledged (2xx; the web chat,
  whose client is our own page, answers 400 with a reason) and never processed; when it carries a
  readable id, exactly one WARNING names it.
- ``odd``: authentic and usable once cleaned: lone surrogates and NUL in texts, display names,
  tenant keys and file names, huge timestamps, very long names, unknown extra fields. Must be
  answered exactly once.
- ``genuine``: an ordinary DM. Must be answered exactly once.

Texts of forged and unreadable cases carry the markers ``FORGED`` / ``UNREADABLE``; the model
must never see either.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.fakes.feishu import encrypt_body
from tests.fakes.feishu import signature as lark_signature

JSON = dict[str, Any]
MIX = {"forged": 0.4, "unreadable": 0.5, "odd": 0.05, "genuine": 0.05}
"""Share of each kind among a platform's cases."""

SURROGATES = ("\ud800", "\udfff", "\ud83d", "\udc00", "\udbff")
PIECES = ("héllo", "日本語", "🙂", "\u202eabc", "e\u0301", "  ", "\t", "<b>x</b>", "&amp;", "ß", "\u200b", "Ω")


@dataclass
class Case:
    """One request: where it goes, its raw bytes, what kind it is and whose replies count."""

    kind: str
    label: str
    path: str
    body: bytes
    headers: list[tuple[bytes, bytes]]
    chat: str | None = None
    """The chat whose replies are counted (``genuine``/``odd``: exactly one; else none)."""
    log_id: str | None = None
    """``unreadable`` only: the id exactly one WARNING must name."""
    meta: dict[str, Any] = field(default_factory=dict)


def _json(value: Any) -> bytes:
    return json.dumps(value).encode()  # ensure_ascii: lone surrogates go out as "\udXXX" escapes


def deep(rng: random.Random, inner: bytes = b"1") -> bytes:
    """JSON nested far deeper than any parser's recursion limit."""
    depth = rng.randint(2_000, 40_000)
    if rng.random() < 0.5:
        return b"[" * depth + inner + b"]" * depth
    return b'{"a":' * depth + inner + b"}" * depth


def surrogate(rng: random.Random) -> str:
    return rng.choice(SURROGATES)


def odd_text(rng: random.Random, marker: str) -> str:
    """``marker`` among odd but valid characters, with a lone surrogate or a NUL somewhere."""
    pieces = [marker] + [rng.choice(PIECES) for _ in range(rng.randint(0, 4))]
    rng.shuffle(pieces)
    pieces.insert(rng.randint(0, len(pieces)), rng.choice((surrogate(rng), "\x00", surrogate(rng) + "\x00")))
    return " ".join(pieces)


def garbage_bytes(rng: random.Random) -> bytes:
    return rng.choice((b"{not json", b"\xff\xfe\x00{", b"", b"null", b"[]", b"42", b'"x"', b"{" * 3,
                       b'{"a": "\xc3\x28"}', b"\x80" * rng.randint(1, 64)))


def _pick(rng: random.Random) -> str:
    roll, total = rng.random(), 0.0
    for kind, share in MIX.items():
        total += share
        if roll < total:
            return kind
    return "genuine"


class Generator:
    """Base: ``cases(n)`` draws ``n`` cases from the kinds' variant tables."""

    def __init__(self, rng: random.Random, start: int = 0) -> None:
        self.rng = rng
        self.n = start
        """The last case number drawn (ids and chats derive from it: runs with distinct ``start``
        values against the same fakes never share a chat)."""

    def variants(self, kind: str) -> list[Callable[[int], Case]]:
        return [getattr(self, name) for name in sorted(dir(self)) if name.startswith(f"{kind}_")]

    def cases(self, count: int) -> list[Case]:
        tables = {kind: self.variants(kind) for kind in MIX}
        out = []
        for _ in range(count):
            self.n += 1
            kind = _pick(self.rng)
            make = self.rng.choice(tables[kind])
            case = make(self.n)
            case.kind, case.label = kind, make.__name__
            out.append(case)
        return out


# ---- Telegram (webhook, X-Telegram-Bot-Api-Secret-Token) -------------------------------------------

class TelegramCases(Generator):
    """Webhook updates (Telegram Bot API: Update, Message; setWebhook ``secret_token``)."""

    path = "/telegram/webhook"

    def __init__(self, rng: random.Random, secret: str, start: int = 0) -> None:
        super().__init__(rng, start)
        self.secret = secret.encode()

    @staticmethod
    def chat_of(kind: str, n: int) -> int:
        return {"genuine": 7_100_000_000, "odd": 7_200_000_000, "forged": 7_300_000_000,
                "unreadable": 7_400_000_000}[kind] + n

    def update(self, n: int, chat: int, text: Any, **message: Any) -> JSON:
        msg = {"message_id": n, "date": int(time.time()), "text": text,
               "chat": {"id": chat, "type": "private", "first_name": "Fuzz"},
               "from": {"id": chat, "is_bot": False, "first_name": "Fuzz", "language_code": "en"}}
        msg.update(message)
        return {"update_id": 900_000_000 + n, "message": msg}

    def signed(self, body: bytes, chat: int | None = None, log_id: int | None = None) -> Case:
        return Case("", "", self.path, body, [(b"Content-Type", b"application/json"),
                                              (b"X-Telegram-Bot-Api-Secret-Token", self.secret)],
                    chat=str(chat) if chat is not None else None,
                    log_id=str(log_id) if log_id is not None else None)

    # -- genuine / odd
    def genuine_dm(self, n: int) -> Case:
        chat = self.chat_of("genuine", n)
        return self.signed(_json(self.update(n, chat, f"genuine telegram {n}")), chat)

    def odd_text(self, n: int) -> Case:
        chat = self.chat_of("odd", n)
        return self.signed(_json(self.update(n, chat, odd_text(self.rng, f"odd telegram {n}"))), chat)

    def odd_names(self, n: int) -> Case:
        chat = self.chat_of("odd", n)
        upd = self.update(n, chat, f"odd names {n}")
        upd["message"]["from"].update(first_name="A" + surrogate(self.rng) + "\x00",
                                      last_name="Z" * self.rng.randint(200, 5000),
                                      username="u" + surrogate(self.rng) * 3)
        upd["message"]["chat"]["first_name"] = surrogate(self.rng)
        return self.signed(_json(upd), chat)

    def odd_file_name(self, n: int) -> Case:
        chat = self.chat_of("odd", n)
        upd = self.update(n, chat, None, caption=f"odd file {n}",
                          document={"file_id": "BQ" + surrogate(self.rng) + str(n), "file_unique_id": f"u{n}",
                                    "file_name": "re" + surrogate(self.rng) + "port\x00.pdf",
                                    "mime_type": "application/pdf" + surrogate(self.rng), "file_size": 12})
        del upd["message"]["text"]
        return self.signed(_json(upd), chat)

    def odd_extra_fields(self, n: int) -> Case:
        chat = self.chat_of("odd", n)
        upd = self.update(n, chat, f"odd extra {n}", some_future_field={"x": [1, 2, {"y": None}]},
                          entities=[{"type": "bold", "offset": 0, "length": 3}, {"type": "future", "offset": 99,
                                                                                  "length": 1_000}])
        upd["future_update_kind"] = None
        return self.signed(_json(upd), chat)

    # -- forged
    def _forged_body(self, n: int) -> bytes:
        roll = self.rng.random()
        if roll < 0.15:
            return deep(self.rng)
        if roll < 0.25:
            return garbage_bytes(self.rng)
        return _json(self.update(n, self.chat_of("forged", n), f"FORGED telegram {n}"))

    def _forged(self, n: int, headers: list[tuple[bytes, bytes]]) -> Case:
        return Case("", "", self.path, self._forged_body(n), [(b"Content-Type", b"application/json"), *headers])

    def forged_no_secret(self, n: int) -> Case:
        return self._forged(n, [])

    def forged_empty_secret(self, n: int) -> Case:
        return self._forged(n, [(b"X-Telegram-Bot-Api-Secret-Token", b"")])

    def forged_wrong_secret(self, n: int) -> Case:
        return self._forged(n, [(b"X-Telegram-Bot-Api-Secret-Token", uuid.uuid4().hex.encode())])

    def forged_non_utf8_secret(self, n: int) -> Case:
        junk = self.rng.choice((b"\xff", b"\xfe\xfd", b"\x80\x81", b"\xc3\x28"))
        return self._forged(n, [(b"X-Telegram-Bot-Api-Secret-Token", self.secret + junk)])

    def forged_non_ascii_secret(self, n: int) -> Case:
        return self._forged(n, [(b"X-Telegram-Bot-Api-Secret-Token", self.secret[:-1] + "é".encode())])

    def forged_prefix_secret(self, n: int) -> Case:
        return self._forged(n, [(b"X-Telegram-Bot-Api-Secret-Token", self.secret[:-1])])

    def forged_other_header(self, n: int) -> Case:
        return self._forged(n, [(b"X-Telegram-Bot-Api-Secret", self.secret)])

    # -- unreadable (right secret)
    def _bad(self, n: int, mutate: Callable[[JSON], Any], logged: bool = True) -> Case:
        upd = self.update(n, self.chat_of("unreadable", n), f"UNREADABLE telegram {n}")
        mutate(upd)
        return self.signed(_json(upd), log_id=upd.get("update_id") if logged else None)

    def unreadable_bytes(self, n: int) -> Case:
        roll = self.rng.random()
        if roll < 0.4:
            body = deep(self.rng)
        elif roll < 0.7:
            body = _json(self.update(n, self.chat_of("unreadable", n), "UNREADABLE")).replace(
                b"UNREADABLE", b"UNREADABLE \xff\xfe")
        else:
            body = garbage_bytes(self.rng)
        return self.signed(body)

    def unreadable_chat(self, n: int) -> Case:
        bad = self.rng.choice((None, "abc", 1.5, 10**30, True, [], {"id": "x", "type": "private"},
                               {"id": 1}, {"type": "private"}, {"id": 5, "type": 7}, {"id": -10**40, "type": "group"}))
        return self._bad(n, lambda u: u["message"].__setitem__("chat", bad))

    def unreadable_chat_id(self, n: int) -> Case:
        bad = self.rng.choice(("abc", "12", 1.5, 10**30, False, None, [1]))
        return self._bad(n, lambda u: u["message"]["chat"].__setitem__("id", bad))

    def unreadable_text(self, n: int) -> Case:
        bad = self.rng.choice((12345, 1.5, ["UNREADABLE"], {"t": "UNREADABLE"}, True))
        return self._bad(n, lambda u: u["message"].__setitem__("text", bad))

    def unreadable_entities(self, n: int) -> Case:
        bad = self.rng.choice(([{"type": "mention", "offset": "0", "length": 4}],
                               [{"type": "bot_command", "offset": 0, "length": "4"}],
                               [{"type": 5, "offset": 0, "length": 1}], [None], "x", [{"offset": 0}],
                               [{"type": "mention", "offset": -3, "length": 2}],
                               [{"type": "mention", "offset": 0, "length": 10**20}]))
        return self._bad(n, lambda u: u["message"].__setitem__("entities", bad))

    def unreadable_sender(self, n: int) -> Case:
        bad = self.rng.choice(("x", 5, [], {"id": "abc", "is_bot": False, "first_name": "x"},
                               {"id": 5, "is_bot": "no", "first_name": "x"},
                               {"id": 5, "is_bot": False, "first_name": 9}))
        return self._bad(n, lambda u: u["message"].__setitem__("from", bad))

    def unreadable_numbers(self, n: int) -> Case:
        field_, bad = self.rng.choice((("date", 10**20), ("date", "yesterday"), ("date", -1), ("message_id", "x"),
                                       ("message_id", 10**25), ("message_thread_id", "topic"),
                                       ("is_topic_message", "yes")))
        return self._bad(n, lambda u: u["message"].__setitem__(field_, bad))

    def unreadable_shape(self, n: int) -> Case:
        which = self.rng.randrange(7)
        mutate: Callable[[JSON], Any]
        if which == 0:
            mutate = lambda u: u.__setitem__("message", self.rng.choice(("x", [], 5)))  # noqa: E731
        elif which == 1:
            mutate = lambda u: u["message"].__setitem__("reply_to_message", self.rng.choice(("x", 5, [1])))  # noqa: E731
        elif which == 2:
            mutate = lambda u: u["message"].__setitem__("photo", self.rng.choice(("x", [1], [{"file_id": 5}])))  # noqa: E731
        elif which == 3:
            mutate = lambda u: u["message"].__setitem__("document", {"file_id": "x", "file_name": 5})  # noqa: E731
        elif which == 4:
            mutate = lambda u: u.__setitem__("edited_message", "x")  # noqa: E731
        elif which == 5:  # well-typed, but the SDK needs a sticker's size and kind
            mutate = lambda u: u["message"].__setitem__("sticker", {"file_id": "CAAD", "file_unique_id": "u"})  # noqa: E731
        else:
            mutate = lambda u: u.__setitem__("callback_query", self.rng.choice((  # noqa: E731
                "x", {"id": 5, "from": {"id": 1, "is_bot": False, "first_name": "x"}, "chat_instance": "c"},
                {"id": "q", "from": None, "chat_instance": "c", "data": "/help"},
                {"id": "q", "from": {"id": 1, "is_bot": False, "first_name": "x"}, "chat_instance": "c",
                 "data": 5})))
        return self._bad(n, mutate)

    def unreadable_update_id(self, n: int) -> Case:
        bad = self.rng.choice(("x", None, 10**40, 1.5, [], -5))
        return self._bad(n, lambda u: u.__setitem__("update_id", bad), logged=False)


# ---- Slack (Events API, X-Slack-Signature) -----------------------------------------------------------

class SlackCases(Generator):
    """Events API requests (Slack request signing: v0 HMAC-SHA256 over ``v0:{ts}:{raw body}``)."""

    path = "/slack/events"

    def __init__(self, rng: random.Random, signing_secret: str, team_id: str, start: int = 0) -> None:
        super().__init__(rng, start)
        self.secret = signing_secret.encode()
        self.team_id = team_id

    @staticmethod
    def chat_of(kind: str, n: int) -> str:
        return f"D0{kind[:3].upper()}{n:06d}"

    def envelope(self, n: int, channel: str, text: Any, **event: Any) -> JSON:
        ts = f"{int(time.time())}.{n:06d}"
        ev = {"type": "message", "user": f"U0{channel[2:]}", "text": text, "ts": ts, "channel": channel,
              "event_ts": ts, "channel_type": "im", "team": self.team_id}
        ev.update(event)
        return {"token": "FakeLegacyVerificationToken0001", "team_id": self.team_id, "api_app_id": "A0FAKE0001",
                "event": ev, "type": "event_callback", "event_id": f"EvFZ{n:06d}", "event_time": int(time.time()),
                "authorizations": [{"enterprise_id": None, "team_id": self.team_id, "user_id": "U0BOT00001",
                                    "is_bot": True, "is_enterprise_install": False}],
                "is_ext_shared_channel": False}

    def sign(self, body: bytes, timestamp: bytes | None = None) -> list[tuple[bytes, bytes]]:
        stamp = timestamp if timestamp is not None else str(int(time.time())).encode()
        digest = hmac.new(self.secret, b"v0:" + stamp + b":" + body, hashlib.sha256).hexdigest()
        return [(b"X-Slack-Request-Timestamp", stamp), (b"X-Slack-Signature", b"v0=" + digest.encode())]

    def signed(self, body: bytes, chat: str | None = None, log_id: str | None = None, *,
               content_type: bytes = b"application/json") -> Case:
        return Case("", "", self.path, body, [(b"Content-Type", content_type), *self.sign(body)], chat=chat,
                    log_id=log_id)

    # -- genuine / odd
    def genuine_dm(self, n: int) -> Case:
        chat = self.chat_of("genuine", n)
        return self.signed(_json(self.envelope(n, chat, f"genuine slack {n}")), chat)

    def odd_text(self, n: int) -> Case:
        chat = self.chat_of("odd", n)
        return self.signed(_json(self.envelope(n, chat, odd_text(self.rng, f"odd slack {n}"))), chat)

    def odd_tenant(self, n: int) -> Case:
        chat = self.chat_of("odd", n)
        env = self.envelope(n, chat, f"odd tenant {n}")
        env["team_id"] = "T0" + surrogate(self.rng) + "\x00"
        return self.signed(_json(env), chat)

    def odd_file_name(self, n: int) -> Case:
        chat = self.chat_of("odd", n)
        files = [{"id": f"F0{n:08d}", "name": "re" + surrogate(self.rng) + "port.pdf", "title": surrogate(self.rng),
                  "mimetype": "application/pdf", "size": 10}]
        return self.signed(_json(self.envelope(n, chat, f"odd file {n}", subtype="file_share", files=files)), chat)

    def odd_timestamp(self, n: int) -> Case:
        chat = self.chat_of("odd", n)
        env = self.envelope(n, chat, f"odd ts {n}")
        env["event"]["ts"] = self.rng.choice(("1e999", "nan", f"99999999999999999999.{n:06d}", "-inf", "0x1p9"))
        env["event_time"] = 10**30
        return self.signed(_json(env), chat)

    # -- forged
    def _forged_body(self, n: int) -> bytes:
        roll = self.rng.random()
        if roll < 0.15:
            return deep(self.rng)
        if roll < 0.25:
            return garbage_bytes(self.rng)
        return _json(self.envelope(n, self.chat_of("forged", n), f"FORGED slack {n}"))

    def _forged(self, n: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> Case:
        return Case("", "", self.path, body, [(b"Content-Type", b"application/json"), *headers])

    def forged_unsigned(self, n: int) -> Case:
        return self._forged(n, self._forged_body(n), [])

    def forged_bad_signature(self, n: int) -> Case:
        body = self._forged_body(n)
        stamp = str(int(time.time())).encode()
        digest = hmac.new(b"not-the-secret", b"v0:" + stamp + b":" + body, hashlib.sha256).hexdigest()
        return self._forged(n, body, [(b"X-Slack-Request-Timestamp", stamp), (b"X-Slack-Signature",
                                                                              b"v0=" + digest.encode())])

    def forged_stale(self, n: int) -> Case:
        body = self._forged_body(n)
        age = self.rng.choice((301, 3600, -400, 10**6))
        return self._forged(n, body, self.sign(body, str(int(time.time()) - age).encode()))

    def forged_bad_timestamp(self, n: int) -> Case:
        body = self._forged_body(n)
        stamp = self.rng.choice((b"soon", b"", b"\xff\xfe", b"1e9", b"9" * 5000, "١٧٣٥".encode(), b"12\x80",
                                 b"-", b"0x10"))
        return self._forged(n, body, self.sign(body, stamp))

    def forged_non_utf8_signature(self, n: int) -> Case:
        body = self._forged_body(n)
        headers = self.sign(body)
        junk = self.rng.choice((b"\xff", b"\xc3\x28", "é".encode(), b"\x80" * 64))
        headers[1] = (b"X-Slack-Signature", headers[1][1][:-2] + junk)
        return self._forged(n, body, headers)

    def forged_altered_body(self, n: int) -> Case:
        env = self.envelope(n, self.chat_of("forged", n), f"FORGED altered {n}")
        body = _json(env)
        headers = self.sign(body)
        return self._forged(n, body.replace(b"FORGED altered", b"FORGED ALTERED"), headers)

    def forged_interaction(self, n: int) -> Case:
        payload = {"type": "block_actions", "user": {"id": "U0FOR", "name": "x"}, "team": {"id": self.team_id},
                   "channel": {"id": self.chat_of("forged", n)},
                   "actions": [{"action_id": "gw_cmd_0", "value": "/help", "action_ts": "1.2"}]}
        from urllib.parse import urlencode
        body = urlencode({"payload": json.dumps(payload)}).encode()
        return Case("", "", self.path, body, [(b"Content-Type", b"application/x-www-form-urlencoded")])

    # -- unreadable (correctly signed)
    def _bad(self, n: int, mutate: Callable[[JSON], Any], logged: bool = True) -> Case:
        env = self.envelope(n, self.chat_of("unreadable", n), f"UNREADABLE slack {n}")
        mutate(env)
        return self.signed(_json(env), log_id=env.get("event_id") if logged else None)

    def unreadable_bytes(self, n: int) -> Case:
        roll = self.rng.random()
        if roll < 0.35:
            body = deep(self.rng)
        elif roll < 0.7:
            body = _json(self.envelope(n, self.chat_of("unreadable", n), "UNREADABLE")).replace(
                b"UNREADABLE", b"UNREADABLE \xff\xfe\xc3\x28")
        else:
            body = garbage_bytes(self.rng)
        return self.signed(body)

    def unreadable_event(self, n: int) -> Case:
        bad = self.rng.choice(("x", [], 5, None, [{"type": "message"}], {"type": 5}, {"type": None}))
        return self._bad(n, lambda e: e.__setitem__("event", bad))

    def unreadable_event_fields(self, n: int) -> Case:
        field_, bad = self.rng.choice((("user", 5), ("user", {"id": "U1"}), ("user", ["U1"]), ("text", 5),
                                       ("text", ["UNREADABLE"]), ("text", {"t": 1}), ("channel", 5),
                                       ("channel", None), ("ts", 1.5), ("ts", ["1"]), ("thread_ts", 1),
                                       ("files", "x"), ("files", [1]), ("files", [{"id": 5}]), ("subtype", 5),
                                       ("bot_id", []), ("channel_type", 7), ("bot_profile", "x"),
                                       ("channel", "D" * 5000), ("user", "U" * 5000)))
        return self._bad(n, lambda e: e["event"].__setitem__(field_, bad))

    def unreadable_envelope_fields(self, n: int) -> Case:
        field_, bad = self.rng.choice((("team_id", 5), ("team_id", {"id": "T"}), ("authorizations", "x"),
                                       ("authorizations", 5), ("authorizations", [5]), ("enterprise_id", []),
                                       ("is_ext_shared_channel", "yes"), ("api_app_id", 5),
                                       ("type", 5), ("type", None), ("team_id", "T" * 5000)))
        return self._bad(n, lambda e: e.__setitem__(field_, bad))

    def unreadable_event_id(self, n: int) -> Case:
        bad = self.rng.choice((5, [], {"id": 1}, 1.5))
        return self._bad(n, lambda e: e.__setitem__("event_id", bad), logged=False)

    def unreadable_challenge(self, n: int) -> Case:
        body = _json({"token": "x", "type": "url_verification", "challenge": self.rng.choice((5, None, [], {"a": 1}))})
        return self.signed(body)

    def unreadable_interaction(self, n: int) -> Case:
        from urllib.parse import urlencode
        good = {"type": "block_actions", "user": {"id": "U0UNR", "name": "x"}, "team": {"id": self.team_id},
                "channel": {"id": self.chat_of("unreadable", n)}, "message": {"ts": "1.1"},
                "actions": [{"action_id": "gw_cmd_0", "value": "/help", "action_ts": "1.2"}]}
        field_, bad = self.rng.choice((("user", "x"), ("user", {"id": 5}), ("actions", "x"), ("actions", [1]),
                                       ("actions", [{"action_id": "gw_cmd_0", "value": 5}]), ("channel", "x"),
                                       ("team", 5), ("message", "x"), ("container", 5), ("type", 5)))
        good[field_] = bad
        raw = self.rng.choice((json.dumps(good), json.dumps(good), "{not json", deep(self.rng).decode()))
        body = urlencode({"payload": raw}).encode()
        return self.signed(body, content_type=b"application/x-www-form-urlencoded")


# ---- Feishu (webhook with an Encrypt Key: X-Lark-Signature; verification token in the body) ------------

class FeishuCases(Generator):
    """Event pushes (Feishu event subscription, schema 2.0, ``im.message.receive_v1``)."""

    path = "/feishu/events"

    def __init__(self, rng: random.Random, token: str, encrypt_key: str, tenant_key: str, app_id: str,
                 start: int = 0) -> None:
        super().__init__(rng, start)
        self.token, self.key, self.tenant_key, self.app_id = token, encrypt_key, tenant_key, app_id

    @staticmethod
    def chat_of(kind: str, n: int) -> str:
        return f"oc_fz{kind[:3]}{n:06d}"

    def event(self, n: int, chat: str, text: Any, *, content: Any = None, message_type: str = "text") -> JSON:
        now = str(int(time.time() * 1000))
        message = {"message_id": f"om_fz{n:08d}", "root_id": "", "parent_id": "", "create_time": now,
                   "update_time": now, "chat_id": chat, "chat_type": "p2p", "message_type": message_type,
                   "content": json.dumps(content if content is not None else {"text": text}), "mentions": []}
        return {"schema": "2.0",
                "header": {"event_id": f"evfz{n:08d}", "token": self.token, "create_time": now,
                           "event_type": "im.message.receive_v1", "tenant_key": self.tenant_key,
                           "app_id": self.app_id},
                "event": {"sender": {"sender_id": {"open_id": f"ou_fz{n:08d}", "union_id": "", "user_id": ""},
                                     "sender_type": "user", "tenant_key": self.tenant_key}, "message": message}}

    def headers(self, body: bytes, key: str | None = None, timestamp: str | None = None) -> list[tuple[bytes, bytes]]:
        timestamp, nonce = timestamp or str(int(time.time())), uuid.uuid4().hex
        sig = lark_signature(timestamp, nonce, key or self.key, body)
        return [(b"Content-Type", b"application/json"), (b"X-Lark-Request-Timestamp", timestamp.encode()),
                (b"X-Lark-Request-Nonce", nonce.encode()), (b"X-Lark-Signature", sig.encode())]

    def push(self, plain: bytes, *, encrypt: bool | None = None, chat: str | None = None,
             log_id: str | None = None) -> Case:
        """Signed (and, at random, encrypted) as Feishu pushes with an Encrypt Key set."""
        if encrypt if encrypt is not None else self.rng.random() < 0.5:
            plain = _json({"encrypt": encrypt_body(plain, self.key)})
        return Case("", "", self.path, plain, self.headers(plain), chat=chat, log_id=log_id)

    # -- genuine / odd
    def genuine_dm(self, n: int) -> Case:
        chat = self.chat_of("genuine", n)
        return self.push(_json(self.event(n, chat, f"genuine feishu {n}")), chat=chat)


    def odd_text(self, n: int) -> Case:
        chat = self.chat_of("odd", n)
        return self.push(_json(self.event(n, chat, odd_text(self.rng, f"odd feishu {n}"))), chat=chat)

    def odd_tenant(self, n: int) -> Case:
        chat = self.chat_of("odd", n)
        ev = self.event(n, chat, f"odd tenant {n}")
        ev["header"]["tenant_key"] = "tk" + surrogate(self.rng) + "\x00"
        return self.push(_json(ev), chat=chat)

    def odd_file_name(self, n: int) -> Case:
        chat = self.chat_of("odd", n)
        ev = self.event(n, chat, None, message_type="file",
                        content={"file_key": "file_v2_" + surrogate(self.rng), "file_name": "a" + surrogate(
                            self.rng) + "\x00.txt"})
        return self.push(_json(ev), chat=chat)

    def odd_create_time(self, n: int) -> Case:
        chat = self.chat_of("odd", n)
        ev = self.event(n, chat, f"odd time {n}")
        big = self.rng.choice(("9" * 400, "9" * 30, "-" + "9" * 400, "abc", "", "1e999"))
        ev["event"]["message"]["create_time"] = big
        ev["header"]["create_time"] = big
        return self.push(_json(ev), chat=chat)

    # -- forged
    def _forged_body(self, n: int) -> bytes:
        roll = self.rng.random()
        if roll < 0.15:
            return deep(self.rng)
        if roll < 0.25:
            return garbage_bytes(self.rng)
        return _json(self.event(n, self.chat_of("forged", n), f"FORGED feishu {n}"))

    def forged_wrong_key(self, n: int) -> Case:
        body = self._forged_body(n)
        return Case("", "", self.path, body, self.headers(body, "not-the-key"))

    def forged_non_utf8_signature(self, n: int) -> Case:
        body = self._forged_body(n)
        headers = self.headers(body)
        junk = self.rng.choice((b"\xff", b"\xc3\x28", "é".encode(), b"\x80" * 64))
        headers[3] = (b"X-Lark-Signature", headers[3][1][:-2] + junk)
        if self.rng.random() < 0.5:
            headers[1] = (b"X-Lark-Request-Timestamp", b"\xff" + headers[1][1])
        return Case("", "", self.path, body, headers)

    def forged_altered(self, n: int) -> Case:
        body = _json(self.event(n, self.chat_of("forged", n), f"FORGED altered {n}"))
        headers = self.headers(body)
        return Case("", "", self.path, body.replace(b"FORGED altered", b"FORGED ALTERED"), headers)

    def forged_wrong_token(self, n: int) -> Case:
        ev = self.event(n, self.chat_of("forged", n), f"FORGED token {n}")
        ev["header"]["token"] = self.rng.choice(("not-the-token", "", None, 5, [self.token], self.token + "é",
                                                 self.token[:-1], {"t": self.token}))
        if self.rng.random() < 0.3:
            ev.pop("header")
            ev["token"] = "nope"
        body = _json(ev)
        if self.rng.random() < 0.4:
            body = _json({"encrypt": encrypt_body(body, self.key)})
        return Case("", "", self.path, body, [(b"Content-Type", b"application/json")])

    def forged_unsigned_with_token(self, n: int) -> Case:
        """Unsigned although an encrypt key is set (Feishu then signs every push): refused even
        with the right verification token (it leaks more easily than the key)."""
        body = _json(self.event(n, self.chat_of("forged", n), f"FORGED unsigned {n}"))
        return Case("", "", self.path, body, [(b"Content-Type", b"application/json")])

    def forged_stale(self, n: int) -> Case:
        """Signed with the right key, but older than Feishu's re-push window: a replay."""
        body = self._forged_body(n)
        return Case("", "", self.path, body, self.headers(body, timestamp=str(int(time.time()) - 9 * 3600)))

    def forged_unverifiable(self, n: int) -> Case:
        """Unsigned, and no readable token: nothing proves where it came from."""
        body = self.rng.choice((deep(self.rng), garbage_bytes(self.rng), _json({"header": "x"}),
                                _json({"header": ["x"], "event": {}}), _json({"encrypt": "AAAA" * 9}),
                                _json({"encrypt": 5}), _json({"encrypt": encrypt_body(b"\xff\xfe", "other-key")}),
                                _json({"encrypt": encrypt_body(deep(self.rng), self.key)}),
                                _json({"schema": "2.0", "header": {"token": self.token + "x"}})))
        return Case("", "", self.path, body, [(b"Content-Type", b"application/json")])

    # -- unreadable (signed with the right key)
    def _bad(self, n: int, mutate: Callable[[JSON], Any], logged: bool = True) -> Case:
        ev = self.event(n, self.chat_of("unreadable", n), f"UNREADABLE feishu {n}")
        mutate(ev)
        event_id = (ev.get("header") or {}).get("event_id") if isinstance(ev.get("header"), dict) else None
        return self.push(_json(ev), log_id=event_id if logged and isinstance(event_id, str) else None)

    def unreadable_bytes(self, n: int) -> Case:
        roll = self.rng.random()
        if roll < 0.35:
            body = deep(self.rng)
        elif roll < 0.7:
            body = _json(self.event(n, self.chat_of("unreadable", n), "UNREADABLE")).replace(
                b"UNREADABLE", b"UNREADABLE \xff\xfe")
        else:
            body = garbage_bytes(self.rng)
        return self.push(body)

    def unreadable_event(self, n: int) -> Case:
        bad = self.rng.choice(("x", [], 5, None, {"message": "x"}, {"sender": "x", "message": {}},
                               {"sender": {"sender_id": "x"}}))
        return self._bad(n, lambda e: e.__setitem__("event", bad))

    def unreadable_header(self, n: int) -> Case:
        field_, bad = self.rng.choice((("event_type", 5), ("event_type", ["im.message.receive_v1"]),
                                       ("tenant_key", 5), ("tenant_key", {"k": 1}), ("create_time", {"a": 1}),
                                       ("app_id", []), ("tenant_key", "t" * 5000)))
        return self._bad(n, lambda e: e["header"].__setitem__(field_, bad))

    def unreadable_message(self, n: int) -> Case:
        field_, bad = self.rng.choice((("content", 5), ("content", {"text": "x"}), ("content", json.dumps(
            {"text": 5})), ("content", json.dumps(["x"])), ("mentions", "x"), ("mentions", [1]),
            ("mentions", [{"key": 5, "id": "x"}]), ("message_id", 5), ("chat_id", ["oc"]), ("chat_type", 5),
            ("message_type", 5), ("thread_id", 5), ("create_time", {"t": 1}), ("chat_id", "oc" * 3000),
            ("content", json.dumps({"title": 5, "content": "x"})), ("content", "{" * 5000 + "}" * 5000)))

        def mutate(e: JSON) -> None:
            e["event"]["message"][field_] = bad
            if field_ == "content" and "title" in str(bad):
                e["event"]["message"]["message_type"] = "post"

        return self._bad(n, mutate)

    def unreadable_sender(self, n: int) -> Case:
        bad = self.rng.choice(("x", 5, {"sender_id": "x"}, {"sender_id": {"open_id": 5}}, {"sender_type": 5}))
        return self._bad(n, lambda e: e["event"].__setitem__("sender", bad))

    def unreadable_card_action(self, n: int) -> Case:
        ev = self.event(n, self.chat_of("unreadable", n), "UNREADABLE")
        ev["header"]["event_type"] = "card.action.trigger"
        ev["event"] = self.rng.choice(("x", {"operator": "x"}, {"operator": {"open_id": 5}, "action": "x"},
                                       {"operator": {"open_id": "ou"}, "action": {"value": "x"},
                                        "context": "x"}, {"action": {"value": {"gw_cmd": 5}}}))
        return self.push(_json(ev), log_id=ev["header"]["event_id"])


# ---- Web chat (signed cookie + X-Requested-With) ------------------------------------------------------

class WebCases(Generator):
    """Chat POSTs (``POST /web/messages``) from browsers with a signed identity cookie."""

    path = "/web/messages"

    def __init__(self, rng: random.Random, cookie_for: Callable[[str], str], start: int = 0) -> None:
        super().__init__(rng, start)
        self.cookie_for = cookie_for

    @staticmethod
    def chat_of(kind: str, n: int) -> str:
        return f"fz{kind[:3]}{n:06d}"

    def headers(self, user: str | None, cookie: bytes | None = None,
                requested_with: bytes | None = b"gateway-web") -> list[tuple[bytes, bytes]]:
        out = [(b"Content-Type", b"application/json")]
        if requested_with is not None:
            out.append((b"X-Requested-With", requested_with))
        if cookie is None and user is not None:
            cookie = self.cookie_for(user).encode()
        if cookie is not None:
            out.append((b"Cookie", b"gw_web=" + cookie))
        return out

    def post(self, n: int, text: Any, name: Any = "Fuzz") -> JSON:
        return {"id": f"fzmsg{n:08d}", "text": text, "name": name}

    # -- genuine / odd
    def genuine_message(self, n: int) -> Case:
        user = self.chat_of("genuine", n)
        return Case("", "", self.path, _json(self.post(n, f"genuine web {n}")), self.headers(user), chat=user)

    def odd_text(self, n: int) -> Case:
        user = self.chat_of("odd", n)
        return Case("", "", self.path, _json(self.post(n, odd_text(self.rng, f"odd web {n}"))), self.headers(user),
                    chat=user)

    def odd_name(self, n: int) -> Case:
        user = self.chat_of("odd", n)
        name = self.rng.choice(("A" + surrogate(self.rng), "\x00" * 3 + "Z", "N" * 10_000, surrogate(self.rng) * 70))
        return Case("", "", self.path, _json(self.post(n, f"odd name {n}", name)), self.headers(user), chat=user)

    # -- forged
    def _forged_body(self, n: int) -> bytes:
        if self.rng.random() < 0.2:
            return self.rng.choice((deep(self.rng), garbage_bytes(self.rng)))
        return _json(self.post(n, f"FORGED web {n}"))

    def forged_no_cookie(self, n: int) -> Case:
        return Case("", "", self.path, self._forged_body(n), self.headers(None))

    def forged_bad_cookie(self, n: int) -> Case:
        good = self.cookie_for(self.chat_of("forged", n)).encode()
        middle = len(good) - 5  # not the last character: its low bits are padding, ignored when decoded
        flipped = good[:middle] + (b"B" if good[middle:middle + 1] == b"A" else b"A") + good[middle + 1:]
        cookie = self.rng.choice((flipped, b"fzfor.x", b"", good.replace(b".", b"-"),
                                  good + b"\xff", b"\xff\xfe" + good, good[:-2] + "é".encode(), b"\x80" * 40))
        return Case("", "", self.path, self._forged_body(n), self.headers(None, cookie))

    def forged_no_requested_with(self, n: int) -> Case:
        value = self.rng.choice((None, b"", b"XMLHttpRequest", b"gateway-web\xff", "gatewày-web".encode()))
        return Case("", "", self.path, self._forged_body(n),
                    self.headers(self.chat_of("forged", n), requested_with=value))

    # -- unreadable (right cookie and header): 400 with a reason
    def unreadable_body(self, n: int) -> Case:
        user = self.chat_of("unreadable", n)
        body = self.rng.choice((deep(self.rng), garbage_bytes(self.rng),
                                _json(self.post(n, "UNREADABLE")).replace(b"UNREADABLE", b"UNREADABLE \xff")))
        return Case("", "", self.path, body, self.headers(user))

    def unreadable_fields(self, n: int) -> Case:
        user = self.chat_of("unreadable", n)
        post = self.post(n, f"UNREADABLE web {n}")
        field_, bad = self.rng.choice((("id", 5), ("id", "short"), ("id", "x" * 100), ("id", None),
                                       ("id", "a b c d e f"), ("text", 5), ("text", ["UNREADABLE"]), ("text", ""),
                                       ("text", None),
                                       ("text", "x" * 20_000), ("name", 5), ("name", ["x"]), ("name", {"n": 1})))
        post[field_] = bad
        return Case("", "", self.path, _json(post), self.headers(user))

    def unreadable_charset(self, n: int) -> Case:
        user = self.chat_of("unreadable", n)
        headers = self.headers(user)
        headers[0] = (b"Content-Type", self.rng.choice((b"application/json; charset=nosuch",
                                                        b"application/json; charset=\xff",
                                                        b"application/json; charset=utf-16")))
        return Case("", "", self.path, _json(self.post(n, f"UNREADABLE web {n}")), headers)
