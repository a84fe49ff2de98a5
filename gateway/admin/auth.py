"""Admin login, session cookie and CSRF tokens.

- Login: the password held by the environment variable ``web.admin_password_env`` (compared in
  constant time). No password configured: the admin pages are off.
- Session: a signed, timestamped cookie (``itsdangerous``), HttpOnly, SameSite=Strict, valid for
  ``web.admin_session_hours``; it names a digest of the password, so changing the password ends
  every session.
- CSRF: every browser gets a random nonce cookie (HttpOnly, SameSite=Strict); each form carries
  an HMAC of that nonce under the signing key, and every POST is refused (403) without the
  matching token (the synchronizer-token pattern, OWASP CSRF Prevention Cheat Sheet).
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
        self._signer = TimestampSigner(secret, salt="gateway-admin-session")
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

    def _subject(self) -> str:
        assert self.password
        return "admin:" + hashlib.sha256(b"gateway-admin:" + self.password.encode()).hexdigest()[:16]

    def logged_in(self, request: web.Request) -> bool:
        """Whether the request carries a valid, unexpired session cookie."""
        value = request.cookies.get(SESSION_COOKIE)
        if not value or not self.enabled:
            return False
        try:
            subject = self._signer.unsign(value, max_age=self.session_s).decode()
        except (BadSignature, SignatureExpired):
            return False
        return hmac.compare_digest(subject, self._subject())

    def start_session(self, response: web.StreamResponse) -> None:
        """Sets the session cookie on ``response`` (after a correct password)."""
        response.set_cookie(SESSION_COOKIE, self._signer.sign(self._subject()).decode(), max_age=int(self.session_s),
                            httponly=True, samesite="Strict", secure=self.secure, path="/admin")

    def end_session(self, response: web.StreamResponse) -> None:
        response.del_cookie(SESSION_COOKIE, path="/admin")

    def nonce(self, request: web.Request, response: web.StreamResponse | None = None) -> str:
        """The browser's CSRF nonce; a new one is set on ``response`` when it has none."""
        value = request.cookies.get(NONCE_COOKIE)
        if value and len(value) >= 16:
            return value
        value = secrets.token_urlsafe(24)
        if response is not None:
            response.set_cookie(NONCE_COOKIE, value, httponly=True, samesite="Strict", secure=self.secure,
                                path="/admin")
        return value

    def csrf_token(self, nonce: str) -> str:
        """The token forms carry for ``nonce``."""
        return hmac.new(self._secret, b"csrf:" + nonce.encode(), hashlib.sha256).hexdigest()

    def csrf_ok(self, request: web.Request, token: object) -> bool:
        """Whether a POST's ``token`` matches the browser's nonce cookie."""
        nonce = request.cookies.get(NONCE_COOKIE)
        if not nonce or not isinstance(token, str) or not token:
            return False
        return hmac.compare_digest(token, self.csrf_token(nonce))
