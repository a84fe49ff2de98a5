"""Admin login, session cookie and CSRF tokens.

- Login: the password held by the environment variable ``web.admin_password_env`` (compared in
  constant time). No password configured: the admin pages are off.
- Session: a random session id (a row of ``admin_sessions``, ``gateway.admin.sessions``) in a
  signed, timestamped cookie (``itsdangerous``), HttpOnly, SameSite=Strict, valid for
  ``web.admin_session_hours``. The signing key is HMAC-SHA256(web secret, password): changing the
  password ends every session, and the cookie holds nothing derived from the password alone.
  Logout revokes the row (every instance sees it).
- CSRF: every browser gets a random nonce cookie (HttpOnly, SameSite=Strict), replaced at login;
  each form carries an HMAC of that nonce under the web secret, and every POST is refused (403)
  without the matching token (the synchronizer-token pattern, OWASP CSRF Prevention Cheat Sheet).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from aiohttp import web
from itsdangerous import BadSignature, SignatureExpired, TimestampSigner

SESSION_COOKIE = "gw_admin"
NONCE_COOKIE = "gw_admin_nonce"
CSRF_FIELD = "csrf"


def cookie(request: web.Request, name: str) -> str | None:
    """The value of the request's cookie ``name``, or ``None`` when it is missing or not ASCII.
    Every admin cookie is ASCII (signed, random URL-safe, or percent-quoted); aiohttp hands bytes
    that are not UTF-8 over as lone surrogates, which cannot be encoded: such a cookie (sent by
    anyone, or planted from a sibling subdomain) counts as absent instead of failing the page."""
    value = request.cookies.get(name)
    return value if value is not None and value.isascii() else None


class AdminAuth:
    """Checks logins, sessions and CSRF tokens.

    Args:
        password: the admin password, or ``None`` (admin off).
        secret: key that signs the session cookie and derives CSRF tokens.
        session_s: how long a login lasts (seconds).
        secure: mark cookies ``Secure`` (HTTPS).
    """

    def __init__(self, password: str | None, secret: str, session_s: float, secure: bool = False) -> None:
        self.password = password
        self._secret = secret.encode()
        session_key = hmac.new(self._secret, b"gateway-admin-session:" + (password or "").encode(),
                               hashlib.sha256).hexdigest()
        self._signer = TimestampSigner(session_key, salt="gateway-admin-session")
        self.session_s = session_s
        self.secure = secure

    @property
    def enabled(self) -> bool:
        return bool(self.password)

    def password_ok(self, given: str) -> bool:
        """Whether ``given`` is the admin password (constant time)."""
        if not self.password:
            return False
        return hmac.compare_digest(hashlib.sha256(given.encode()).digest(),
                                   hashlib.sha256(self.password.encode()).digest())

    def session_id(self, request: web.Request) -> str | None:
        """The session id of the request's cookie when its signature (under the current password)
        holds and it is younger than the session lifetime; else ``None``. The caller still checks
        that the session was not revoked (``AdminSessions.active``)."""
        value = cookie(request, SESSION_COOKIE)
        if not value or not self.enabled:
            return None
        try:
            return self._signer.unsign(value, max_age=self.session_s).decode()  # type: ignore[call-overload]
        except (BadSignature, SignatureExpired):
            return None

    def start_session(self, response: web.StreamResponse, session_id: str) -> None:
        """Sets the session cookie for ``session_id`` on ``response`` (after a correct password) and
        a fresh CSRF nonce (a nonce planted before login is not carried into the session)."""
        response.set_cookie(SESSION_COOKIE, self._signer.sign(session_id).decode(), max_age=int(self.session_s),
                            httponly=True, samesite="Strict", secure=self.secure, path="/admin")
        response.set_cookie(NONCE_COOKIE, secrets.token_urlsafe(24), httponly=True, samesite="Strict",
                            secure=self.secure, path="/admin")

    def end_session(self, response: web.StreamResponse) -> None:
        """Deletes the session cookie (the caller revokes the session row)."""
        response.del_cookie(SESSION_COOKIE, path="/admin")

    def nonce(self, request: web.Request, response: web.StreamResponse | None = None) -> str:
        """The browser's CSRF nonce; a new one is set on ``response`` when it has none."""
        value = cookie(request, NONCE_COOKIE)
        if value and len(value) >= 16:
            return value
        value = secrets.token_urlsafe(24)
        if response is not None:
            response.set_cookie(NONCE_COOKIE, value, httponly=True, samesite="Strict", secure=self.secure,
                                path="/admin")
        return value

    def csrf_token(self, nonce: str, session: str = "") -> str:
        """The token forms carry for ``nonce`` and the browser's session cookie ``session`` (its
        raw value; ``""`` before login): a nonce planted in a browser (from a sibling subdomain, or
        over plain HTTP) is worth nothing without that browser's session."""
        return hmac.new(self._secret, b"csrf:" + nonce.encode() + b"\0" + session.encode(), hashlib.sha256).hexdigest()

    def csrf_for(self, request: web.Request, nonce: str) -> str:
        """``csrf_token`` for a page rendered for ``request``."""
        return self.csrf_token(nonce, cookie(request, SESSION_COOKIE) or "")

    def csrf_ok(self, request: web.Request, token: object) -> bool:
        """Whether a POST's ``token`` matches the browser's nonce and session cookies."""
        nonce = cookie(request, NONCE_COOKIE)
        if not nonce or not isinstance(token, str) or not token:
            return False
        return hmac.compare_digest(token.encode("utf-8", "surrogatepass"), self.csrf_for(request, nonce).encode())
