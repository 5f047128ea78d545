"""Who may see the dashboard: HTTP basic credentials or a bearer token.

The token may also be given once as ``?token=...`` in the address; the answer
then sets an HttpOnly cookie, so a browser can open the dashboard from a link.
Comparisons run in constant time.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from conveyor.errors import ConfigurationError

COOKIE = "conveyor_token"


@dataclass(frozen=True, slots=True)
class Credentials:
    """What a request must present: ``user:password`` (HTTP basic) and/or a token."""

    basic: tuple[str, str] | None = None
    token: str | None = None

    @classmethod
    def parse(cls, auth: str | None = None, token: str | None = None) -> Credentials | None:
        """From ``--auth user:password`` and ``--token``; ``None`` when neither is set."""
        basic = None
        if auth is not None:
            user, sep, password = auth.partition(":")
            if not sep or not user or not password:
                raise ConfigurationError(
                    "auth must be USER:PASSWORD with neither part empty, e.g. --auth admin:s3cret"
                )
            basic = (user, password)
        if token is not None and not token.strip():
            raise ConfigurationError("token must not be empty: pass --token SOME-LONG-SECRET")
        if basic is None and token is None:
            return None
        return cls(basic=basic, token=token)

    def accepts(self, header: str | None, cookie: str | None, query_token: str | None) -> bool:
        """Whether a request's Authorization header, cookie or ``token`` parameter match."""
        if self.token is not None:
            for offered in (cookie, query_token):
                if offered is not None and _same(offered, self.token):
                    return True
        if not header:
            return False
        scheme, _, value = header.partition(" ")
        scheme = scheme.lower()
        if scheme == "bearer" and self.token is not None:
            return _same(value.strip(), self.token)
        if scheme == "basic" and self.basic is not None:
            try:
                decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
            except (binascii.Error, UnicodeDecodeError):
                return False
            user, _, password = decoded.partition(":")
            # Both compared, always: no early exit that would time the user name.
            ok_user = _same(user, self.basic[0])
            ok_password = _same(password, self.basic[1])
            return ok_user and ok_password
        return False


def _same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


def is_loopback(host: str) -> bool:
    """True for addresses only this machine can reach (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class RequireCredentials:
    """ASGI middleware: answer 401 unless the request presents the credentials."""

    def __init__(self, app: ASGIApp, credentials: Credentials) -> None:
        self.app = app
        self.credentials = credentials

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        from starlette.requests import HTTPConnection
        from starlette.responses import PlainTextResponse

        conn = HTTPConnection(scope)
        query_token = conn.query_params.get("token")
        if self.credentials.accepts(
            conn.headers.get("authorization"), conn.cookies.get(COOKIE), query_token
        ):
            if query_token is not None and self.credentials.token is not None:
                await self.app(scope, receive, _set_cookie(send, self.credentials.token, scope))
            else:
                await self.app(scope, receive, send)
            return
        basic = 'Basic realm="conveyor", charset="UTF-8"'
        challenge = basic if self.credentials.basic else "Bearer"
        response = PlainTextResponse(
            "authentication required: give the dashboard's user and password, or its token "
            "(Authorization: Bearer TOKEN, or ?token=TOKEN once)",
            status_code=401,
            headers={"WWW-Authenticate": challenge},
        )
        await response(scope, receive, send)


def _set_cookie(send: Send, token: str, scope: Scope) -> Send:
    root = scope.get("root_path") or "/"

    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = list(message.get("headers", []))
            cookie = f"{COOKIE}={token}; Path={root}; HttpOnly; SameSite=Strict"
            headers.append((b"set-cookie", cookie.encode("latin-1")))
            message = {**message, "headers": headers}
        await send(message)

    return wrapped
