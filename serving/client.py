"""A small HTTP client for the deployment's JSON (stdlib only), with the retry policy users get.

Every call kvgraft exposes is safe to repeat: an answer is a pure function of the store and the
question, a deposit is keyed by its content (a repeat returns `created: false`). So when a replica dies
under a request (Ray's proxy answers 500 with no kvgraft JSON, or the connection drops) the client
retries on another replica; after `retries` it raises `BackendUnavailable` saying what happened.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from errors import KvgraftError

REPLICA_HEADER = "X-Kvgraft-Replica"  # every response names the replica that served it
ADMIN_HEADER = "X-Kvgraft-Admin"  # the admin token (or `Authorization: Bearer <token>`)


class BackendUnavailable(KvgraftError):
    """No replica completed the request after the retries (replicas dying, restarting or unreachable)."""


class BackendRefused(KvgraftError):
    """A replica answered with a kvgraft error (bad input, no admin token, ...); `status` and `kind` say which."""

    def __init__(self, message: str, status: int, kind: str):
        super().__init__(message)
        self.status, self.kind = status, kind


@dataclass(frozen=True)
class Reply:
    payload: dict | list
    replica: str  # which replica answered (X-Kvgraft-Replica)
    attempts: int  # 1 unless a replica was lost under the request


class Client:
    def __init__(self, base_url: str, admin_token: str = "", timeout_s: float = 300.0, retries: int = 2, backoff_s: float = 1.0):
        self.base_url = base_url.rstrip("/")
        self.admin_token, self.timeout_s, self.retries, self.backoff_s = admin_token, timeout_s, retries, backoff_s

    def request(self, method: str, path: str, body: dict | None = None) -> Reply:
        data = None if body is None else json.dumps(body).encode("utf-8")
        headers = {"Content-Type": "application/json"}
        if self.admin_token:
            headers[ADMIN_HEADER] = self.admin_token
        lost: list[str] = []
        for attempt in range(1, self.retries + 2):
            req = urllib.request.Request(self.base_url + path, data=data, method=method, headers=headers)
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                    return Reply(json.loads(resp.read()), resp.headers.get(REPLICA_HEADER, ""), attempt)
            except urllib.error.HTTPError as e:
                raw = e.read()
                try:
                    err = json.loads(raw)
                except ValueError:
                    err = None
                if isinstance(err, dict) and "error" in err and e.code != 503:
                    raise BackendRefused(err.get("message", ""), e.code, err["error"]) from None
                if e.code < 500:  # the proxy or FastAPI refused the request itself: a retry cannot help
                    raise BackendRefused(f"HTTP {e.code}: {raw[:300].decode('utf-8', 'replace')}", e.code, "HTTPError") from None
                lost.append(f"HTTP {e.code} {raw[:120].decode('utf-8', 'replace').strip()}")
            except (urllib.error.URLError, ConnectionError, TimeoutError) as e:
                lost.append(f"{type(e).__name__}: {e}")
            time.sleep(self.backoff_s * attempt)
        raise BackendUnavailable(
            f"{method} {path}: no replica completed the request in {len(lost)} attempts ({'; '.join(lost)}); "
            "check `serve status` / GET /health, the replicas may be restarting"
        )

    def answer(self, question: str, **options) -> Reply:
        return self.request("POST", "/answer", {"question": question, **options})

    def deposit_text(self, text: str, title: str = "", parent: str | None = None) -> Reply:
        return self.request("POST", "/deposit", {"text": text, "title": title, "parent": parent})

    def verify(self, samples: int = 3, seed: int = 0) -> Reply:
        return self.request("POST", "/verify", {"samples": samples, "seed": seed})

    def library(self, query: str = "", limit: int = 100) -> Reply:
        return self.request("GET", f"/library?limit={limit}&query={urllib.request.quote(query)}")

    def health(self) -> Reply:
        return self.request("GET", "/health")
