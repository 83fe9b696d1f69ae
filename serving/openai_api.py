"""The OpenAI-compatible API over one library: `/v1/models`, `/v1/completions`, `/v1/chat/completions`
(whole or streamed as server-sent events ending `data: [DONE]`), `/v1/kvgraft/deposits` (the admin's) and
`/metrics` (Prometheus). The web app serves it on the page's own port (`server.serve` mounts it beside the page), a Ray replica on its
routes (`serving.replica`); both hand it their library, guard and admission, so an API request is admitted,
bounded and turned exactly as a chat is (`access.admission.Admission` at arrival, `access.bounds.answer_options`,
`access.guard.FairTurns`). It admits, runs and streams; what requests and responses look like is
`serving.openai_shapes`'s, the answer and its proof `LibraryDoor.answer`'s.

Who asks: the address (as the server resolved it) is the caller; each request is its own session, so one
address holds at most KVGRAFT_ADDRESS_DEPTH requests queued or running. The API key is the admin token
(`Authorization: Bearer ...`); no key, or one of `openai_shapes.ANONYMOUS_KEYS`, is anonymous; any other key is a guess at
the admin token, counted by `AdminToken`'s lockout and refused with 401.

No `from __future__ import annotations`: FastAPI (the replica's ingress) reads signatures at runtime.
"""

import asyncio
import contextlib
import dataclasses
import json
import logging
import secrets
import threading
import time
import uuid
from collections.abc import Callable
from types import SimpleNamespace

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from access.bodies import BodyRefused, read_json
from access.bounds import answer_options
from access.guard import Client, Refused
from errors import KvgraftError, VerificationFailed
from graft_core import templates  # torch-free: text rules only

from . import openai_shapes as shapes
from .metrics import Metrics

log = logging.getLogger("kvgraft.openai")


