"""What a Ray Serve deployment of kvgraft is configured by: the shared store, the model, the replica
bounds (fixed count or autoscaling), graceful drain and health-check timing, read from the environment.

Knows nothing about Ray itself beyond the names of its deployment options (see `deployment_options`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path

import settings
from errors import InvalidInput, InvalidSetting

_EMBEDDER = settings.SETTINGS["KVGRAFT_SERVE_EMBEDDER"]
EMBEDDERS = _EMBEDDER.choices  # "hash": the deterministic test double of retrieval/embedder.py, tests only


@dataclass(frozen=True)
class ServeSettings:
    """One deployment. `replicas` set: exactly that many; None: Ray autoscales between `min_replicas` and
    `max_replicas`, aiming at `target_ongoing_requests` per replica."""

    db_url: str  # the shared catalog (postgresql+psycopg://... across machines)
    blob_root: Path  # the shared blob folder every replica can read (a shared filesystem across machines)
    state_root: Path  # per-replica local state (FAISS index cache) lives in <state_root>/<replica id>
    model: str | None = None  # KVGRAFT_MODEL semantics; None: the packaged Gemma 3 270M
    admin_token: str = ""  # deposits over HTTP need it; empty: deposits are refused
    embedder: str = "minilm"
    replicas: int | None = None
    min_replicas: int = 1
    max_replicas: int = 4
    target_ongoing_requests: float = 1.0
    max_ongoing_requests: int = 2  # per replica; the model runs one request at a time, the router queues the rest
    graceful_shutdown_wait_loop_s: float = 2.0  # drain: how often a stopping replica checks for requests left
    graceful_shutdown_timeout_s: float = 120.0  # drain: how long a stopping replica may finish what it holds
    health_check_period_s: float = 10.0
    health_check_timeout_s: float = 30.0
    body_read_s: float = 30.0  # a request's body must arrive whole this long after it began (access.arrivals)
    replica_cpus: float = 1.0  # Ray CPUs reserved per replica
    threads: int | None = None  # KVGRAFT_THREADS inside the replicas; None: inherited (default 2). Part of the
    # model fingerprint: replicas must compute with the thread count the store's artifacts were made with
    host: str = "127.0.0.1"
    port: int = 8000
    app_name: str = "kvgraft"
    route_prefix: str = "/"

    @classmethod
    def from_env(cls, **overrides) -> ServeSettings:
        """Settings from KVGRAFT_* variables (see docs/SCALING.md), then `overrides` (None values ignored)."""
        home = settings.get("KVGRAFT_HOME")
        base = cls(
            db_url=settings.get("KVGRAFT_DB_URL") or f"sqlite:///{home / 'catalog.sqlite3'}",
            blob_root=settings.get("KVGRAFT_BLOB_ROOT", default=home / "blobs"),
            state_root=settings.get("KVGRAFT_REPLICA_STATE"),
            model=settings.get("KVGRAFT_MODEL"),
            admin_token=settings.get("KVGRAFT_ADMIN_TOKEN"),
            embedder=settings.get("KVGRAFT_SERVE_EMBEDDER"),
            replicas=settings.get("KVGRAFT_SERVE_REPLICAS") or None,
            min_replicas=settings.get("KVGRAFT_SERVE_MIN_REPLICAS"),
            max_replicas=settings.get("KVGRAFT_SERVE_MAX_REPLICAS"),
            target_ongoing_requests=settings.get("KVGRAFT_SERVE_TARGET_ONGOING"),
            max_ongoing_requests=settings.get("KVGRAFT_SERVE_MAX_ONGOING"),
            graceful_shutdown_timeout_s=settings.get("KVGRAFT_SERVE_DRAIN_S"),
            health_check_period_s=settings.get("KVGRAFT_SERVE_HEALTH_PERIOD_S"),
            replica_cpus=settings.get("KVGRAFT_SERVE_REPLICA_CPUS"),
            threads=settings.get("KVGRAFT_SERVE_THREADS") or None,
            host=settings.get("KVGRAFT_SERVE_HOST"),
            port=settings.get("KVGRAFT_SERVE_PORT"),
        )
        return base.with_(**overrides)

    def with_(self, **overrides) -> ServeSettings:
        s = replace(self, **{k: v for k, v in overrides.items() if v is not None})
        s.check()
        return s

    def check(self) -> None:
        if self.embedder not in EMBEDDERS:
            raise InvalidSetting(f"{_EMBEDDER.name} must be {_EMBEDDER.what()}, got {self.embedder!r}")
        if self.replicas is not None and self.replicas < 1:
            raise InvalidInput(f"--replicas must be at least 1, got {self.replicas}")
        if not 0 <= self.min_replicas <= self.max_replicas:
            raise InvalidInput(
                f"autoscaling bounds need 0 <= min_replicas <= max_replicas, got {self.min_replicas} and {self.max_replicas}"
            )

    def deployment_options(self) -> dict:
        """Keyword arguments for `Deployment.options`: replica count or autoscaling, drain, health checks,
        resources, and the environment each replica process starts with."""
        opts = {
            "max_ongoing_requests": self.max_ongoing_requests,
            "graceful_shutdown_wait_loop_s": self.graceful_shutdown_wait_loop_s,
            "graceful_shutdown_timeout_s": self.graceful_shutdown_timeout_s,
            "health_check_period_s": self.health_check_period_s,
            "health_check_timeout_s": self.health_check_timeout_s,
            "ray_actor_options": {
                "num_cpus": self.replica_cpus,
                "runtime_env": {
                    "env_vars": {
                        "HF_HUB_OFFLINE": "1",
                        "TRANSFORMERS_OFFLINE": "1",
                        "TOKENIZERS_PARALLELISM": "false",
                    }
                },
            },
        }
        if self.threads is not None:
            opts["ray_actor_options"]["runtime_env"]["env_vars"]["KVGRAFT_THREADS"] = str(self.threads)
        if self.replicas is not None:
            opts["num_replicas"] = self.replicas
        else:
            opts["autoscaling_config"] = {
                "min_replicas": self.min_replicas,
                "max_replicas": self.max_replicas,
                "target_ongoing_requests": self.target_ongoing_requests,
            }
        return opts

    def public(self) -> dict:
        """The settings without the admin token (for logs and /health)."""
        d = asdict(self)
        d["admin_token"] = "set" if self.admin_token else ""
        d["db_url"] = _redact(self.db_url)
        return {k: str(v) if isinstance(v, Path) else v for k, v in d.items()}


def _redact(url: str) -> str:
    """A catalog URL without its password."""
    head, sep, tail = url.partition("://")
    if not sep or "@" not in tail:
        return url
    cred, at, rest = tail.rpartition("@")
    user = cred.split(":", 1)[0]
    return f"{head}://{user}:***@{rest}" if ":" in cred else url
