"""Slow and broken senders: `BodyDeadline`, the ASGI middleware that bounds how long a request's body may take to
arrive and how many requests of one address may be arriving at once, so a client that sends less than its
Content-Length (or dribbles it) holds neither a worker nor a connection for long, and many of them from one address
are refused outright. A client that goes away before its body is whole is one log line, never a traceback.

It knows no route: it sits on the one port in front of the page and the API (`web.app.serve`), after the
per-address rate. Uploads pass (the upload gate admits only the admin's and bounds them while they stream).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from collections.abc import Callable

from .uploads import is_upload

log = logging.getLogger("kvgraft.refused")

BODY_READ_S = 30.0  # a request's whole body must have arrived this long after the request began
ARRIVING_PER_ADDRESS = 8  # requests of one address whose body is still arriving, at most

SLOW = "The request's body did not arrive within {s:.0f} s of its start: send it whole and at once."
MANY = (
    "Your address already has {n} requests whose bodies are still arriving: finish sending those (or close them), "
    "then send again."
)


def _has_body(scope) -> bool:
    for k, v in scope.get("headers") or []:
        if k == b"content-length":
            return v.strip() not in (b"", b"0")
        if k == b"transfer-encoding":
            return True
    return False


def _address(scope) -> str:
    return (scope.get("client") or ("unknown", 0))[0]


async def _answer(send, status: int, detail: str, api: bool) -> None:
    kind = {408: "timeout_error", 429: "rate_limit_error"}.get(status, "invalid_request_error")
    value = {"error": {"message": detail, "type": kind, "param": None, "code": None}} if api else {"detail": detail}
    body = json.dumps(value).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),  # what was not read of the body is not read later either
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class BodyDeadline:
    """ASGI middleware: a body must arrive within `read_s` seconds of its request's start (else 408, the connection
    closed), and an address may have `per_address` requests arriving at once (the next is answered 429 at once).
    Refusals on the OpenAI API's paths (`api_prefix`) are in OpenAI's error shape. A client that leaves mid-body is
    logged in one line; whatever the app raises because of it (Starlette's ClientDisconnect) ends there. To the app a
    body past its time is a client that left (it hears `http.disconnect`), and what it answers is dropped."""

    def __init__(
        self,
        app,
        read_s: float = BODY_READ_S,
        per_address: int = ARRIVING_PER_ADDRESS,
        api_prefix: str = "/v1/",
        clock: Callable[[], float] | None = None,
    ):
        if read_s <= 0 or per_address < 1:
            raise ValueError(f"read_s must be positive and per_address at least 1, got {read_s} and {per_address}")
        self.app, self.read_s, self.per_address, self.api_prefix = app, read_s, per_address, api_prefix
        self._clock = clock
        self.arriving: Counter[str] = Counter()
        self.cut = 0  # bodies that did not arrive in time
        self.left = 0  # clients gone before their body was whole

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not _has_body(scope) or is_upload(scope):
            return await self.app(scope, receive, send)
        address, api = _address(scope), scope.get("path", "").startswith(self.api_prefix)
        if self.arriving[address] >= self.per_address:
            log.info("refused: %s has %d request bodies arriving", address, self.arriving[address])
            return await _answer(send, 429, MANY.format(n=self.arriving[address]), api)
        loop = asyncio.get_running_loop()
        clock = self._clock or loop.time
        deadline = clock() + self.read_s
        self.arriving[address] += 1
        state = {"arriving": True, "why": "", "started": False}

        def whole() -> None:
            if state["arriving"]:
                state["arriving"] = False
                self.arriving[address] -= 1
                if self.arriving[address] <= 0:
                    del self.arriving[address]

        async def timed():
            if not state["arriving"]:
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), timeout=max(deadline - clock(), 0.0))
            except TimeoutError:  # to the app, the client is gone; the caller hears the 408 from here
                whole()
                state["why"] = "slow"
                return {"type": "http.disconnect"}
            if message["type"] == "http.disconnect":
                whole()
                state["why"] = "left"
            elif message["type"] == "http.request" and not message.get("more_body", False):
                whole()
            return message

        async def watched(message):
            if state["why"]:  # the body never came whole: what the app answers to that reaches no one
                return
            if message["type"] == "http.response.start":
                state["started"] = True
            await send(message)

        try:
            await self.app(scope, timed, watched)
        except Exception:  # an app that raises on the disconnect it was handed (Starlette's ClientDisconnect)
            if not state["why"]:
                raise
        finally:
            whole()
        if state["why"] == "slow":
            self.cut += 1
            log.info("refused: a request body from %s did not arrive within %.0f s", address, self.read_s)
            if not state["started"]:
                await _answer(send, 408, SLOW.format(s=self.read_s), api)
        elif state["why"] == "left":
            self.left += 1
            log.info(
                "a client at %s left before its request body arrived (%s %s)", address, scope.get("method"), scope.get("path")
            )