class OpenAIServer:
    """The API over `library` (a LibraryDoor), with `guard` (admin token, fair turns) and `admission` (requests
    counted at arrival) shared with the front end that serves it; `metrics` defaults to a registry of its own."""

    def __init__(self, library, guard, admission, metrics: Metrics | None = None, clock: Callable[[], float] = time.time):
        self.library, self.guard, self.admission = library, guard, admission
        self.metrics = metrics or Metrics(queue_depth=admission.joined)
        self._clock = clock

    # ---- who asks ----------------------------------------------------------------------------------

    def _caller(self, request: Request) -> SimpleNamespace:
        """What `access.guard` reads of a request: the address the server resolved, and a session of its own."""
        host = request.client.host if request.client else "unknown"
        return SimpleNamespace(client=SimpleNamespace(host=host), session_hash=f"api-{uuid.uuid4().hex}")

    @staticmethod
    def _key(request: Request) -> str:
        auth = request.headers.get("authorization", "")
        scheme, _, key = auth.partition(" ")
        if auth and scheme.lower() != "bearer":
            raise shapes.ApiError(401, "send the admin token as `Authorization: Bearer <token>`", "authentication_error")
        key = key.strip()
        return "" if key in shapes.ANONYMOUS_KEYS else key

    async def _body(self, request: Request, limit: int) -> dict:
        """The JSON object of the request, read up to `limit` bytes (refused past it before it is parsed)."""
        declared = request.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            raise shapes.ApiError(413, f"the request body is larger than {limit:,} bytes", code="body_too_large")
        data = bytearray()
        try:
            async for chunk in request.stream():
                data += chunk
                if len(data) > limit:
                    raise shapes.ApiError(413, f"the request body is larger than {limit:,} bytes", code="body_too_large")
        except ClientDisconnect:  # gone before its body was whole (access.arrivals logs it): nothing to answer
            raise shapes.ApiError(400, "the client went away before its request body arrived", code="client_gone") from None
        try:  # nesting bounded, every string valid Unicode: refused here, naming the field, before any use
            body = read_json(bytes(data))
        except BodyRefused as exc:
            raise shapes.ApiError(400, str(exc), param=exc.field) from None
        if not isinstance(body, dict):
            raise shapes.ApiError(400, "the request body must be a JSON object")
        return body

    # ---- routes ------------------------------------------------------------------------------------

    def _model(self) -> dict:
        return {"id": shapes.model_id(self.library), "object": "model", "created": 0, "owned_by": "kvgraft"}

    async def models(self, request: Request) -> Response:
        with self.metrics.request("/v1/models") as outcome:
            outcome("ok")
            return JSONResponse({"object": "list", "data": [self._model()]})

    async def model(self, request: Request) -> Response:
        """GET /v1/models/{id}: the one model (under its id or "kvgraft"), else a 404 in OpenAI's shape."""
        with self.metrics.request("/v1/models/{id}") as outcome:
            asked, model = request.path_params["model_id"], self._model()
            if asked not in (model["id"], "kvgraft"):
                outcome("error_404")
                return shapes.ApiError(
                    404,
                    f"The model `{asked[:80]}` does not exist: this server serves `{model['id']}`",
                    param="model",
                    code="model_not_found",
                ).response()
            outcome("ok")
            return JSONResponse(model)

    async def completions(self, request: Request) -> Response:
        return await self._complete(request, chat=False)

    async def chat_completions(self, request: Request) -> Response:
        return await self._complete(request, chat=True)

    async def metrics_text(self, request: Request) -> Response:
        data, content_type = self.metrics.render()
        return Response(data, media_type=content_type)

    async def deposits(self, request: Request) -> Response:
        route = "/v1/kvgraft/deposits"
        with self.metrics.request(route) as outcome:
            try:
                caller = self._caller(request)
                key = self._key(request)
                if not key:
                    raise shapes.ApiError(
                        401,
                        "deposits need the admin token: send `Authorization: Bearer <KVGRAFT_ADMIN_TOKEN>`",
                        "authentication_error",
                    )
                self.guard.admin(key, caller)  # before the body is read: an anonymous deposit costs nothing
                body = await self._body(request, shapes.MAX_DEPOSIT_BODY)
                d = await self._admitted(caller, lambda: self._deposit(body))
            except VerificationFailed as exc:
                self.metrics.gate_verdict("refused")
                outcome("refused")
                err = shapes.api_error(exc).body() | {"kvgraft": {"verdict": "refused", "reason": str(exc)}}
                return JSONResponse(err, status_code=422)
            except (shapes.ApiError, KvgraftError) as exc:
                err = exc if isinstance(exc, shapes.ApiError) else shapes.api_error(exc)
                outcome(f"error_{err.status}")
                return err.response()
            if d.verified:
                self.metrics.gate_verdict("accepted")
            verdict = "accepted" if d.verified else d.provenance
            outcome("ok")
            return JSONResponse(
                {"object": "kvgraft.deposit", "id": d.id, "verdict": verdict, "created": d.created, "deposit": d.to_json()}
            )

    def _deposit(self, body: dict):
        fields = {"question", "solution", "answer", "verifier", "reference", "text", "title", "attested_by", "parent"}
        unknown = set(body) - fields
        if unknown:
            raise shapes.ApiError(400, f"unknown deposit field(s) {', '.join(sorted(unknown))}: use {', '.join(sorted(fields))}")
        for k, v in body.items():
            if v is not None and not isinstance(v, str):
                raise shapes.ApiError(400, f"{k} must be a string", param=k)
        title, parent = body.get("title") or "", body.get("parent")
        if body.get("question"):
            return self.library.deposit_item(
                body["question"],
                body.get("solution") or "",
                body.get("answer"),
                body.get("verifier") or "exact",
                body.get("reference") or "",
                parent=parent,
                title=title,
                admin=True,
            )
        if not body.get("text"):
            raise shapes.ApiError(400, "nothing to deposit: give question, solution, verifier and reference, or text")
        return self.library.deposit_text(
            body["text"], parent=parent, title=title, attested_by=body.get("attested_by"), admin=True
        )

    # ---- the work ----------------------------------------------------------------------------------

    async def _admitted(self, caller, work: Callable):
        """Run `work()` in a worker thread as one model request of `caller`: admitted (refused at once when
        its address is over its depth), then in its fair turn."""
        client = self.guard.client(caller)
        ticket = self._reserve(client)

        def run():
            try:
                with self.guard.turn(caller):
                    return work()
            finally:
                self.admission.release(ticket)

        return await asyncio.to_thread(run)

    def _reserve(self, client: Client) -> int:
        try:
            return self.admission.reserve(client)
        except Refused as exc:
            raise shapes.ApiError(429, str(exc), "rate_limit_error", code="rate_limit_exceeded") from None

    def _options(self, body: dict, caller, key: str, question_chat: bool, ask: shapes.LogprobAsk = shapes.LogprobAsk()):
        unknown = set(body) - shapes.ACCEPTED - set(shapes.UNSUPPORTED)
        if unknown:
            raise shapes.ApiError(400, f"unsupported parameter(s): {', '.join(sorted(unknown))}", param=sorted(unknown)[0])
        for name, refused in shapes.UNSUPPORTED.items():
            if name in body and refused(body[name]):
                raise shapes.ApiError(
                    400, f"{name} is not supported by kvgraft's server (one greedy or seeded-sampled answer)", param=name
                )
        mid = shapes.model_id(self.library)
        if body.get("model") not in (mid, "kvgraft"):
            raise shapes.ApiError(
                404,
                f"The model `{str(body.get('model'))[:80]}` does not exist: this server serves `{mid}` (GET /v1/models)",
                param="model",
                code="model_not_found",
            )
        ext = body.get("kvgraft") or {}
        if not isinstance(ext, dict) or set(ext) - shapes.EXTENSION_FIELDS:
            raise shapes.ApiError(
                400, f"kvgraft must be an object of {', '.join(sorted(shapes.EXTENSION_FIELDS))}", param="kvgraft"
            )
        for flag in ("graft", "check"):
            if flag in ext and not isinstance(ext[flag], bool):
                raise shapes.ApiError(400, f"kvgraft.{flag} must be true or false", param=f"kvgraft.{flag}")
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        max_tokens = shapes.DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens
        least = 0 if ask.echo else 1  # an echo with max_tokens 0 asks only for the prompt's log-probabilities
        base = answer_options(
            self.guard, caller, ext.get("k", 3), ext.get("graft", True), max_tokens, ext.get("check", False), False, key, least
        )
        seed = body.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise shapes.ApiError(400, "seed must be an integer", param="seed")
        return dataclasses.replace(
            base,
            artifact=self._artifact(ext.get("artifacts")),
            raw=not question_chat,
            temperature=shapes.number(body, "temperature", 0.0, 0, 2),
            top_p=shapes.number(body, "top_p", 1.0, 0, 1, low_open=True),
            seed=seed,
            stop=shapes.stops(body),
            logprobs=ask.top,
            echo=ask.echo,
        )

    def _artifact(self, artifacts) -> str | None:
        """kvgraft.artifacts: one artifact id (its chain is grafted), or its whole chain root first."""
        if artifacts is None:
            return None
        if isinstance(artifacts, str):
            artifacts = [artifacts]
        if not isinstance(artifacts, list) or not artifacts or not all(isinstance(a, str) and a for a in artifacts):
            raise shapes.ApiError(400, "kvgraft.artifacts must be a list of artifact ids", param="kvgraft.artifacts")
        if len(artifacts) > 64:
            raise shapes.ApiError(400, "kvgraft.artifacts names at most 64 ids", param="kvgraft.artifacts")
        chain = list(self.library.show(artifacts[-1]).chain)
        if (
            len(artifacts) > 1
            and [c[: len(a)] for c, a in zip(chain, artifacts, strict=False)] != artifacts
            or len(artifacts) not in (1, len(chain))
        ):
            raise shapes.ApiError(
                400,
                "kvgraft.artifacts must name one artifact (its chain is grafted) or that chain root first: "
                f"{artifacts[-1][:16]}'s chain is {', '.join(c[:16] for c in chain)}",
                param="kvgraft.artifacts",
            )
        return chain[-1]

    async def _complete(self, request: Request, chat: bool) -> Response:
        route = "/v1/chat/completions" if chat else "/v1/completions"
        t0 = time.perf_counter()
        ctx = self.metrics.request(route)
        outcome = ctx.__enter__()
        try:
            caller = self._caller(request)
            key = self._key(request)
            body = await self._body(request, shapes.MAX_BODY)
            ask = shapes.logprob_ask(body, chat)
            asked = [shapes.Prompt(shapes.chat_question(body))] if chat else shapes.prompts(body)
            options = self._options(body, caller, key, chat, ask)
            stream = body.get("stream", False)
            if not isinstance(stream, bool):
                raise shapes.ApiError(400, "stream must be true or false", param="stream")
            if stream and (len(asked) > 1 or ask.top is not None or ask.echo):
                raise shapes.ApiError(
                    400,
                    "stream one prompt without logprobs or echo: batches and log-probabilities come whole (stream: false)",
                    param="stream",
                )
            ticket = self._reserve(self.guard.client(caller))
        except (shapes.ApiError, KvgraftError) as exc:
            err = exc if isinstance(exc, shapes.ApiError) else shapes.api_error(exc)
            outcome(f"error_{err.status}")
            ctx.__exit__(None, None, None)
            return err.response()
        except BaseException:  # the client went away while its body was read, or a bug: counted as an error
            ctx.__exit__(None, None, None)
            raise
        rid = ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12)
        created, mid = int(self._clock()), shapes.model_id(self.library)
        work = [(a.text, dataclasses.replace(options, prompt_ids=a.ids)) for a in asked]
        job = _Job(self, caller, work, ticket, t0, lambda results, exc: self._account(results, exc, outcome, ctx))
        if not stream:
            try:
                results = await asyncio.to_thread(job.run)
            except KvgraftError as exc:
                return shapes.api_error(exc).response()
            echoed = [a.text or r.prompt_text for a, r in zip(asked, results, strict=True)]
            return JSONResponse(shapes.whole_response(results, rid, created, mid, chat, ask, echoed))
        # the work starts now, whatever becomes of the stream: it frees its admission place and counts itself
        # when it ends, even when the client goes away before the first event is read
        loop, q = asyncio.get_running_loop(), asyncio.Queue()

        def put(item) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed: the server is stopping
                loop.call_soon_threadsafe(q.put_nowait, item)

        job.on_text = lambda text: put(("text", text))
        threading.Thread(target=job.run_into, args=(put,), daemon=True).start()
        return StreamingResponse(
            self._events(q, options.stop, rid, created, mid, chat),
            media_type="text/event-stream",
            headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
        )

    def _account(self, results: list, exc: Exception | None, outcome: Callable[[str], None], ctx) -> None:
        """A request's end, in its worker thread: its answers' figures, or why it failed, and the request counted."""
        if exc is None:
            for result in results:
                self.metrics.answered(result)
            outcome("ok")
        elif isinstance(exc, KvgraftError):
            self.metrics.failed(exc)
            outcome(f"error_{shapes.api_error(exc).status}")
        else:
            outcome("error_500")
        ctx.__exit__(None, None, None)

    async def _events(self, q: asyncio.Queue, stop: tuple[str, ...], rid: str, created: int, mid: str, chat: bool):
        """The SSE stream of one answer: a role chunk (chat), a chunk per piece of text that later tokens cannot
        change, the last piece with finish_reason, usage and the kvgraft proof, then `data: [DONE]`."""

        def chunk(delta: str | None, finish=None, extra=None) -> str:
            if chat:
                d = {"role": "assistant", "content": ""} if delta is None else ({"content": delta} if delta else {})
                choice = {"index": 0, "delta": d, "logprobs": None, "finish_reason": finish}
                obj = "chat.completion.chunk"
            else:
                choice = {"index": 0, "text": delta or "", "logprobs": None, "finish_reason": finish}
                obj = "text_completion"
            return (
                "data: "
                + json.dumps({"id": rid, "object": obj, "created": created, "model": mid, "choices": [choice]} | (extra or {}))
                + "\n\n"
            )

        sent = ""
        if chat:
            yield chunk(None)
        while True:
            kind, value = await q.get()
            if kind == "text":
                safe = templates.settled(value, stop, raw=not chat)
                if safe.startswith(sent) and len(safe) > len(sent):
                    yield chunk(safe[len(sent) :])
                    sent = safe
                continue
            if kind == "error":
                err = (
                    shapes.api_error(value)
                    if isinstance(value, KvgraftError)
                    else shapes.ApiError(500, f"internal error ({type(value).__name__})", "server_error")
                )
                yield "data: " + json.dumps(err.body()) + "\n\n"
                break
            result = value
            if not result.answer.startswith(sent):  # cannot happen while `settled` holds back what may change
                log.error("streamed text %r is not a prefix of the answer %r", sent, result.answer)
            rest = result.answer[len(sent) :] if result.answer.startswith(sent) else ""
            yield chunk(
                rest, shapes.finish_reason(result), {"usage": shapes.usage(result), "kvgraft": shapes.kvgraft_object(result)}
            )
            break
        yield "data: [DONE]\n\n"


