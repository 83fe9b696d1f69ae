"""The Ray Serve deployment: each replica opens one `services.Library` over the shared store (catalog URL
+ blob root), loads the model once, and serves the CLI's JSON over HTTP. Routing, restarts, health
polling and autoscaling are Ray's; this module only makes the engine a good replica.

No `from __future__ import annotations` here: FastAPI reads the route signatures at runtime.

Routes: POST /answer, POST /deposit (admin token), POST /verify, GET /library, GET /library/{ref},
GET /health, and the OpenAI-compatible API (serving.openai_api: /v1/models, /v1/completions,
/v1/chat/completions, /v1/kvgraft/deposits, /metrics) under the web chat's admission and bounds, per replica. Every response names the replica that served it in the `X-Kvgraft-Replica` header.
"""

import asyncio
import hmac
import os
import time
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from ray import serve

import services
from access.admission import Admission
from access.arrivals import BodyDeadline
from access.bodies import read_json
from access.guard import FairTurns, Guard, address_depth, per_address
from errors import ArtifactNotFound, InputTooLong, IntegrityError, InvalidInput, KvgraftError, VerificationFailed
from retrieval.embedder import HashEmbedder, SentenceEmbedder
from services import AnswerOptions
from services.limits import (
    ANON_REPORT_SAMPLES,
    MAX_K,
    MAX_NEW_TOKENS,
    MAX_REPORT_SAMPLES,
    anon_max_new_tokens,
    anon_prompt_tokens,
    report_bounds,
    warm_proofs_limit,
    whole,
)

from . import health as health_mod
from . import openai_api
from .client import ADMIN_HEADER, REPLICA_HEADER
from .settings import ServeSettings

api = FastAPI(title="kvgraft", docs_url=None, redoc_url=None)

_STATUS = {
    InvalidInput: 400,
    InputTooLong: 413,
    ArtifactNotFound: 404,
    VerificationFailed: 422,
    IntegrityError: 409,
    health_mod.Unhealthy: 503,
}


class Forbidden(KvgraftError):
    """The request needs the admin token and did not carry the right one."""


def _status(exc: KvgraftError) -> int:
    if isinstance(exc, Forbidden):
        return 403
    return next((code for kind, code in _STATUS.items() if isinstance(exc, kind)), 500)


def _flag(body: dict, name: str) -> bool:
    value = body.get(name, False)
    if not isinstance(value, bool):
        raise InvalidInput(f"{name} must be true or false, got {str(value)[:40]!r}")
    return value


def _text(body: dict, name: str, required: bool = True) -> str | None:
    value = body.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, str):
        raise InvalidInput(f"{name} must be a string" + ("" if required else " or absent"))
    return value


