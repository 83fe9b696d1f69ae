"""The upload door: who may write bytes into Gradio's temp folder, and how many. An upload (any request whose
body is multipart, on any route, or any request to an upload route) is accepted only from the admin, checked
before a byte of its body is read; everything else is refused at the edge with one message and nothing written.

`UploadGate` is the ASGI middleware in front of Gradio that decides it. The admin is recognised by the
`X-Kvgraft-Admin-Token` header (scripts, gradio_client) or by an upload session: the token, posted once to
`/kvgraft/admin-session` (the Library tab does it when the token box loses focus), becomes an HMAC-signed,
expiring, HttpOnly, SameSite=Strict cookie that the page's own uploads carry. Both go through the app's
`AdminToken` (a wrong token counts as a failed guess of that address). With no admin token configured every
upload is refused. An accepted upload is counted while it streams against `UploadBudget`: a per-caller and a
total budget of bytes held in the upload folder, and a floor of free disk below which nothing more is
written; past any of them the body is cut off, the partial file removed (Gradio's own parser cleanup,
triggered by the exception the body's stream raises) and the caller told which bound it reached.

It knows no widgets, no model and no store; `web.app.serve` installs it, `web.app.build_app` makes its door.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import os
import secrets
import shutil
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from starlette.formparsers import MultiPartException

import settings
from access.guard import AdminToken, Client, Refused, lockout_key

log = logging.getLogger("kvgraft.refused")

SESSION_PATH = "/kvgraft/admin-session"
COOKIE = "kvgraft_upload"
HEADER = b"x-kvgraft-admin-token"
SESSION_S = 8 * 3600  # an upload session lasts this long; the admin enters the token again after
UPLOAD_ROUTES = ("/gradio_api/upload", "/gradio_api/component_server", "/gradio_api/process_recording")
FLOOR_EVERY = 4 * 2**20  # while a body streams, the disk's free space is looked at again every this many bytes

ANONYMOUS = (
    "Uploads need the admin: enter the admin token (KVGRAFT_ADMIN_TOKEN) in the Library tab's token box first "
    "(it opens an upload session for this browser), or send it in the X-Kvgraft-Admin-Token header. "
    "Nothing was written."
)
NO_TOKEN = (
    "Uploads are off: no admin token is configured on the server (set KVGRAFT_ADMIN_TOKEN and restart). Nothing was written."
)
CALLER_BUDGET = (
    "Upload refused: your uploads would hold over {limit} in the server's upload folder (KVGRAFT_UPLOAD_BUDGET, "
    "per caller). Import or wait for the earlier ones to be removed, or import with `cli.py import` on the server. "
    "Nothing of this upload was kept."
)
TOTAL_BUDGET = (
    "Upload refused: the server's upload folder would hold over {limit} (KVGRAFT_UPLOAD_TOTAL). Try again once "
    "earlier uploads are imported or removed, or import with `cli.py import` on the server. "
    "Nothing of this upload was kept."
)
DISK_FLOOR = (
    "Upload refused: the server's disk would have less than {limit} free (KVGRAFT_UPLOAD_FREE_FLOOR keeps it for "
    "the store). Free some space or import with `cli.py import` from another disk. Nothing of this upload was kept."
)


def mb(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB" if n >= 2**20 else f"{n:,} bytes"


# ---- the upload session (a signed cookie) ---------------------------------------------------------------


class Sessions:
    """Upload sessions: `issue` makes a cookie value that `valid` accepts until it expires. The value is
    `v1.<expiry>.<nonce>.<HMAC-SHA256 of those>` under a key drawn from the admin token and a secret drawn
    anew by each process, so a restart or a new token ends every session, and no value says anything about
    the token. Without a token nothing is issued or accepted."""

    def __init__(self, token: str, ttl_s: float = SESSION_S, clock: Callable[[], float] = time.time):
        self.ttl_s, self._clock = ttl_s, clock
        salt = secrets.token_bytes(32)
        self._key = hmac.new(salt, (token or "").encode(), hashlib.sha256).digest() if token else None

    def _sign(self, body: str) -> str:
        mac = hmac.new(self._key, body.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(mac).decode().rstrip("=")

    def issue(self) -> tuple[str, int]:
        """A new session's cookie value and its expiry (Unix seconds)."""
        assert self._key is not None, "no upload session without an admin token"
        until = int(self._clock() + self.ttl_s)
        body = f"v1.{until}.{secrets.token_urlsafe(12)}"
        return f"{body}.{self._sign(body)}", until

    def valid(self, value: str | None) -> bool:
        """True for a value `issue` made that has not expired; False for anything else (forged, expired, odd)."""
        if self._key is None or not value or len(value) > 200:
            return False
        parts = value.split(".")
        if len(parts) != 4 or parts[0] != "v1" or not (parts[1].isascii() and parts[1].isdigit()):
            return False
        body = ".".join(parts[:3])
        if not hmac.compare_digest(parts[3].encode(), self._sign(body).encode()):
            return False
        now = self._clock()
        return now < int(parts[1]) <= now + self.ttl_s


