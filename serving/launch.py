"""Starting and stopping the deployment: a local Ray instance by default, an existing cluster by address.

`start` returns once every replica has loaded its model and passed its first health check; `stop`
drains (each replica finishes what it holds, up to graceful_shutdown_timeout_s) and shuts Serve down.
"""

from __future__ import annotations

import os
import signal
import threading
from dataclasses import asdict
from pathlib import Path

from .settings import ServeSettings

ROOT = Path(__file__).resolve().parents[1]  # the checkout replicas import kvgraft from


def _replica_settings(settings: ServeSettings) -> dict:
    """The settings as plain values (what crosses into the replica processes)."""
    return {k: str(v) if isinstance(v, Path) else v for k, v in asdict(settings).items()}


def start(settings: ServeSettings, address: str | None = None, num_cpus: int | None = None) -> str:
    """Deploy `settings.replicas` replicas (or the autoscaling bounds) and return the base URL.

    address None: a local Ray instance with `num_cpus` (default: this machine's); else the cluster at
    `address` ("auto" or "ray://host:10001"), where every node needs this checkout at the same path."""
    import ray
    from ray import serve

    from .replica import Replica

    settings.blob_root.mkdir(parents=True, exist_ok=True)
    if not ray.is_initialized():
        _init_ray(address, num_cpus)
    serve.start(http_options={"host": settings.host, "port": settings.port})
    opts = settings.deployment_options()
    env = opts["ray_actor_options"]["runtime_env"]["env_vars"]
    env["PYTHONPATH"] = os.pathsep.join(x for x in (str(ROOT), os.environ.get("PYTHONPATH", "")) if x)
    app = Replica.options(**opts).bind(_replica_settings(settings))
    serve.run(app, name=settings.app_name, route_prefix=settings.route_prefix)
    return f"http://{settings.host}:{settings.port}{settings.route_prefix.rstrip('/')}"


def _init_ray(address: str | None, num_cpus: int | None, attempts: int = 3) -> None:
    """Connect to `address` or start a local instance. Ray gives its raylet 30 s to register, which a
    loaded machine can miss; a fresh attempt then usually succeeds, so try a few times."""
    import ray

    for attempt in range(1, attempts + 1):
        try:
            if address:
                ray.init(address=address, log_to_driver=False)
            else:
                ray.init(num_cpus=num_cpus or os.cpu_count(), include_dashboard=False, log_to_driver=False)
            return
        except Exception as e:  # Ray raises a bare Exception for a node that did not come up in time
            ray.shutdown()
            if attempt == attempts or "timed out during startup" not in str(e):
                raise


def stop(shutdown_ray: bool = True) -> None:
    """Drain and remove the deployment, then (by default) disconnect from or stop Ray."""
    import ray
    from ray import serve

    serve.shutdown()
    if shutdown_ray:
        ray.shutdown()


def serve_forever(settings: ServeSettings, address: str | None = None, num_cpus: int | None = None) -> None:
    """`kvgraft serve`: start, print where, wait for Ctrl-C or SIGTERM, then drain and stop."""
    url = start(settings, address=address, num_cpus=num_cpus)
    shape = (
        f"{settings.replicas} replicas"
        if settings.replicas
        else f"{settings.min_replicas}-{settings.max_replicas} replicas (autoscaling)"
    )
    print(
        f"kvgraft serve: {shape} at {url} (POST /answer /deposit /verify, GET /library /health); Ctrl-C drains and stops",
        flush=True,
    )
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    try:
        while not done.wait(1.0):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        print("kvgraft serve: draining", flush=True)
        stop(shutdown_ray=True)
