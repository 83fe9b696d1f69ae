"""What the web app's tests share: a free loopback port, a tiny-model store holding one attested fact, and the
app served as it is behind a proxy on loopback (each client's X-Forwarded-For is its address), through
`server.serve`, the launch the product uses (the page, and the API when `server.build` made it)."""

from __future__ import annotations

import dataclasses
import socket

# The per-address rate of work requests (access.limiter.JoinLimiter) lifted, for the servers of tests that send
# many requests from one address on purpose (fairness, edges) or quickly (a fast machine's sequential calls);
# the limiter itself is tested on its own (tests/test_admission.py), served and unserved.
UNLIMITED_JOINS = (1e6, 10**6)
LOOPBACK_PROXY = ("127.0.0.1/32",)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def attested_store(tmp_path_factory, lm, name: str, fact: str, title: str):
    """A store of its own under pytest's temp folder, the hash embedder, and `fact` deposited as attested."""
    import services
    from retrieval import HashEmbedder

    lib = services.Library(home=tmp_path_factory.mktemp(name), lm=lm, embedder=HashEmbedder())
    lib.deposit_text(fact, title=title, attested_by="test", admin=True)
    return lib


def serve(demo, proxies: tuple[str, ...] = LOOPBACK_PROXY, joins: tuple[float, int] = UNLIMITED_JOINS, **launch) -> None:
    """Launch `demo` on a free loopback port through `server.serve`, believing X-Forwarded-For from `proxies`."""
    import server
    from web import hosting

    where = dataclasses.replace(hosting.detect({}), host="127.0.0.1", port=free_port(), proxies=proxies)
    server.serve(demo, where, joins=joins, prevent_thread_lock=True, quiet=True, **launch)
