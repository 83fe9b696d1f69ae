"""Who may join the model's queue: a model request is counted when it JOINS Gradio's queue, not when its
handler runs, so one address with many sessions cannot push everyone else back in the queue.

`Admission` keeps the model requests that joined and have not ended (waiting in Gradio's queue or running),
per session and per address; one over its session's share (one) or its address's depth is refused at join,
before it takes a place in the queue. `install` hooks it into one Gradio queue: the join route's `push`
(reserve a place, then bind it to the event id) and the queue's table of live events, which an event
leaves when it finishes, fails, is cancelled or loses its client: then its place is released, exactly once.
It knows nothing about the model or the widgets; `web.guard.FairTurns` decides who runs next among the joined.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections import Counter
from collections.abc import Callable

from web.guard import Client, Refused

SESSION_REFUSAL = "One request at a time per session: wait for your previous request to finish."
ADDRESS_REFUSAL = (
    "Your address already has {depth} requests queued or running; wait for your earlier requests to finish, then send again."
)


class Admission:
    """The joined model requests, `per_session` per session and `depth` per address at most."""

    def __init__(self, per_session: int = 1, depth: int = 4):
        if per_session < 1 or depth < 1:
            raise ValueError(f"per_session and depth must be at least 1, got {per_session} and {depth}")
        self.per_session, self.depth = per_session, depth
        self._lock = threading.Lock()
        self._live: dict[object, Client] = {}  # a reservation number, then the Gradio event id -> who
        self._sessions: Counter[str] = Counter()
        self._addresses: Counter[str] = Counter()
        self._tickets = itertools.count()

    def reserve(self, client: Client) -> int:
        """A place for one request of `client` (a number to `bind` or `release`); Refused when over its share."""
        with self._lock:
            if self._sessions[client.session] >= self.per_session:
                raise Refused(SESSION_REFUSAL)
            if self._addresses[client.address] >= self.depth:
                raise Refused(ADDRESS_REFUSAL.format(depth=self.depth))
            ticket = next(self._tickets)
            self._live[ticket] = client
            self._sessions[client.session] += 1
            self._addresses[client.address] += 1
            return ticket

    def bind(self, ticket: int, event_id: str) -> None:
        """The reserved place now belongs to the queued event `event_id` (released when that event ends)."""
        with self._lock:
            self._live[event_id] = self._live.pop(ticket)

    def release(self, key: object) -> None:
        """Free the place of a reservation or an event id; nothing when it was freed already."""
        with self._lock:
            client = self._live.pop(key, None)
            if client is None:
                return
            for counts, k in ((self._sessions, client.session), (self._addresses, client.address)):
                counts[k] -= 1
                if counts[k] <= 0:
                    del counts[k]

    def joined(self, address: str | None = None) -> int:
        """Requests joined and not ended: all of them, or those of one address."""
        with self._lock:
            return len(self._live) if address is None else self._addresses.get(address, 0)


class _Releasing(dict):
    """Gradio's table of live events (event id -> event): an id that leaves it frees its place."""

    def __init__(self, items: dict, release: Callable[[object], None]):
        super().__init__(items)
        self._release = release

    def pop(self, key, *default):
        try:
            return super().pop(key, *default)
        finally:
            self._release(key)

    def __delitem__(self, key):
        super().__delitem__(key)
        self._release(key)

    def popitem(self):
        key, value = super().popitem()
        self._release(key)
        return key, value

    def clear(self):
        for key in list(self):
            self.pop(key, None)


def refusal(message: str) -> list[dict]:
    """The join route's answer to a refused request: Gradio's validation shape (HTTP 422), whose message
    both gradio_client (`ValidationError`) and the page show."""
    return [{"__type__": "validate", "is_valid": False, "message": message, "parameter_name": "request"}]


