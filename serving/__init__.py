"""kvgraft as Ray Serve replicas over one shared store (PostgreSQL catalog + a shared blob root).

Modules: `settings` (what a deployment is configured by), `replica` (the Serve deployment and its HTTP
JSON), `health` (what a replica checks before it serves), `launch` (start/stop on local Ray or a
cluster), `client` (the HTTP client and its retry policy). Ray is imported only by `replica` and
`launch`, so importing this package costs nothing.
"""

from .settings import ServeSettings

__all__ = ["ServeSettings"]
