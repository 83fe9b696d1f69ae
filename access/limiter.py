"""The per-address rate of requests that start work: `JoinLimiter`, the outermost ASGI middleware of the one port
(the page's queue joins and uploads, the admin-session route, the OpenAI-compatible API), answering 429 with
Retry-After after a short hold. It knows nothing about what it lets through.
"""

from __future__ import annotations

import json
from collections.abc import Callable

TARPIT_S = 1.0  # how long a request over its address's rate waits for its 429 (the server's cost: an idle coroutine)
RATE_REFUSAL = "Too many requests from your address: at most {rate:g} a second. Wait {wait:.1f} s, then send again."
_LIMITED = (
    "/gradio_api/queue/join",
    "/gradio_api/call/",
    "/gradio_api/run/",
    "/gradio_api/api/",
    "/gradio_api/upload",  # uploads (access.uploads refuses anyone's but the admin's)
    "/gradio_api/component_server",
    "/gradio_api/process_recording",
    "/kvgraft/admin-session",  # token guesses
    "/v1/",  # the OpenAI-compatible API (serving.openai_api): completions, deposits
)
_NOT_LIMITED = ("/gradio_api/upload_progress",)
API_PREFIX = "/v1/"  # an upload's progress stream (it writes nothing)


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
        message = RATE_REFUSAL.format(rate=self.rate, wait=wait)
        if API_PREFIX in path:  # the OpenAI API's clients read OpenAI's error shape
            value = {"error": {"message": message, "type": "rate_limit_error", "param": None, "code": "rate_limit_exceeded"}}
        else:
            value = {"detail": message}
        body = json.dumps(value).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"retry-after", str(max(1, round(wait))).encode()),
        ]
        await send({"type": "http.response.start", "status": 429, "headers": headers})
        await send({"type": "http.response.body", "body": body})
