"""Who may do what on the web app, and how much of the model one client may hold.

`AdminToken` checks the admin token (constant-time) with a lockout, doubling, of the address that sends
a burst of wrong ones; `FairTurns` hands the model's slots out in turns (round robin over addresses, then
sessions): at most one request in flight per session, a few per address, and fewer model slots per address
than there are slots. It knows nothing about the store, the model or Gradio's widgets; app.py's handlers call
it before any work (`access.admission` counts the same requests earlier, when they join Gradio's queue).
"""

from __future__ import annotations

import hmac
import ipaddress
import itertools
import threading
import time
from collections import defaultdict, deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import settings
from errors import KvgraftError

ADMIN_HELP = (
    "Admin actions are disabled: no admin token is configured. Set the environment variable "
    "`KVGRAFT_ADMIN_TOKEN` to a secret and restart the app (`KVGRAFT_ADMIN_TOKEN=... python app.py`)."
)


class Refused(KvgraftError):
    """The caller may not do this now: no or a wrong admin token, too many failed tokens, or a busy slot."""


@dataclass(frozen=True)
class Client:
    """Who is asking: the Gradio session (one browser tab or one gradio_client.Client) and its address."""

    session: str
    address: str


def client_of(request) -> Client:
    """The client behind a Gradio request. The address is the request's client as the server resolved it:
    the socket's peer, or, where that peer is a proxy KVGRAFT_TRUST_PROXY names, the nearest address in its
    X-Forwarded-For that is not one of those proxies (uvicorn's forwarded_allow_ips, set by `web.app.serve`).
    The header itself is never read here: anyone can send it."""
    if request is None:  # a handler called directly, not through Gradio: one shared anonymous client
        return Client("direct", "direct")
    address = getattr(getattr(request, "client", None), "host", None) or "unknown"
    session = getattr(request, "session_hash", None) or f"address:{address}"
    return Client(session, address)


