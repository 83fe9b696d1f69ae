"""A deployment seen as a library: `RemoteLibrary` is the library door (`services.LibraryDoor`) served over HTTP by
the replicas through `client.Client` (its retries), with the replica JSON rebuilt into the same result types
(`from_json`). It imports no torch and opens no store; the app fronts a deployment with it (KVGRAFT_BACKEND_URL).

What has no route on the deployment (solve, delete, export/import, the dashboard) raises `NotAvailable`
naming the command to use on a machine with the store. The page's start-up while it connects is the page's
(`web.connecting`).
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path

import errors
from errors import KvgraftError
from services.door import AnswerOptions
from services.forwarding import DoorCall, forwarding
from services.results import AnswerResult, Deposited, ExactnessReport, LibraryEntry, ShowReport

from .client import BackendRefused, Client

log = logging.getLogger("kvgraft.remote")

BACKEND_ENV = "KVGRAFT_BACKEND_URL"
HEALTH_TIMEOUT_S = 10.0  # one health poll; the app's status line must not hang on a dead deployment
# What to run instead, per method without a route (solve, the upkeep handlers, the dashboard).
COMMANDS = {
    "solve": "kvgraft solve",
    "delete": "kvgraft delete",
    "export": "kvgraft export",
    "dashboard": "python app.py over the store (the dashboard)",
    "ledger": "kvgraft replay",
    "warm": "the replicas' own start-up",
    "ask": "kvgraft ask --artifact",
}


class NotAvailable(KvgraftError):
    """The app fronts a deployment and this needs the store itself (no route serves it)."""


def _refused(e: BackendRefused) -> KvgraftError:
    """The replica's kvgraft error as the same class here (the app shows VerificationFailed apart, for one)."""
    kind = getattr(errors, e.kind, None)
    if isinstance(kind, type) and issubclass(kind, KvgraftError) and kind is not KvgraftError:
        return kind(str(e))
    return e