class _Job:
    """One admitted request: its answers (a batch's prompts, each a question and its options) run in order in a
    worker thread within one fair turn; when it ends its admission place is freed and `done(results, error)` counts
    it, whoever still reads it."""

    def __init__(self, server: OpenAIServer, caller, work: list, ticket: int, t0: float, done: Callable):
        self.server, self.caller, self.work, self.ticket, self.t0 = server, caller, work, ticket, t0
        self.on_text: Callable[[str], None] | None = None
        self._done = done
        self._first = False

    def _token(self, text: str) -> None:
        if not self._first:
            self._first = True
            self.server.metrics.first_token(time.perf_counter() - self.t0)
        if self.on_text is not None:
            self.on_text(text)

    def run(self) -> list:
        results, error = [], None
        try:
            with self.server.guard.turn(self.caller):
                for question, options in self.work:
                    results.append(self.server.library.answer(question, options, on_token=self._token))
            return results
        except BaseException as exc:
            error = exc
            raise
        finally:
            self.server.admission.release(self.ticket)
            self._done(results, error)

    def run_into(self, put: Callable) -> None:
        """`run` (one prompt), its result or error handed to `put` (the stream's reader), even when the reader went away."""
        try:
            put(("result", self.run()[0]))
        except Exception as exc:  # handed to the stream, which keeps the server up
            if not isinstance(exc, KvgraftError):
                log.error("answer failed", exc_info=exc)
            put(("error", exc))