# ---- the budget -----------------------------------------------------------------------------------------


def folder_bytes(folder: Path) -> int:
    """The bytes of every regular file under `folder` (0 when it does not exist); links are not followed."""
    total, stack = 0, [folder]
    while stack:
        try:
            with os.scandir(stack.pop()) as entries:
                for e in entries:
                    try:
                        if e.is_dir(follow_symlinks=False):
                            stack.append(Path(e.path))
                        elif e.is_file(follow_symlinks=False):
                            total += e.stat(follow_symlinks=False).st_size
                    except OSError:  # removed meanwhile
                        pass
        except OSError:
            pass
    return total


class OverBudget(MultiPartException):
    """An upload past a bound, raised from the body's stream: Gradio's multipart parser catches its own
    exception type and removes the partial files it made, so the cut-off leaves nothing behind."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.message, self.status = message, status


@dataclass
class Ticket:
    """One accepted upload while it streams: what it read so far."""

    caller: str
    declared: int
    streamed: int = 0
    next_floor_check: int = FLOOR_EVERY


class UploadBudget:
    """The bytes uploads may hold in `folder` (Gradio's upload folder): `per_caller` for one caller (the files
    its accepted uploads left that still exist, plus what it is streaming now), `total` for everyone (the
    folder as measured when the first of the uploads now streaming began, plus what they streamed since), and
    a `floor` of free disk under which nothing more is written. The event loop is its only caller (no lock)."""

    def __init__(self, folder: Path, per_caller: int, total: int, floor: int, disk_free: Callable[[Path], int] | None = None):
        self.folder, self.per_caller, self.total, self.floor = Path(folder), per_caller, total, floor
        self._disk_free = disk_free or (lambda p: shutil.disk_usage(p).free)
        self._kept: dict[str, set[str]] = defaultdict(set)  # caller -> files its uploads left
        self._kept_bytes: dict[str, int] = {}  # caller -> their bytes, as of its latest upload's start and end
        self._active: list[Ticket] = []
        self._measured = 0  # the folder's bytes when the first of the active uploads began
        self._since = 0  # bytes the active uploads streamed since

    @classmethod
    def from_settings(cls, folder: Path) -> UploadBudget:
        per_caller = settings.size_bytes(settings.get("KVGRAFT_UPLOAD_BUDGET"))
        total = settings.size_bytes(settings.get("KVGRAFT_UPLOAD_TOTAL"))
        return cls(folder, per_caller, total, settings.size_bytes(settings.get("KVGRAFT_UPLOAD_FREE_FLOOR")))

    def free(self) -> int:
        here = self.folder
        while not here.exists() and here != here.parent:
            here = here.parent
        return self._disk_free(here)

    def _streaming(self, caller: str) -> int:
        return sum(t.streamed for t in self._active if t.caller == caller)

    def held(self, caller: str) -> int:
        """Bytes `caller`'s uploads hold: the files its earlier ones left that still exist (an import or the
        cache sweep removes them), measured now, plus what its uploads now streaming read so far."""
        kept, size = self._kept.get(caller, set()), 0
        for p in list(kept):
            try:
                size += os.stat(p).st_size
            except OSError:
                kept.discard(p)
        if not kept:
            self._kept.pop(caller, None)
        self._kept_bytes[caller] = size
        return size + self._streaming(caller)

    def begin(self, caller: str, declared: int = 0) -> Ticket:
        """Admit one upload of `caller` whose request says its body holds `declared` bytes (0 when it does not
        say); OverBudget when that is already past a bound."""
        if not self._active:
            self._measured, self._since = folder_bytes(self.folder), 0
        self._check(self.held(caller) + declared, self._measured + self._since + declared, self.free() - declared)
        ticket = Ticket(caller, declared)
        self._active.append(ticket)
        return ticket

    def _check(self, caller_bytes: int, total_bytes: int, free_after: int | None) -> None:
        if caller_bytes > self.per_caller:
            raise OverBudget(CALLER_BUDGET.format(limit=mb(self.per_caller)), 413)
        if total_bytes > self.total:
            raise OverBudget(TOTAL_BUDGET.format(limit=mb(self.total)), 413)
        if free_after is not None and free_after < self.floor:
            raise OverBudget(DISK_FLOOR.format(limit=mb(self.floor)), 507)

    def add(self, ticket: Ticket, n: int) -> None:
        """`n` more bytes of `ticket`'s body arrived; OverBudget when they take it past a bound (the body is
        then read no further and its partial file is removed)."""
        ticket.streamed += n
        self._since += n
        free = None
        if ticket.streamed >= ticket.next_floor_check:  # the disk, every FLOOR_EVERY bytes (one statvfs)
            ticket.next_floor_check = ticket.streamed + FLOOR_EVERY
            free = self.free()
        caller_bytes = self._kept_bytes.get(ticket.caller, 0) + self._streaming(ticket.caller)
        self._check(caller_bytes, self._measured + self._since, free)

    def end(self, ticket: Ticket, kept: list[str] = ()) -> None:
        """`ticket`'s upload ended; `kept` are the files it left in the folder (Gradio's answer)."""
        if ticket in self._active:
            self._active.remove(ticket)
        folder = self.folder.resolve()
        for p in kept:
            path = Path(p).resolve()
            if path.is_relative_to(folder) and str(path) not in self._kept[ticket.caller]:
                self._kept[ticket.caller].add(str(path))
                try:
                    self._kept_bytes[ticket.caller] = self._kept_bytes.get(ticket.caller, 0) + path.stat().st_size
                except OSError:
                    pass


# ---- the middleware -------------------------------------------------------------------------------------


class UploadDoor:
    """What the gate needs from the app: the token check (with its lockout), the sessions and the budget
    (made on first use: Gradio's upload folder is known once its app exists)."""

    def __init__(self, tokens: AdminToken, budget: UploadBudget | None = None, folder: Path | None = None):
        self.tokens = tokens
        self.sessions = Sessions(tokens.token)
        self._budget, self._folder = budget, folder

    @property
    def budget(self) -> UploadBudget:
        if self._budget is None:
            from gradio.utils import get_upload_folder

            self._budget = UploadBudget.from_settings(self._folder or Path(get_upload_folder()))
        return self._budget


def _headers(scope) -> list[tuple[bytes, bytes]]:
    return list(scope.get("headers") or [])


def is_upload(scope) -> bool:
    """An upload: a multipart body (any Content-Type header saying so, on any route: Gradio's parsers write such
    bodies to disk) or a request to one of Gradio's upload routes, whatever it says it holds."""
    path = scope.get("path", "").rstrip("/")
    if any(path.endswith(r) for r in UPLOAD_ROUTES):
        return True
    return any(k == b"content-type" and b"multipart" in v.lower() for k, v in _headers(scope))


def _cookie(scope) -> str | None:
    for k, v in _headers(scope):
        if k == b"cookie":
            for part in v.decode("latin-1").split(";"):
                name, _, value = part.strip().partition("=")
                if name == COOKIE:
                    return value
    return None


def _declared(scope) -> int:
    for k, v in _headers(scope):
        if k == b"content-length" and v.isdigit():
            return int(v)
    return 0


async def _answer(send, status: int, detail: str, headers: list[tuple[bytes, bytes]] = ()) -> None:
    body = json.dumps({"detail": detail}).encode()
    head = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),  # the body it did not read is not read later either
        *headers,
    ]
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": body})