@serve.deployment(name="kvgraft")
@serve.ingress(api)
class Replica:
    """One replica: one Library over the shared store, the model loaded once in __init__."""

    def __init__(self, settings: dict):
        self.settings = ServeSettings(**settings | {k: Path(settings[k]) for k in ("blob_root", "state_root")})
        ctx = serve.get_replica_context()
        self.replica_id = ctx.replica_id.unique_id
        self.actor_name = ctx.replica_id.to_full_id_str()
        home = self.settings.state_root / self.replica_id  # per replica: the FAISS index cache only
        embedder = HashEmbedder() if self.settings.embedder == "hash" else SentenceEmbedder()
        t0 = time.perf_counter()
        self.lib = services.Library(
            home=home,
            db_url=self.settings.db_url,
            model_name=self.settings.model,
            embedder=embedder,
            blob_root=self.settings.blob_root,
        )
        self.fingerprint = self.lib.lm.fingerprint  # the model, once per replica
        self.lib.index()  # the index at the catalog's current version before the first request
        # first answers from the newest artifacts then carry the one-hash state proof instead of the probe forward
        self.warm = self.lib.warm_proofs(warm_proofs_limit())  # KVGRAFT_WARM_PROOFS of the replica's environment
        # the OpenAI-compatible API: the web chat's admission, bounds and fair turns, per replica
        turns = FairTurns(per_address=per_address(), slots=1, depth=address_depth())
        guard = Guard(self.settings.admin_token or "", turns=turns)
        self.openai = openai_api.OpenAIServer(self.lib, guard, Admission(per_session=turns.per_session, depth=turns.depth))
        # slow and broken senders, as on the app's port: Ray's proxy streams the body to the replica, so a client
        # that sends less than its Content-Length would hold this replica's request slot with no read timeout
        if not any(m.cls is BodyDeadline for m in api.user_middleware):
            api.add_middleware(BodyDeadline, read_s=self.settings.body_read_s)
        self.load_s = time.perf_counter() - t0

    # ---- Ray's hooks -------------------------------------------------------------------------

    def check_health(self) -> None:
        """Ray polls this every health_check_period_s; raising marks the replica unhealthy (Ray replaces it)."""
        h = health_mod.check(self.lib, self.settings.blob_root, self.replica_id, self.fingerprint)
        if not h.healthy:
            raise health_mod.Unhealthy(f"replica {self.replica_id}: " + "; ".join(h.problems))

    def __del__(self) -> None:
        lib = getattr(self, "lib", None)
        if lib is not None:
            lib.close()

    # ---- plumbing ----------------------------------------------------------------------------

    def _admin(self, request: Request) -> bool:
        """True for the right admin token; False for none; Forbidden for a wrong one."""
        given = request.headers.get(ADMIN_HEADER) or request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        if not given:
            return False
        token = self.settings.admin_token
        if not token:
            raise Forbidden("admin actions are disabled on this deployment: start it with KVGRAFT_ADMIN_TOKEN set")
        if not hmac.compare_digest(given.encode("utf-8", "replace"), token.encode()):
            raise Forbidden(f"admin token refused: send the value of KVGRAFT_ADMIN_TOKEN in the {ADMIN_HEADER} header")
        return True

    def _reply(self, payload: dict | list, status: int = 200) -> JSONResponse:
        return JSONResponse(payload, status_code=status, headers={REPLICA_HEADER: self.replica_id})

    async def _handle(self, request: Request, work) -> JSONResponse:
        """Parse the JSON body and the admin token, run `work(body, admin)` in a worker thread (so health
        polls are answered while the model computes), and turn
        a kvgraft error into a JSON error with a status code (the message says what to do)."""
        try:
            body = read_json(await request.body())  # nesting bounded, valid Unicode: BodyRefused (an InvalidInput) else
            if not isinstance(body, dict):
                raise InvalidInput("the request body must be a JSON object")
            admin = self._admin(request)
            return self._reply(await asyncio.to_thread(work, body, admin))
        except KvgraftError as e:
            return self._error(e)

    async def _read(self, work) -> JSONResponse:
        try:
            return self._reply(await asyncio.to_thread(work))
        except KvgraftError as e:
            return self._error(e)

    def _error(self, e: KvgraftError) -> JSONResponse:
        return self._reply({"error": type(e).__name__, "message": str(e), "replica": self.replica_id}, _status(e))

    # ---- routes ------------------------------------------------------------------------------

    @api.post("/answer")
    async def answer(self, request: Request) -> JSONResponse:
        return await self._handle(request, self._answer)

    @api.post("/deposit")
    async def deposit(self, request: Request) -> JSONResponse:
        return await self._handle(request, self._deposit)

    @api.post("/verify")
    async def verify(self, request: Request) -> JSONResponse:
        return await self._handle(request, self._verify)

    @api.get("/library")
    async def library(
        self, query: str = "", kind: str | None = None, limit: int = 100, offset: int = 0, model: str | None = None
    ) -> JSONResponse:
        def work() -> list:
            n, skip = whole("limit", limit, 1, 1000), whole("offset", offset, 0, 2**31)
            return [e.to_json() for e in self.lib.entries(query=query, kind=kind, limit=n, offset=skip, model=model)]

        return await self._read(work)

    @api.get("/library/{ref}")
    async def show(self, ref: str) -> JSONResponse:
        return await self._read(lambda: self.lib.show(ref).to_json())

    @api.get("/health")
    async def health(self) -> JSONResponse:
        h = await asyncio.to_thread(health_mod.check, self.lib, self.settings.blob_root, self.replica_id, self.fingerprint)
        payload = h.to_json() | {
            "actor_name": self.actor_name,
            "load_s": self.load_s,
            "pid": os.getpid(),
            "warm_proofs": self.warm.line(),
        }
        return self._reply(payload, 200 if h.healthy else 503)

    # ---- the OpenAI-compatible API (serving.openai_api) ----------------------------------------

    @api.get("/v1/models")
    async def v1_models(self, request: Request) -> Response:
        return await self.openai.models(request)

    @api.get("/v1/models/{model_id:path}")
    async def v1_model(self, request: Request) -> Response:
        return await self.openai.model(request)

    @api.post("/v1/completions")
    async def v1_completions(self, request: Request) -> Response:
        return await self.openai.completions(request)

    @api.post("/v1/chat/completions")
    async def v1_chat_completions(self, request: Request) -> Response:
        return await self.openai.chat_completions(request)

    @api.post("/v1/kvgraft/deposits")
    async def v1_deposits(self, request: Request) -> Response:
        return await self.openai.deposits(request)

    @api.get("/metrics")
    async def metrics(self, request: Request) -> Response:
        return await self.openai.metrics_text(request)

    # ---- the work, in a worker thread ----------------------------------------------------------

    def _answer(self, body: dict, admin: bool) -> dict:
        cap = MAX_NEW_TOKENS if admin else anon_max_new_tokens()
        return self.lib.answer(
            _text(body, "question"),
            AnswerOptions(
                k=whole("k", body.get("k", 3), 1, MAX_K),
                artifact=_text(body, "artifact", required=False),
                graft=not _flag(body, "no_graft"),
                max_new_tokens=whole("max_new_tokens", body.get("max_new_tokens", 32), 1, cap),
                raw=_flag(body, "raw"),
                check=_flag(body, "check"),
                compare=_flag(body, "compare"),
                relocated=_flag(body, "relocated"),
                compose=_flag(body, "compose"),
                max_prompt_tokens=None if admin else anon_prompt_tokens(),
                temperature=body.get("temperature", 0.0),  # the pipeline checks these, before any work
                top_p=body.get("top_p", 1.0),
                seed=body.get("seed"),
                stop=tuple(stop) if isinstance(stop := body.get("stop", []), list) else stop,
            ),
        ).to_json()

    def _deposit(self, body: dict, admin: bool) -> dict:
        if not admin:
            raise Forbidden(f"deposits need the admin token: send it in the {ADMIN_HEADER} header")
        parent, title = _text(body, "parent", required=False), _text(body, "title", required=False) or ""
        if body.get("question") is not None:
            return self.lib.deposit_item(
                _text(body, "question"),
                _text(body, "solution"),
                _text(body, "answer", required=False),
                _text(body, "verifier"),
                _text(body, "reference"),
                parent=parent,
                title=title,
                admin=True,
            ).to_json()
        attested_by = _text(body, "attested_by", required=False)
        return self.lib.deposit_text(
            _text(body, "text"), parent=parent, title=title, attested_by=attested_by, admin=True
        ).to_json()

    def _verify(self, body: dict, admin: bool) -> dict:
        cap = MAX_REPORT_SAMPLES if admin else ANON_REPORT_SAMPLES
        relocate = body.get("relocate")
        # anonymous: the web app's bounds (a sample costs about one short chat: few greedy steps, short
        # chains, no monolithic recomputation); a relocation offset stays inside the model's context
        bounds = report_bounds(admin)
        rep = self.lib.exactness_report(
            whole("samples", body.get("samples", 3), 1, cap),
            relocate=None if relocate is None else whole("relocate", relocate, 0, self.lib.lm.info.max_positions - 1),
            seed=whole("seed", body.get("seed", 0), 0, 2**31),
            **bounds,
        )
        return rep.to_json(every_field=_flag(body, "rows"))
