"""The OpenAI-compatible API over one library: `/v1/models`, `/v1/completions`, `/v1/chat/completions`
(whole or streamed as server-sent events ending `data: [DONE]`), `/v1/kvgraft/deposits` (the admin's) and
`/metrics` (Prometheus). The web app serves it on the page's own port (`web.app.serve`), a Ray replica on its
routes (`serving.replica`); both hand it their library, guard and admission, so an API request is admitted,
bounded and turned exactly as a chat is (`web.admission.Admission` at arrival, `web.bounds.answer_options`,
`web.guard.FairTurns`). It parses, bounds and formats; the answer and its proof are `LibraryDoor.answer`'s.

Who asks: the address (as the server resolved it) is the caller; each request is its own session, so one
address holds at most KVGRAFT_ADDRESS_DEPTH requests queued or running. The API key is the admin token
(`Authorization: Bearer ...`); no key, or one of `ANONYMOUS_KEYS`, is anonymous; any other key is a guess at
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
from pathlib import Path
from types import SimpleNamespace

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

import settings
from errors import ArtifactNotFound, InputTooLong, IntegrityError, InvalidInput, KvgraftError, NotReady, VerificationFailed
from graft_core import templates  # torch-free: text rules only
from services.limits import MAX_QUESTION_CHARS, MAX_TEXT_CHARS
from web.bounds import answer_options
from web.guard import Client, Refused

from .metrics import Metrics

log = logging.getLogger("kvgraft.openai")

ANONYMOUS_KEYS = frozenset({"", "anonymous", "none", "EMPTY"})  # what clients that must send a key send for none
MAX_BODY = 256 * 1024  # bytes of a completion's JSON body
MAX_DEPOSIT_BODY = 4 * MAX_TEXT_CHARS + 64 * 1024  # the admin's deposit (JSON-escaped text: up to 4 bytes a char... bounded)
MAX_MESSAGES = 32
DEFAULT_MAX_TOKENS = 16  # the chat's default answer length
# fields of OpenAI's requests this server refuses (400) when they ask for anything but the default
_UNSUPPORTED = {
    "n": lambda v: v not in (None, 1),
    "best_of": lambda v: v not in (None, 1),
    "logprobs": lambda v: v not in (None, False, 0),
    "top_logprobs": lambda v: v not in (None, 0),
    "echo": lambda v: v not in (None, False),
    "suffix": lambda v: v not in (None, ""),
    "logit_bias": lambda v: v not in (None, {}),
    "presence_penalty": lambda v: v not in (None, 0, 0.0),
    "frequency_penalty": lambda v: v not in (None, 0, 0.0),
    "tools": lambda v: v not in (None, []),
    "tool_choice": lambda v: v not in (None, "none", "auto"),
    "functions": lambda v: v not in (None, []),
    "function_call": lambda v: v not in (None, "none", "auto"),
    "response_format": lambda v: v not in (None, {"type": "text"}),
    "modalities": lambda v: v not in (None, ["text"]),
    "audio": lambda v: v is not None,
    "prediction": lambda v: v is not None,
    "reasoning_effort": lambda v: v is not None,
    "web_search_options": lambda v: v is not None,
}
_ACCEPTED = {"model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "stop"}
_ACCEPTED |= {"stream", "stream_options", "user", "kvgraft", "metadata", "store", "parallel_tool_calls", "service_tier"}
_EXTENSION_FIELDS = {"artifacts", "graft", "check", "k"}


class ApiError(Exception):
    """An error in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}` with an HTTP status."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None, code=None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = status, message, kind, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        headers = {"retry-after": "1"} if self.status == 429 else None
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def _from_kvgraft(exc: KvgraftError) -> ApiError:
    """A kvgraft error as the API's: its message (which says what to do) and the status a client acts on."""
    msg = str(exc)
    if isinstance(exc, Refused):
        if "needs the admin token" in msg:  # an anonymous caller asked for the admin's work
            return ApiError(403, msg, "permission_error", code="admin_only")
        if "too many wrong admin tokens" not in msg.lower() and ("admin token" in msg.lower() or "admin actions" in msg.lower()):
            return ApiError(401, msg, "authentication_error", code="invalid_api_key")
        return ApiError(429, msg, "rate_limit_error", code="rate_limit_exceeded")  # a lockout or a busy share
    if isinstance(exc, InputTooLong):
        return ApiError(400, msg, code="context_length_exceeded")
    if isinstance(exc, InvalidInput):
        return ApiError(400, msg)
    if isinstance(exc, ArtifactNotFound):
        return ApiError(404, msg, param="kvgraft.artifacts", code="artifact_not_found")
    if isinstance(exc, VerificationFailed):
        return ApiError(422, msg, "gate_refused", code="verification_failed")
    if isinstance(exc, IntegrityError):
        return ApiError(409, msg, "integrity_error", code="quarantined" if "quarantined" in msg else "integrity")
    if isinstance(exc, NotReady):
        return ApiError(503, msg, "server_error", code="not_ready")
    return ApiError(500, msg, "server_error")


def model_id(library) -> str:
    """The one model this server lists: the library's model name (a path's last part), else the packaged default."""
    name = library.model_name or settings.get("KVGRAFT_MODEL") or "packaged:gemma-3-270m"
    return Path(name).name if "/" in name and not name.startswith("packaged:") else name


def _number(body: dict, name: str, default, low: float, high: float, low_open: bool = False) -> float:
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int | float) or not (low < v if low_open else low <= v) or v > high:
        bound = f"above {low:g}" if low_open else f"at least {low:g}"
        raise ApiError(400, f"{name} must be a number {bound} and at most {high:g}, got {str(v)[:40]!r}", param=name)
    return float(v)


def _text_content(content, where: str) -> str:
    """A message's content: a string, or a list of text parts (anything else is refused)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        if all(isinstance(p.get("text"), str) for p in content):
            return "".join(p["text"] for p in content)
    raise ApiError(
        400, f"{where}.content must be text (a string or text parts); images, audio and files are not supported", param=where
    )


def _question(body: dict, chat: bool) -> str:
    """The text answered: a completion's prompt, or a chat's last message, which must be the user's. Every
    message is checked and bounded; earlier turns are not part of the prompt (the base model answers one
    question, as the web chat does)."""
    if not chat:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise ApiError(400, "prompt must be one string (batches and token ids are not supported)", param="prompt")
        text = prompt
    else:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, "messages must be a non-empty list", param="messages")
        if len(messages) > MAX_MESSAGES:
            raise ApiError(400, f"at most {MAX_MESSAGES} messages, got {len(messages)}", param="messages")
        texts = []
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or m.get("role") not in ("system", "developer", "user", "assistant"):
                raise ApiError(400, f"messages[{i}] must have a role of system, developer, user or assistant", param="messages")
            texts.append(_text_content(m.get("content"), f"messages[{i}]"))
            if len(texts[-1]) > MAX_QUESTION_CHARS:
                raise ApiError(
                    400, f"messages[{i}] is {len(texts[-1]):,} characters; the limit is {MAX_QUESTION_CHARS:,}", param="messages"
                )
        if messages[-1]["role"] != "user":
            raise ApiError(400, "the last message must be the user's: it is the question answered", param="messages")
        text = texts[-1]
    if not text.strip():
        raise ApiError(400, "the question is empty", param="prompt" if not chat else "messages")
    if len(text) > MAX_QUESTION_CHARS:
        raise ApiError(400, f"the prompt is {len(text):,} characters; the limit is {MAX_QUESTION_CHARS:,}", param="prompt")
    return text


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise ApiError(400, "stop must be a string or a list of strings", param="stop")
    return tuple(stop)


class OpenAIServer:
    """The API over `library` (a LibraryDoor), with `guard` (admin token, fair turns) and `admission` (requests
    counted at arrival) shared with the front end that serves it; `metrics` defaults to a registry of its own."""

    def __init__(self, library, guard, admission, metrics: Metrics | None = None, clock: Callable[[], float] = time.time):
        self.library, self.guard, self.admission = library, guard, admission
        self.metrics = metrics or Metrics(queue_depth=admission.joined)
        self._clock = clock

    # ---- who asks ----------------------------------------------------------------------------------

    def _caller(self, request: Request) -> SimpleNamespace:
        """What `web.guard` reads of a request: the address the server resolved, and a session of its own."""
        host = request.client.host if request.client else "unknown"
        return SimpleNamespace(client=SimpleNamespace(host=host), session_hash=f"api-{uuid.uuid4().hex}")

    @staticmethod
    def _key(request: Request) -> str:
        auth = request.headers.get("authorization", "")
        scheme, _, key = auth.partition(" ")
        if auth and scheme.lower() != "bearer":
            raise ApiError(401, "send the admin token as `Authorization: Bearer <token>`", "authentication_error")
        key = key.strip()
        return "" if key in ANONYMOUS_KEYS else key

    async def _body(self, request: Request, limit: int) -> dict:
        """The JSON object of the request, read up to `limit` bytes (refused past it before it is parsed)."""
        declared = request.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            raise ApiError(413, f"the request body is larger than {limit:,} bytes", code="body_too_large")
        data = bytearray()
        async for chunk in request.stream():
            data += chunk
            if len(data) > limit:
                raise ApiError(413, f"the request body is larger than {limit:,} bytes", code="body_too_large")
        try:
            body = json.loads(bytes(data))
        except (ValueError, UnicodeDecodeError):
            raise ApiError(400, "the request body must be a JSON object") from None
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object")
        return body

    # ---- routes ------------------------------------------------------------------------------------

    async def models(self, request: Request) -> Response:
        mid = model_id(self.library)
        with self.metrics.request("/v1/models") as outcome:
            outcome("ok")
            return JSONResponse({"object": "list", "data": [{"id": mid, "object": "model", "created": 0, "owned_by": "kvgraft"}]})

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
                    raise ApiError(
                        401,
                        "deposits need the admin token: send `Authorization: Bearer <KVGRAFT_ADMIN_TOKEN>`",
                        "authentication_error",
                    )
                self.guard.admin(key, caller)  # before the body is read: an anonymous deposit costs nothing
                body = await self._body(request, MAX_DEPOSIT_BODY)
                d = await self._admitted(caller, lambda: self._deposit(body))
            except VerificationFailed as exc:
                self.metrics.gate_verdict("refused")
                outcome("refused")
                err = _from_kvgraft(exc).body() | {"kvgraft": {"verdict": "refused", "reason": str(exc)}}
                return JSONResponse(err, status_code=422)
            except (ApiError, KvgraftError) as exc:
                err = exc if isinstance(exc, ApiError) else _from_kvgraft(exc)
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
            raise ApiError(400, f"unknown deposit field(s) {', '.join(sorted(unknown))}: use {', '.join(sorted(fields))}")
        for k, v in body.items():
            if v is not None and not isinstance(v, str):
                raise ApiError(400, f"{k} must be a string", param=k)
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
            raise ApiError(400, "nothing to deposit: give question, solution, verifier and reference, or text")
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
            raise ApiError(429, str(exc), "rate_limit_error", code="rate_limit_exceeded") from None

    def _options(self, body: dict, caller, key: str, question_chat: bool):
        unknown = set(body) - _ACCEPTED - set(_UNSUPPORTED)
        if unknown:
            raise ApiError(400, f"unsupported parameter(s): {', '.join(sorted(unknown))}", param=sorted(unknown)[0])
        for name, refused in _UNSUPPORTED.items():
            if name in body and refused(body[name]):
                raise ApiError(
                    400, f"{name} is not supported by kvgraft's server (one greedy or seeded-sampled answer)", param=name
                )
        mid = model_id(self.library)
        if body.get("model") not in (mid, "kvgraft"):
            raise ApiError(
                404,
                f"The model `{str(body.get('model'))[:80]}` does not exist: this server serves `{mid}` (GET /v1/models)",
                param="model",
                code="model_not_found",
            )
        ext = body.get("kvgraft") or {}
        if not isinstance(ext, dict) or set(ext) - _EXTENSION_FIELDS:
            raise ApiError(400, f"kvgraft must be an object of {', '.join(sorted(_EXTENSION_FIELDS))}", param="kvgraft")
        for flag in ("graft", "check"):
            if flag in ext and not isinstance(ext[flag], bool):
                raise ApiError(400, f"kvgraft.{flag} must be true or false", param=f"kvgraft.{flag}")
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        max_tokens = DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens
        base = answer_options(
            self.guard, caller, ext.get("k", 3), ext.get("graft", True), max_tokens, ext.get("check", False), False, key
        )
        seed = body.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ApiError(400, "seed must be an integer", param="seed")
        return dataclasses.replace(
            base,
            artifact=self._artifact(ext.get("artifacts")),
            raw=not question_chat,
            temperature=_number(body, "temperature", 0.0, 0, 2),
            top_p=_number(body, "top_p", 1.0, 0, 1, low_open=True),
            seed=seed,
            stop=_stop(body),
        )

    def _artifact(self, artifacts) -> str | None:
        """kvgraft.artifacts: one artifact id (its chain is grafted), or its whole chain root first."""
        if artifacts is None:
            return None
        if isinstance(artifacts, str):
            artifacts = [artifacts]
        if not isinstance(artifacts, list) or not artifacts or not all(isinstance(a, str) and a for a in artifacts):
            raise ApiError(400, "kvgraft.artifacts must be a list of artifact ids", param="kvgraft.artifacts")
        if len(artifacts) > 64:
            raise ApiError(400, "kvgraft.artifacts names at most 64 ids", param="kvgraft.artifacts")
        chain = list(self.library.show(artifacts[-1]).chain)
        if (
            len(artifacts) > 1
            and [c[: len(a)] for c, a in zip(chain, artifacts, strict=False)] != artifacts
            or len(artifacts) not in (1, len(chain))
        ):
            raise ApiError(
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
            body = await self._body(request, MAX_BODY)
            question = _question(body, chat)
            options = self._options(body, caller, key, chat)
            stream = body.get("stream", False)
            if not isinstance(stream, bool):
                raise ApiError(400, "stream must be true or false", param="stream")
            ticket = self._reserve(self.guard.client(caller))
        except (ApiError, KvgraftError) as exc:
            err = exc if isinstance(exc, ApiError) else _from_kvgraft(exc)
            outcome(f"error_{err.status}")
            ctx.__exit__(None, None, None)
            return err.response()
        except BaseException:  # the client went away while its body was read, or a bug: counted as an error
            ctx.__exit__(None, None, None)
            raise
        rid = ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12)
        created, mid = int(self._clock()), model_id(self.library)
        job = _Job(self, caller, question, options, ticket, t0, lambda result, exc: self._account(result, exc, outcome, ctx))
        if not stream:
            try:
                result = await asyncio.to_thread(job.run)
            except KvgraftError as exc:
                return _from_kvgraft(exc).response()
            return JSONResponse(_whole(result, rid, created, mid, chat))
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

    def _account(self, result, exc: Exception | None, outcome: Callable[[str], None], ctx) -> None:
        """An answer's end, in its worker thread: its figures, or why it failed, and its request counted."""
        if exc is None:
            self.metrics.answered(result)
            outcome("ok")
        elif isinstance(exc, KvgraftError):
            self.metrics.failed(exc)
            outcome(f"error_{_from_kvgraft(exc).status}")
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
                safe = templates.settled(value, stop)
                if safe.startswith(sent) and len(safe) > len(sent):
                    yield chunk(safe[len(sent) :])
                    sent = safe
                continue
            if kind == "error":
                err = (
                    _from_kvgraft(value)
                    if isinstance(value, KvgraftError)
                    else ApiError(500, f"internal error ({type(value).__name__})", "server_error")
                )
                yield "data: " + json.dumps(err.body()) + "\n\n"
                break
            result = value
            if not result.answer.startswith(sent):  # cannot happen while `settled` holds back what may change
                log.error("streamed text %r is not a prefix of the answer %r", sent, result.answer)
            rest = result.answer[len(sent) :] if result.answer.startswith(sent) else ""
            yield chunk(rest, _finish(result), {"usage": _usage(result), "kvgraft": kvgraft_object(result)})
            break
        yield "data: [DONE]\n\n"


class _Job:
    """One admitted answer: run in a worker thread within its fair turn; when it ends its admission place is
    freed and `done(result, error)` counts it, whoever still reads it."""

    def __init__(self, server: OpenAIServer, caller, question: str, options, ticket: int, t0: float, done: Callable):
        self.server, self.caller, self.question, self.options, self.ticket, self.t0 = (
            server,
            caller,
            question,
            options,
            ticket,
            t0,
        )
        self.on_text: Callable[[str], None] | None = None
        self._done = done
        self._first = False

    def _token(self, text: str) -> None:
        if not self._first:
            self._first = True
            self.server.metrics.first_token(time.perf_counter() - self.t0)
        if self.on_text is not None:
            self.on_text(text)

    def run(self):
        result, error = None, None
        try:
            with self.server.guard.turn(self.caller):
                result = self.server.library.answer(self.question, self.options, on_token=self._token)
            return result
        except BaseException as exc:
            error = exc
            raise
        finally:
            self.server.admission.release(self.ticket)
            self._done(result, error)

    def run_into(self, put: Callable) -> None:
        """`run`, its result or error handed to `put` (the stream's reader), even when the reader went away."""
        try:
            put(("result", self.run()))
        except Exception as exc:  # handed to the stream, which keeps the server up
            if not isinstance(exc, KvgraftError):
                log.error("answer failed", exc_info=exc)
            put(("error", exc))


def _finish(result) -> str:
    return "length" if result.stopped == "length" else "stop"


def _usage(result) -> dict:
    prompt = result.grafted_tokens + result.computed_tokens
    return {
        "prompt_tokens": prompt,
        "completion_tokens": result.decode_tokens,
        "total_tokens": prompt + result.decode_tokens,
        "prompt_tokens_details": {"cached_tokens": result.grafted_tokens},
    }


def kvgraft_object(result) -> dict:
    """What every response carries of the answer's proof: the tier, what was grafted and retrieved, the state
    proof (BLAKE3 of the served state, or the first use's probe), the exactness check's logits hashes when it
    ran, the output's hashes and token ids, and the ledger id that `cli.py replay` re-runs."""
    proof = result.proof.as_dict() if result.proof is not None else None
    check = None
    if result.check is not None:
        check = {k: getattr(result.check, k) for k in ("exact", "fresh_sha256", "grafted_sha256", "rows", "tier")}
    return {
        "tier": result.tier,
        "artifact_ids": list(result.artifact_ids),
        "retrieved": [{"id": r.id, "score": r.score, "relevant": r.relevant, "reason": r.reason} for r in result.retrieved],
        "state_proof": proof,
        "check": check,
        "grafted_tokens": result.grafted_tokens,
        "computed_tokens": result.computed_tokens,
        "decode_tokens": result.decode_tokens,
        "output_token_ids": list(result.output_token_ids),
        "output_sha256": result.output_sha256,
        "logits_sha256": result.logits_sha256,
        "ledger_id": result.ledger_id,
        "ttft_s": result.ttft_s,
        "sampling": None
        if result.seed is None
        else {"temperature": result.temperature, "top_p": result.top_p, "seed": result.seed},
        "note": result.note,
        "scope": result.scope,
    }


def _whole(result, rid: str, created: int, mid: str, chat: bool) -> dict:
    if chat:
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": result.answer},
            "logprobs": None,
            "finish_reason": _finish(result),
        }
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": result.answer, "logprobs": None, "finish_reason": _finish(result)}
        obj = "text_completion"
    return {
        "id": rid,
        "object": obj,
        "created": created,
        "model": mid,
        "choices": [choice],
        "usage": _usage(result),
        "kvgraft": kvgraft_object(result),
    }


def routes(server: OpenAIServer) -> list[Route]:
    """The API's routes (the web app serves them on its own port)."""
    return [
        Route("/v1/models", server.models, methods=["GET"]),
        Route("/v1/completions", server.completions, methods=["POST"]),
        Route("/v1/chat/completions", server.chat_completions, methods=["POST"]),
        Route("/v1/kvgraft/deposits", server.deposits, methods=["POST"]),
        Route("/metrics", server.metrics_text, methods=["GET"]),
    ]


def app(server: OpenAIServer) -> Starlette:
    return Starlette(routes=routes(server))


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