def _refused(message: str) -> None:
    log.info("refused: %s", message.splitlines()[0][:300])


class UploadGate:
    """ASGI middleware: the upload door. An upload from anyone but the admin is answered 403 (401 for a
    refused token, with the `AdminToken`'s message) before its body is read; the admin's is counted against
    the `UploadBudget` while it streams. `SESSION_PATH` opens (POST {"token": ...}) or ends (an empty token)
    an upload session. Every other request passes untouched."""

    def __init__(self, app, door: UploadDoor | None = None, secure: bool = False, clock: Callable[[], float] = time.time):
        self.app, self.secure, self._clock = app, secure, clock
        self.door = door or UploadDoor(AdminToken(""))

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if scope.get("path", "").rstrip("/").endswith(SESSION_PATH):
            return await self._session(scope, receive, send)
        if not is_upload(scope):
            return await self.app(scope, receive, send)
        address = (scope.get("client") or ("unknown", 0))[0]
        refusal = self._authority(scope, Client(f"address:{address}", address))
        if refusal:
            _refused(refusal[1])
            return await _answer(send, *refusal)
        return await self._counted(scope, receive, send, lockout_key(address))

    def _authority(self, scope, client: Client) -> tuple[int, str] | None:
        """None for the admin; else (status, message)."""
        tokens = self.door.tokens
        if not tokens.configured:
            return 403, NO_TOKEN
        given = next((v for k, v in _headers(scope) if k == HEADER), None)
        if given is not None:
            try:
                tokens.check(given.decode("utf-8", "replace"), client)
                return None
            except Refused as exc:
                return 401, f"{exc} Nothing was written."
        if self.door.sessions.valid(_cookie(scope)):
            return None
        return 403, ANONYMOUS

    async def _counted(self, scope, receive, send, caller: str):
        budget = self.door.budget
        try:
            ticket = budget.begin(caller, _declared(scope))
        except OverBudget as exc:
            _refused(str(exc.message))
            return await _answer(send, exc.status, exc.message)
        cut: list[OverBudget] = []
        started, finished, answer = False, False, []

        async def counted_receive():
            nonlocal finished
            message = await receive()
            if finished:
                return message
            if message["type"] == "http.request":
                finished = not message.get("more_body", False)
                try:
                    budget.add(ticket, len(message.get("body", b"")))
                except OverBudget as exc:
                    cut.append(exc)
                    raise
            elif message["type"] == "http.disconnect":  # the client went away mid-body: Gradio removes the partial file
                cut.append(OverBudget("The upload was interrupted: nothing of it was kept.", 400))
                raise cut[-1]
            return message

        async def watched_send(message):
            nonlocal started
            if cut:  # our answer replaces Gradio's
                return
            if message["type"] == "http.response.start":
                started = message.get("status", 0)
            if message["type"] == "http.response.body":
                answer.append(message.get("body", b""))
                if not message.get("more_body", False):  # counted before the caller hears of it
                    budget.end(ticket, _paths(b"".join(answer)) if started == 200 else [])
            await send(message)

        try:
            await self.app(scope, counted_receive, watched_send)
        except OverBudget:  # a route that does not catch it (not one of Gradio's multipart parsers)
            if not cut:
                raise
        finally:
            budget.end(ticket)  # nothing more when the answer ended it already
        if cut:
            _refused(cut[0].message)
            if not started:
                await _answer(send, cut[0].status, cut[0].message)

    async def _session(self, scope, receive, send):
        if scope["method"] != "POST":
            return await _answer(send, 405, 'POST {"token": ...} to open an upload session (an empty token ends it).')
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
            if size > 4096:
                return await _answer(send, 413, "An upload session request holds only the token.")
        try:
            token = json.loads(b"".join(chunks) or b"{}").get("token", "")
        except (ValueError, AttributeError):
            token = None
        if not isinstance(token, str):
            return await _answer(send, 400, 'Send JSON like {"token": "..."}.')
        secure = "; Secure" if self.secure or scope.get("scheme") == "https" else ""
        if not token.strip():
            ended = f"{COOKIE}=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict{secure}".encode()
            return await _answer(send, 200, "Upload session ended for this browser.", [(b"set-cookie", ended)])
        address = (scope.get("client") or ("unknown", 0))[0]
        tokens = self.door.tokens
        try:
            tokens.check(token.strip(), Client(f"address:{address}", address))
        except Refused as exc:
            _refused(str(exc))
            return await _answer(send, 401 if tokens.configured else 403, str(exc))
        value, until = self.door.sessions.issue()
        ttl = max(0, until - int(self._clock()))
        cookie = f"{COOKIE}={value}; Path=/; Max-Age={ttl}; HttpOnly; SameSite=Strict{secure}".encode()
        when = time.strftime("%H:%M UTC", time.gmtime(until))
        return await _answer(send, 200, f"Uploads allowed from this browser until {when}.", [(b"set-cookie", cookie)])


def _paths(body: bytes) -> list[str]:
    """The files Gradio's upload route says it kept (its JSON answer: a list of paths); [] for anything else."""
    try:
        value = json.loads(body) if body else []
    except ValueError:
        return []
    return [p for p in value if isinstance(p, str)] if isinstance(value, list) else []
