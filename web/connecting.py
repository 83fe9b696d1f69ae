"""The page's start-up when the app fronts a deployment: `RemoteStartup`, one stage, connecting to the deployment,
and `connect`, which polls its health (GET /health, through the remote library's `health`) until it answers healthy.
"""

from __future__ import annotations

import threading
from typing import Protocol

from web.startup import Stage, Startup


class Deployment(Protocol):
    """What connecting needs of a deployment's library: where it is, and one health poll."""

    base_url: str

    def health(self) -> tuple[int, dict]: ...


class RemoteStartup(Startup):
    """The start-up of an app that fronts a deployment: one stage, "connecting to the deployment" (keyed
    "load": a deployment that never becomes healthy reads as a model that is not there)."""

    def __post_init__(self):
        super().__post_init__()
        self._stages = {"load": Stage("load", "connecting to the deployment")}
        self.expected = {"load": 2.0}
        self.basis = "typical figure"

    def note(self, key: str, detail: str) -> None:
        """Show `detail` on a running stage (what the last poll returned) without claiming progress."""
        with self._lock:
            self._stages[key].detail = detail


def connect(remote: Deployment, tracker: RemoteStartup, poll_s: float = 1.0, stop: threading.Event | None = None) -> None:
    """Poll GET /health until the deployment answers healthy, showing each reply in the stage's detail.
    It never gives up (a deployment that comes up later is found); every request is refused until then."""
    stop = stop or threading.Event()
    tracker.begin("load", f"GET {remote.base_url}/health")
    polls = 0
    while True:
        polls += 1
        status, payload = remote.health()
        if status == 200 and payload.get("healthy"):
            tracker.finish(
                "load",
                f"healthy: replica {payload.get('replica', '?')}, {payload.get('store_artifacts')} artifacts, "
                f"catalog version {payload.get('catalog_version')}, model {str(payload.get('model_fingerprint', ''))[:16]}",
            )
            return
        shown = f"HTTP {status}" if status else "no answer"
        tracker.note("load", f"poll {polls}: {shown}: {'; '.join(payload.get('problems') or ['not healthy'])}")
        if stop.wait(poll_s):
            return


def start_connecting(remote: Deployment, tracker: RemoteStartup, poll_s: float = 1.0) -> threading.Thread:
    t = threading.Thread(target=connect, args=(remote, tracker, poll_s), name="kvgraft-connect", daemon=True)
    t.start()
    return t
