"""The one process `python app.py` runs: the page (`web`), the OpenAI-compatible API and /metrics (`serving`) on one
port, over one library (this process's store and model, or a deployment's replicas when KVGRAFT_BACKEND_URL is set)
and one edge (`access`: the guard, the admission, the rate and the gates) that both front ends share.

The only module that imports both front ends; neither imports the other. `build` is the page with the API beside it,
`serve` launches it, `main` is the whole start: the placeholder hands the port over, the model loads behind the page.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from starlette.middleware import Middleware

import services
import settings
from access.guard import FairTurns, Guard, address_depth, backend_slots, per_address
from services import seed
from services.limits import warm_proofs_limit
from serving import openai_api
from web import app as page
from web import hosting, memory, placeholder
from web.startup import Startup, TerminalProgress, model_cache
from web.startup import start as start_up

if TYPE_CHECKING:
    import gradio as gr

log = logging.getLogger("kvgraft.app")


def build(library: services.LibraryDoor, **kwargs) -> gr.Blocks:
    """The page over `library` (`web.app.build_app`'s arguments) with the OpenAI-compatible API beside it, over the
    same library (as the page sees it, through the start-up), guard and admission: an API request is admitted,
    bounded and turned exactly as a chat is."""
    demo = page.build_app(library, **kwargs)
    parts = demo.parts
    demo.openai = openai_api.OpenAIServer(parts.library, parts.guard, parts.admission)
    return demo


def serve(demo: gr.Blocks, where: hosting.Hosting, joins: tuple[float, int] | None = None, **launch) -> None:
    """`web.app.serve` with the API (`/v1/...`, `/metrics`) mounted on the page's port when `build` made `demo`."""
    api = getattr(demo, "openai", None)
    mounts = [Middleware(openai_api.OpenAIDoor, server=api)] if api is not None else []
    page.serve(demo, where, joins=joins, mounts=mounts, **launch)


def main(boot: placeholder.Placeholder | placeholder._NotServing = placeholder.NOT_SERVING, t0: float | None = None) -> None:
    """Serve the app; `boot` is the placeholder page the entry point (app.py) started before Gradio imported,
    `t0` the moment that entry point started ("page served after N s" counts from it)."""
    t0 = time.perf_counter() if t0 is None else t0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    where = hosting.detect()
    hosting.apply(where)
    memory.start_trimmer()  # long prompts' freed activations go back to the OS, not kept by glibc's arenas
    if boot is placeholder.NOT_SERVING:
        print(placeholder.url_line(where), flush=True)
    boot.stage("building the page")
    backend = settings.get("KVGRAFT_BACKEND_URL")  # without a trailing slash; the front end of a deployment (docs/SCALING.md)
    warm = 0 if backend else warm_proofs_limit()  # a bad KVGRAFT_WARM_PROOFS stops the start here, before the page
    if backend:
        from serving import remote  # no torch, no store: every call goes to the replicas over HTTP
        from web import connecting

        library, tracker = remote.RemoteLibrary(backend, admin_token=where.admin_token), connecting.RemoteStartup()
        turns = FairTurns(per_address=per_address(), slots=backend_slots(), depth=address_depth())
        guard = Guard(where.admin_token or "", turns=turns)
    else:
        library, tracker, guard = services.Library(), Startup.remembered(model_cache()), None
    demo = build(library, admin_token=where.admin_token, startup=tracker, where=where, guard=guard)
    launch = dict(prevent_thread_lock=True, quiet=True, **page.launch_kwargs())
    log.info("client addresses: the socket's peer; X-Forwarded-For believed from %s", ", ".join(where.proxies) or "no proxy")
    placeholder.hand_over(boot, where, lambda: serve(demo, where, **launch))
    wall, cpu = time.perf_counter() - t0, time.process_time()  # CPU seconds: the part a busy machine does not inflate
    print(f"kvgraft: page served at {where.url} after {wall:.1f} s ({cpu:.1f} s of CPU); store {library.home}", flush=True)
    if backend:
        connecting.start_connecting(library, tracker)
    else:
        start_up(library, tracker, seed=seed.bring_in, remember_in=model_cache(), warm=warm)
    TerminalProgress(tracker).start()
    demo.block_thread()
