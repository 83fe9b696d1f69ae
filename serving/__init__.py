"""kvgraft over HTTP for programs: the OpenAI-compatible API (`openai_api`, its shapes in `openai_shapes`, its
counts in `metrics`), and kvgraft as Ray Serve replicas over one shared store (PostgreSQL catalog + a shared blob
root) with their client.

Modules: `settings` (what a deployment is configured by), `replica` (the Serve deployment and its HTTP
JSON), `health` (what a replica checks before it serves), `launch` (start/stop on local Ray or a
cluster), `client` (the HTTP client and its retry policy), `remote` (a deployment as a library door). Ray is
imported only by `replica` and `launch`, so importing this package costs nothing. It imports no page (`web`).
"""

from .settings import ServeSettings

__all__ = ["ServeSettings"]