@forwarding
class RemoteLibrary:
    """The library door (`services.LibraryDoor`) over a deployment: each member one HTTP request to `base_url`,
    or a `NotAvailable` saying what to use instead. The members are the door's, generated from its declaration
    (`services.forwarding`): `ROUTES` names the method that serves each one here, `UNAVAILABLE` what to use for
    those without a route, and a member the door gains later is `NotAvailable` until it has a route.

    `admin_token` (the app's own KVGRAFT_ADMIN_TOKEN) is forwarded in X-Kvgraft-Admin for deposits the app
    made as admin (it checked its caller's token first) and for answers and verifies, which the app has
    already bounded by its caller's authority. Nothing streams: an answer arrives whole."""

    model_loaded = True  # the replicas hold the model; nothing loads here
    model_name = "the deployment's model"
    home: Path  # the deployment's URL, what the app prints as its store

    # the door's members without a route: (what, the command to use instead)
    UNAVAILABLE = {
        "store": ("the store itself (catalog, blobs)", ""),
        "lm": ("The model (it lives in the replicas; a relocate offset is bounded there)", "kvgraft verify --relocate"),
        "solve": ("Solve and learn", COMMANDS["solve"]),
        "delete": ("Deleting an artifact", COMMANDS["delete"]),
        "artifact_ids": ("Exporting a bundle", COMMANDS["export"]),
        "stats": ("The dashboard", COMMANDS["dashboard"]),
        "flywheel": ("The dashboard", COMMANDS["dashboard"]),
        "ledger": ("The answer ledger", COMMANDS["ledger"]),
        "index": ("The retrieval index (each replica builds its own)", COMMANDS["warm"]),
        "warm_proofs": ("Warming the proofs (each replica warms its own)", COMMANDS["warm"]),
        "prove_chain": ("Proving a chain ahead of its question", COMMANDS["ask"]),
        "warm_answer": ("A warm-up answer", COMMANDS["ask"]),
    }
    ROUTES = {  # the door's member -> the method here that serves it, handed the call's arguments by name
        "count": "_count",
        "holds_own": "_holds_own",
        "answer": "_answer",
        "deposit_text": "_deposit_text",
        "deposit_item": "_deposit_item",
        "exactness_report": "_exactness_report",
        "entries": "_entries",
        "show": "_show",
        "start_decoding_together": "_start_decoding_together",
        "close": "_close",
    }

    def __init__(self, base_url: str, admin_token: str = "", timeout_s: float = 300.0, retries: int = 2):
        self.base_url = base_url.rstrip("/")
        self.home = Path(f"{self.base_url} (KVGRAFT_BACKEND_URL)")  # what the app prints as its store
        self._anon = Client(self.base_url, timeout_s=timeout_s, retries=retries)
        self._admin = Client(self.base_url, admin_token=admin_token, timeout_s=timeout_s, retries=retries)
        self._last_count = 0

    def _forward(self, call: DoorCall):
        route = self.ROUTES.get(call.member)
        if route is not None:
            return getattr(self, route)(call.arguments)
        what, command = self.UNAVAILABLE.get(call.member, (f"`{call.member}`", ""))
        raise self._unavailable(what, command)

    def _call(self, client: Client, method: str, path: str, body: dict | None = None, parse: Callable = lambda x: x):
        """One request; the reply rebuilt by `parse` (a from_json). A reply of another shape (a deployment
        of another kvgraft version) is a KvgraftError saying so, not an internal error of the app."""
        try:
            payload = client.request(method, path, body).payload
        except BackendRefused as e:
            raise _refused(e) from None
        try:
            return parse(payload)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise KvgraftError(
                f"the deployment's reply to {method} {path.split('?')[0]} is not what this app reads ({type(e).__name__}: {e}): "
                "run the same kvgraft version in the app and the replicas"
            ) from None

    def _unavailable(self, what: str, command: str = "") -> NotAvailable:
        return NotAvailable(
            f"{what} is not available when the app fronts a deployment ({BACKEND_ENV}={self.base_url}): "
            f"use `{command or 'kvgraft export|import|fsck|...'}` on a machine with the store"
        )

    # ---- the routes (each handed the door call's arguments by name) --------------------------------------

    def health(self) -> tuple[int, dict]:
        """GET /health once, no retry: (HTTP status, the JSON it returned); status 0 when nothing answered."""
        try:
            with urllib.request.urlopen(self.base_url + "/health", timeout=HEALTH_TIMEOUT_S) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as e:  # 503: a replica that is not healthy says why in the same JSON
            status, raw = e.code, e.read()
        except (urllib.error.URLError, ConnectionError, TimeoutError) as e:
            return 0, {"problems": [f"{type(e).__name__}: {getattr(e, 'reason', e)}"]}
        try:
            payload = json.loads(raw)
        except ValueError:
            payload = None
        if not isinstance(payload, dict):
            return status, {"problems": [f"HTTP {status} without kvgraft's health JSON (the replicas may be starting)"]}
        if isinstance(payload.get("store_artifacts"), int):
            self._last_count = payload["store_artifacts"]
        return status, payload

    def _count(self, a: Mapping) -> int:
        """Artifacts in the shared store (GET /health); the last count seen when no replica answers now."""
        self.health()
        return self._last_count

    def _holds_own(self, a: Mapping) -> bool:
        """The deployment's replicas serve one model and seed its store themselves: whether it holds anything."""
        return self._count(a) > 0

    def _start_decoding_together(self, a: Mapping) -> str:
        """The replicas decode their answers together (or not) themselves; nothing to build in the app."""
        return "answers decode in the deployment's replicas"

    def _answer(self, a: Mapping) -> AnswerResult:
        """POST /answer with the replica's fields; `on_token` is not called (the answer arrives whole). The
        replica bounds the prompt itself; `threshold` and `record` are its own (retrieval's default, recorded)."""
        o: AnswerOptions = a["options"]
        if o.logprobs is not None or o.echo or o.prompt_ids:  # the replica's /answer carries none of them
            raise self._unavailable("Log-probabilities, echo and token-id prompts", "the replicas' own /v1 (kvgraft serve)")
        body = {"question": a["question"], "k": o.k, "artifact": o.artifact, "no_graft": not o.graft}
        body |= {"max_new_tokens": o.max_new_tokens, "raw": o.raw, "check": o.check, "compare": o.compare}
        body |= {"relocated": o.relocated, "compose": o.compose}
        body |= {"temperature": o.temperature, "top_p": o.top_p, "seed": o.seed, "stop": list(o.stop)}
        return self._call(self._admin, "POST", "/answer", body, AnswerResult.from_json)

    def _deposit_text(self, a: Mapping) -> Deposited:
        body = {k: a[k] for k in ("text", "parent", "title", "attested_by")}
        return self._call(self._admin if a["admin"] else self._anon, "POST", "/deposit", body, Deposited.from_json)

    def _deposit_item(self, a: Mapping) -> Deposited:
        body = {k: a[k] for k in ("question", "solution", "verifier", "reference", "parent", "title")}
        body["answer"] = a["answer"] or None
        return self._call(self._admin if a["admin"] else self._anon, "POST", "/deposit", body, Deposited.from_json)

    def _exactness_report(self, a: Mapping) -> ExactnessReport:
        """POST /verify. A `max_tokens` bound (the app's anonymous limits, services.limits.report_bounds) means
        an anonymous caller: no admin token is sent, so the deployment applies its own anonymous bounds too."""
        client = self._anon if a["max_tokens"] is not None else self._admin
        body = {k: a[k] for k in ("samples", "relocate", "seed")}
        return self._call(client, "POST", "/verify", body, ExactnessReport.from_json)

    def _entries(self, a: Mapping) -> list[LibraryEntry]:
        kind, model = a["kind"], a["model"]
        extra = ({"kind": kind} if kind else {}) | ({"model": model} if model else {})
        q = urllib.parse.urlencode({"query": a["query"], "limit": a["limit"], "offset": a["offset"]} | extra)
        return self._call(self._anon, "GET", f"/library?{q}", parse=lambda rows: [LibraryEntry.from_json(e) for e in rows])

    def _show(self, a: Mapping) -> ShowReport:
        ref = a["ref"]
        return self._call(self._anon, "GET", f"/library/{urllib.parse.quote(ref, safe='')}", parse=ShowReport.from_json)

    def _close(self, a: Mapping) -> None:
        pass