def routes(server: OpenAIServer) -> list[Route]:
    """The API's routes (the web app serves them on its own port)."""
    return [
        Route("/v1/models", server.models, methods=["GET"]),
        Route("/v1/models/{model_id:path}", server.model, methods=["GET"]),
        Route("/v1/completions", server.completions, methods=["POST"]),
        Route("/v1/chat/completions", server.chat_completions, methods=["POST"]),
        Route("/v1/kvgraft/deposits", server.deposits, methods=["POST"]),
        Route("/metrics", server.metrics_text, methods=["GET"]),
    ]


async def _not_here(request: Request, exc: HTTPException) -> Response:
    """Starlette's own 404 and 405 (no such route, or not that method) in OpenAI's error shape."""
    if exc.status_code == 405:
        allowed = next((v for k, v in (exc.headers or {}).items() if k.lower() == "allow"), "")
        err = shapes.ApiError(
            405,
            f"{request.method} is not allowed on {request.url.path}: use {allowed or 'another method'}",
            code="method_not_allowed",
        )
        return JSONResponse(err.body(), status_code=405, headers={"allow": allowed} if allowed else None)
    routes_ = "GET /v1/models, GET /v1/models/{id}, POST /v1/completions, POST /v1/chat/completions, POST /v1/kvgraft/deposits"
    err = shapes.ApiError(exc.status_code, f"no route {request.url.path}: this server serves {routes_}", code="not_found")
    return err.response()


def app(server: OpenAIServer) -> Starlette:
    return Starlette(routes=routes(server), exception_handlers={404: _not_here, 405: _not_here})


PREFIXES = ("/v1/", "/metrics")


class OpenAIDoor:
    """ASGI middleware: requests for `/v1/...` and `/metrics` go to the API app, everything else on to the page.
    Placed after the per-address `JoinLimiter`, so the API's requests are rate-limited as the page's are."""

    def __init__(self, app_, server: OpenAIServer):
        self.app, self.api = app_, app(server)

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            path = scope.get("path", "")
            root = scope.get("root_path", "")
            if root and path.startswith(root):
                path = path[len(root) :]
            if path.startswith(PREFIXES[0]) or path == PREFIXES[1]:
                return await self.api(dict(scope, path=path, root_path=""), receive, send)
        return await self.app(scope, receive, send)