def lockout_key(address: str) -> str:
    """What one failed-token count is kept under: the address, or for IPv6 its /64 (one host's share)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    return str(ipaddress.ip_network(f"{ip}/64", strict=False)) if ip.version == 6 else str(ip)


@dataclass
class _Strikes:
    failures: deque  # moments of the failed tokens within the window
    until: float = 0.0  # locked until then
    strikes: int = 0  # lockouts so far (each doubles the next)


class AdminToken:
    """The admin token check. After `per_address` failed tokens from one address within `window_s`, every
    token from that address (right or wrong) is refused for `lockout_s`, doubled at each further lockout up
    to `max_lockout_s`; an address quiet for `max_lockout_s` after its lockout starts afresh. Nothing is
    counted across addresses: a flood of guesses from one place cannot lock the admin out of another (guessing
    from many places is what the token's length is for: see docs/SECURITY.md)."""

    MAX_TRACKED = 65_536  # addresses remembered at once; the quiet ones are forgotten first

    def __init__(
        self,
        token: str,
        per_address: int = 5,
        window_s: float = 300.0,
        lockout_s: float = 300.0,
        max_lockout_s: float = 3600.0,
        clock=time.monotonic,
    ):
        self.token = token or ""
        self.per_address, self.window_s, self._clock = per_address, window_s, clock
        self.lockout_s, self.max_lockout_s = lockout_s, max_lockout_s
        self._seen: dict[str, _Strikes] = {}
        self._lock = threading.Lock()

    @property
    def configured(self) -> bool:
        return bool(self.token)

    def _record(self, key: str, now: float) -> _Strikes:
        """Under the lock: `key`'s record, its old failures dropped and its strikes forgiven once quiet."""
        rec = self._seen.get(key)
        if rec is None:
            if len(self._seen) >= self.MAX_TRACKED:
                self._forget_quiet(now)
            rec = self._seen[key] = _Strikes(deque())
        while rec.failures and rec.failures[0] <= now - self.window_s:
            rec.failures.popleft()
        if rec.strikes and now >= rec.until + self.max_lockout_s:
            rec.strikes = 0
        return rec

    def _forget_quiet(self, now: float) -> None:
        quiet = [k for k, r in self._seen.items() if now >= r.until and (not r.failures or r.failures[-1] <= now - self.window_s)]
        for k in quiet or list(self._seen)[: len(self._seen) // 2]:
            del self._seen[k]

    def check(self, given: object, client: Client) -> None:
        """Returns when `given` is the admin token; Refused (with what to do) otherwise."""
        if not self.token:
            raise Refused(ADMIN_HELP)
        with self._lock:
            now = self._clock()
            rec = self._record(lockout_key(client.address), now)
            if now < rec.until:
                raise Refused(
                    f"Too many wrong admin tokens from your address; admin actions from it are locked for "
                    f"{rec.until - now:.0f} s. Try again later."
                )
            ok = isinstance(given, str) and hmac.compare_digest(given.encode("utf-8", "replace"), self.token.encode())
            if not ok:
                if given not in (None, ""):  # no token is not a guess
                    rec.failures.append(now)
                    if len(rec.failures) >= self.per_address:
                        rec.until = now + min(self.lockout_s * 2**rec.strikes, self.max_lockout_s)
                        rec.strikes += 1
                        rec.failures.clear()
                raise Refused("Admin token refused: give the value of KVGRAFT_ADMIN_TOKEN set on the server.")

    def is_admin(self, given: object, client: Client) -> bool:
        """False for no token (anonymous, counts nothing); True for the right one; Refused for a wrong one."""
        if given is None or given == "":
            return False
        self.check(given, client)
        return True


class Turn:
    """One client's claim on the model, from `FairTurns.turn`; `pause` lets any other waiting client go first."""

    def __init__(self, turns: FairTurns, client: Client, seq: int):
        self._turns, self.client, self.seq = turns, client, seq

    def pause(self) -> None:
        """Call between units of work (outside the model lock): hands the model to the next waiting client in
        the turn order (this one was just served, so any other address goes first), then waits for it back."""
        self._turns._pause(self)


class FairTurns:
    """The model, `slots` requests at a time (1 for an in-process model; more when the app fronts a
    deployment of several replicas), in turns.

    A client may have `per_session` requests in flight (waiting or running) per session and `depth` per
    address; more are refused at once, so one client cannot queue many. One address holds at most
    `per_address` slots at once, and never all of them when there are several (at most `slots - 1`): its
    other requests wait, so another address always finds a slot. Among the
    waiting, the address served least recently goes next, then (within an address) the session served
    least recently, then the oldest request: a round robin over addresses, so a client whose address is
    not the one just served gets the next turn, however many requests another host keeps waiting. A
    newcomer cannot bank credit and a long-served client is not held back for it (the order is by turns,
    not by model time: each anonymous turn is bounded to about one chat). A request that waits longer
    than `max_wait_s` is refused."""

    def __init__(
        self,
        per_session: int = 1,
        per_address: int = 1,
        max_wait_s: float = 600.0,
        clock=time.monotonic,
        slots: int = 1,
        depth: int = 4,
    ):
        if slots < 1 or per_address < 1 or depth < 1:
            raise ValueError(f"slots, per_address and depth must be at least 1, got {slots}, {per_address} and {depth}")
        self.per_session, self.max_wait_s, self._clock, self.depth = per_session, max_wait_s, clock, depth
        self.slots = slots
        self.per_address = max(1, min(per_address, slots - 1))  # never every slot to one address
        self._cond = threading.Condition()
        self._holders: dict[int, str] = {}  # seq -> its address
        self._held: dict[str, int] = defaultdict(int)  # address -> slots it holds
        self._waiting: dict[int, Client] = {}
        self._seq = itertools.count()
        self._grants = itertools.count()
        self._sessions: dict[str, int] = defaultdict(int)
        self._addresses: dict[str, int] = defaultdict(int)
        self._served: dict[str, int] = {}  # "a:"+address / "s:"+session -> number of its latest turn

    def _order(self, seq: int) -> tuple[int, int, int]:
        c = self._waiting[seq]
        return self._served.get("a:" + c.address, -1), self._served.get("s:" + c.session, -1), seq

    def _next(self) -> int | None:
        """Under the condition: the first waiting request in the turn order whose address may take one more slot."""
        ready = [s for s, c in self._waiting.items() if self._held.get(c.address, 0) < self.per_address]
        return min(ready, key=self._order) if ready else None

    def _grant(self, seq: int, client: Client) -> None:
        """Under the condition: `seq` holds a model slot now; its address and session were served last."""
        self._holders[seq] = client.address
        self._held[client.address] += 1
        n = next(self._grants)
        if len(self._served) > 10_000:  # forget the long gone (they count as never served again)
            keep = {k for c in (client, *self._waiting.values()) for k in ("a:" + c.address, "s:" + c.session)}
            self._served = {k: v for k, v in self._served.items() if k in keep}
        self._served["a:" + client.address] = self._served["s:" + client.session] = n

    def _wait_for_model(self, seq: int, client: Client) -> None:
        """Under the condition: queue `seq`, wait until it is first in the turn order and a model slot is free."""
        deadline = self._clock() + self.max_wait_s
        self._waiting[seq] = client
        try:
            while len(self._holders) >= self.slots or self._next() != seq:
                left = deadline - self._clock()
                if left <= 0:
                    raise Refused(f"The model is busy (waited {self.max_wait_s:.0f} s); try again in a minute.")
                self._cond.wait(min(left, 1.0))
        finally:
            del self._waiting[seq]
            self._cond.notify_all()
        self._grant(seq, client)

    def _release(self, seq: int) -> None:
        """Under the condition: free `seq`'s slot for the next in the turn order."""
        address = self._holders.pop(seq, None)
        if address is not None:
            self._held[address] -= 1
            if self._held[address] <= 0:
                del self._held[address]
        self._cond.notify_all()

    @contextmanager
    def turn(self, client: Client) -> Iterator[Turn]:
        """Hold the model for one request of `client` (Refused when it already has its share in flight)."""
        with self._cond:
            if self._sessions[client.session] >= self.per_session:
                raise Refused("One request at a time per session: wait for your previous request to finish.")
            if self._addresses[client.address] >= self.depth:
                raise Refused(f"Too many requests in flight from your address ({self.depth}); wait for one to finish.")
            self._sessions[client.session] += 1
            self._addresses[client.address] += 1
            seq = next(self._seq)
            t = Turn(self, client, seq)
            try:
                self._wait_for_model(seq, client)
            except BaseException:
                self._forget(client)
                raise
        try:
            yield t
        finally:
            with self._cond:
                if seq in self._holders:
                    self._release(seq)
                self._forget(client)

    def _forget(self, client: Client) -> None:
        for counts, key in ((self._sessions, client.session), (self._addresses, client.address)):
            counts[key] -= 1
            if counts[key] <= 0:
                del counts[key]

    def _pause(self, t: Turn) -> None:
        with self._cond:
            if t.seq not in self._holders or not self._waiting:
                return
            self._release(t.seq)
            self._wait_for_model(t.seq, t.client)

    def in_flight(self) -> int:
        """Requests waiting for or holding the model now."""
        with self._cond:
            return len(self._waiting) + len(self._holders)


def per_address() -> int:
    """KVGRAFT_PER_ADDRESS: model slots one address holds at once (default 1; at most the slots less one)."""
    return settings.get("KVGRAFT_PER_ADDRESS")


def address_depth() -> int:
    """KVGRAFT_ADDRESS_DEPTH: model requests one address may have queued or running (default 4); more are
    refused when they join Gradio's queue."""
    return settings.get("KVGRAFT_ADDRESS_DEPTH")


def backend_slots() -> int:
    """KVGRAFT_BACKEND_CONCURRENCY: requests the app, as a deployment's front end, sends at once (default 4,
    at most 16); the fair turn order decides who gets the next free one."""
    return settings.get("KVGRAFT_BACKEND_CONCURRENCY")


class Guard:
    """The admin-token check and the fair turns of one app, called by each handler with its Gradio request."""

    def __init__(self, token: str, tokens: AdminToken | None = None, turns: FairTurns | None = None):
        """The per-address bounds default to KVGRAFT_PER_ADDRESS and KVGRAFT_ADDRESS_DEPTH."""
        self.tokens = tokens or AdminToken(token)
        self.turns = turns or FairTurns(per_address=per_address(), depth=address_depth())

    def client(self, request) -> Client:
        return client_of(request)

    def admin(self, token: object, request) -> None:
        """Returns for the admin token; Refused otherwise (a wrong token counts as a failed guess)."""
        self.tokens.check(token, self.client(request))

    def is_admin(self, token: object, request) -> bool:
        """False without a token, True with the right one, Refused with a wrong one."""
        return self.tokens.is_admin(token, self.client(request))

    def turn(self, request):
        """The model for one request of this client (see `FairTurns.turn`)."""
        return self.turns.turn(self.client(request))
