"""What a serving process counts, in Prometheus' text format (`prometheus_client`, one registry per server, so
two servers in one process never share a count). `serving.openai_api` feeds it; docs/METRICS.md lists each
metric, its labels and what it counts. It knows nothing about HTTP or the model: numbers in, text out.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from errors import IntegrityError, KvgraftError

# seconds: a cached answer's first token is tens of milliseconds; a queued one on a busy CPU, tens of seconds
_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class Metrics:
    """The counters, histograms and gauges of one server; `queue_depth` is read at each scrape."""

    def __init__(self, queue_depth: Callable[[], int] | None = None):
        r = self.registry = CollectorRegistry()
        self.requests = Counter("kvgraft_requests", "API requests by route and outcome", ("route", "outcome"), registry=r)
        self.tokens = Counter(
            "kvgraft_tokens", "Tokens of answers by kind: grafted (restored), computed (prompt), decoded", ("kind",), registry=r
        )
        self.grafts = Counter("kvgraft_grafts", "Answers that grafted an artifact (hit) or none (miss)", ("result",), registry=r)
        self.gate = Counter("kvgraft_gate", "Deposits the gate accepted or refused", ("verdict",), registry=r)
        self.checks = Counter(
            "kvgraft_exactness_checks",
            "Exactness checks (graft vs fresh, byte for byte) passed or failed",
            ("result",),
            registry=r,
        )
        self.proofs = Counter(
            "kvgraft_state_proofs",
            "Per-answer state proofs (BLAKE3 or first-use probe) passed or failed",
            ("result",),
            registry=r,
        )
        self.quarantines = Counter(
            "kvgraft_quarantines", "Answers refused because their artifact failed its proof and was quarantined", registry=r
        )
        self.ttft = Histogram(
            "kvgraft_ttft_seconds",
            "Seconds from a request's arrival to its first token (queue wait included)",
            buckets=_BUCKETS,
            registry=r,
        )
        self.latency = Histogram(
            "kvgraft_request_seconds", "Seconds from a request's arrival to its end", ("route",), buckets=_BUCKETS, registry=r
        )
        self.queue = Gauge("kvgraft_queue_depth", "Model requests admitted and not ended (waiting or running)", registry=r)
        if queue_depth is not None:
            self.queue.set_function(queue_depth)

    @contextlib.contextmanager
    def request(self, route: str) -> Iterator[Callable[[str], None]]:
        """Count one request of `route` when it ends, with the outcome the handler names ("error" unless it does)."""
        t0, outcome = time.perf_counter(), ["error"]
        try:
            yield lambda name: outcome.__setitem__(0, name)
        finally:
            self.requests.labels(route, outcome[0]).inc()
            self.latency.labels(route).observe(time.perf_counter() - t0)

    def first_token(self, seconds: float) -> None:
        self.ttft.observe(seconds)

    def answered(self, result) -> None:
        """An answer's tokens, whether it grafted, and its proof and exactness check as they came out."""
        self.tokens.labels("grafted").inc(result.grafted_tokens)
        self.tokens.labels("computed").inc(result.computed_tokens)
        self.tokens.labels("decoded").inc(result.decode_tokens)
        self.grafts.labels("hit" if result.artifact_ids else "miss").inc()
        if result.proof is not None and result.proof.passed is not None:
            self.proofs.labels("passed" if result.proof.passed else "failed").inc()
        if result.check is not None:
            self.checks.labels("passed" if result.check.exact else "failed").inc()

    def failed(self, exc: KvgraftError) -> None:
        """An answer refused: a failed proof quarantines its artifact (IntegrityError naming the quarantine)."""
        if isinstance(exc, IntegrityError) and "quarantined" in str(exc):
            self.quarantines.inc()
            self.proofs.labels("failed").inc()

    def gate_verdict(self, verdict: str) -> None:
        self.gate.labels(verdict).inc()

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