def install(queue, admission: Admission, client_of: Callable[[object], Client], counted: Callable[[object], bool]) -> None:
    """Count `counted` functions' requests of `queue` (a Blocks' `_queue`, after `Blocks.queue()`) at join.

    `client_of` maps a Gradio request (address, headers, session hash) to its `Client`, as the handlers do."""
    import gradio as gr

    original = queue.push
    queue.event_ids_to_events = _Releasing(queue.event_ids_to_events, admission.release)

    async def push(body, request, username):
        fn = queue.blocks.fns.get(body.fn_index) if body.fn_index is not None else None
        if fn is None or not counted(fn):
            return await original(body=body, request=request, username=username)
        try:
            ticket = admission.reserve(client_of(gr.Request(request=request, session_hash=body.session_hash)))
        except Refused as exc:
            return False, refusal(str(exc)), "validator_error"
        try:
            ok, event_id, state = await original(body=body, request=request, username=username)
        except BaseException:
            admission.release(ticket)
            raise
        if not ok:
            admission.release(ticket)
            return ok, event_id, state
        admission.bind(ticket, event_id)
        if event_id not in queue.event_ids_to_events:  # it ended already (e.g. served from a cache)
            admission.release(event_id)
        return ok, event_id, state

    queue.push = push


TARPIT_S = 1.0  # how long a request over its address's rate waits for its 429 (the server's cost: an idle coroutine)
RATE_REFUSAL = "Too many requests from your address: at most {rate:g} a second. Wait {wait:.1f} s, then send again."
_LIMITED = (
    "/gradio_api/queue/join",
    "/gradio_api/call/",
    "/gradio_api/run/",
    "/gradio_api/api/",
    "/gradio_api/upload",  # uploads (web.uploads refuses anyone's but the admin's)
    "/gradio_api/component_server",
    "/gradio_api/process_recording",
    "/kvgraft/admin-session",  # token guesses
    "/v1/",  # the OpenAI-compatible API (serving.openai_api): completions, deposits
)
_NOT_LIMITED = ("/gradio_api/upload_progress",)  # an upload's progress stream (it writes nothing)


class JoinLimiter:
    """ASGI middleware, outermost: one address may start at most `rate` requests a second (a burst of `burst`)
    on the routes that queue or run work, upload, or open an upload session; past that it is answered 429 with Retry-After before anything reads
    its body. A refused request still costs the server its handling, and one address with many sessions can
    send hundreds a second: refusing them here costs a dictionary lookup, where a join refused by `Admission`
    costs a parsed body and Gradio's routing (measured: 24 refused sessions of one address took a chatting
    user's p95 from 0.38 to 6.5-7.5 s). Pages, assets and the event streams pass untouched. The address is the
    ASGI client, as uvicorn resolved it from the configured proxies. The 429 comes after `hold_s` (a tarpit):
    a client that retries as soon as it is refused, as the attack's clients do, retries at most once a second
    per connection instead of hundreds of times, and what it costs the server meanwhile is a sleeping coroutine."""

    def __init__(
        self,
        app,
        rate: float = 4.0,
        burst: float = 8.0,
        clock: Callable[[], float] | None = None,
        most: int = 65_536,
        hold_s: float = TARPIT_S,
        sleep: Callable[[float], object] | None = None,
    ):
        import asyncio
        import time

        if rate <= 0 or burst < 1:
            raise ValueError(f"rate must be positive and burst at least 1, got {rate} and {burst}")
        self.app, self.rate, self.burst, self.most, self.hold_s = app, rate, burst, most, hold_s
        self._clock = clock or time.monotonic
        self._sleep = sleep or asyncio.sleep
        self._buckets: dict[str, tuple[float, float]] = {}  # address -> (tokens, when)
        self.refused = 0

    def _take(self, address: str) -> float:
        """0 when `address` may start a request now (one token taken), else the seconds until it may."""
        now = self._clock()
        tokens, when = self._buckets.get(address, (self.burst, now))
        tokens = min(self.burst, tokens + (now - when) * self.rate)
        if tokens >= 1:
            self._buckets[address] = (tokens - 1, now)
            return 0.0
        self._buckets[address] = (tokens, now)
        return (1 - tokens) / self.rate

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if not any(p in path for p in _LIMITED) or any(p in path for p in _NOT_LIMITED):
            return await self.app(scope, receive, send)
        if len(self._buckets) > self.most:  # bounded memory: forget the addresses, never refuse for the size
            self._buckets.clear()
        address = (scope.get("client") or ("unknown", 0))[0]
        wait = self._take(address)
        if not wait:
            return await self.app(scope, receive, send)
        self.refused += 1
        await self._sleep(self.hold_s)  # held, not answered at once: a client that retries on a refusal slows down
        body = json.dumps({"detail": RATE_REFUSAL.format(rate=self.rate, wait=wait)}).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"retry-after", str(max(1, round(wait))).encode()),
        ]
        await send({"type": "http.response.start", "status": 429, "headers": headers})
        await send({"type": "http.response.body", "body": body})
