"""kvgraft's web app: a Gradio Blocks front end, thin over `services`.

`build_app` assembles one small builder per tab; each callback calls one `Library` (or `services`)
function and formats its result (HTML, tables, matplotlib figures); it knows nothing about torch or SQL. Every
model handler checks its caller's authority and bounds first and then holds the model through
`access.guard` (one request at a time, fairly between sessions and addresses; reads of the catalog run
beside it). Named API endpoints for `gradio_client`: `/answer`, `/deposit`, `/verify`, `/export`, `/import`,
`/delete`. Who may ask and how much is the edge's (`access`): the admin token, the fair turns, the admission at
the queue's join, the per-address rate, the upload gate and the body checks, which `serve` puts in front.

It knows nothing about the OpenAI-compatible API: the entry (`server.py`, what `python app.py` runs) mounts that
on the same port through `serve`'s `mounts`, over the same library, guard and admission (`PageParts`), and starts
the model behind the page.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import gradio as gr  # noqa: E402
from starlette.middleware import Middleware  # noqa: E402

import services  # noqa: E402
import settings  # noqa: E402
from access import uploads  # noqa: E402
from access.admission import Admission  # noqa: E402
from access.arrivals import BodyDeadline  # noqa: E402
from access.bodies import TextGate, text_problem  # noqa: E402
from access.guard import ADMIN_HELP, FairTurns, Guard, address_depth, per_address  # noqa: E402
from access.limiter import JoinLimiter  # noqa: E402
from errors import KvgraftError, VerificationFailed  # noqa: E402  (types, not the engine)
from services.limits import ANON_REPORT_SAMPLES, anon_max_new_tokens, decode_together  # noqa: E402
from web import (
    hosting,  # noqa: E402
    joins,  # noqa: E402
)
from web.dashboard_tab import dashboard_tab  # noqa: E402
from web.handlers import MODEL_WORKERS  # noqa: E402
from web.handlers import answer_options as _answer_options  # noqa: E402
from web.handlers import call as _call  # noqa: E402
from web.handlers import exactness_report as _exactness_report  # noqa: E402
from web.handlers import model_turn as _model  # noqa: E402
from web.hosting import Hosting  # noqa: E402
from web.library_tab import library_tab, table_rows  # noqa: E402
from web.refusal import Refusal, quiet_checks, require_text  # noqa: E402
from web.solve_tab import solve_tab  # noqa: E402
from web.startup import StartingLibrary, Startup, status_html  # noqa: E402
from web.views import (  # noqa: E402
    evidence_html,
    evidence_summary,
    input_problem,
    shown,
    verify_plot,
    verify_summary,
    warn,
)

log = logging.getLogger("kvgraft.app")

HERE = Path(__file__).resolve().parents[1]  # the checkout: static/ and datasets/ sit at its root
STATIC = HERE / "static"
QUEUE_MAX = 256  # over-quota requests are refused in microseconds, so a deep queue drains fast
VERIFIERS = ["exact", "numeric", "sympy", "attested"]


# ---- the built-in library ------------------------------------------------------------------


# The built-in library: one implementation in services/seed.py (the CLI's `seed` and `verify` use it too).


# ---- the app ------------------------------------------------------------------------------

_DONE = object()


# Uploads are the admin's only (access.uploads, at the edge: Gradio's routes have no per-route auth) and bounded
# per file, per caller, in all and by the disk's free space; Gradio's copies of exports and anything left are
# deleted after an hour. Larger bundles go through `cli.py import`.
MAX_UPLOAD = settings.get("KVGRAFT_MAX_UPLOAD")
CACHE_CLEANUP = (600, 3600)  # Blocks(delete_cache=(every s, older than s))


def launch_kwargs() -> dict:
    """What `launch()` needs besides host and port (Gradio 6 takes css/theme there); uploads bounded."""
    return {"css_paths": [STATIC / "app.css"], "theme": gr.themes.Soft(primary_hue="blue"), "max_file_size": MAX_UPLOAD}


# ---- chat ----------------------------------------------------------------------------------


def _stream_answer(
    library: services.LibraryDoor,
    message: str,
    turn: Callable = contextlib.nullcontext,
    options: services.AnswerOptions = services.DEFAULT_ANSWER,
) -> Iterator[str | services.AnswerResult | Exception]:
    """Run `library.answer` in a thread holding `turn()` (the model, fairly) until it ends, even when the
    reader goes away; yield each newer partial answer text, then the result (or the error)."""
    q: queue.Queue = queue.Queue()
    out: dict = {}

    def work():
        try:
            with turn():
                out["r"] = library.answer(message, options, on_token=q.put)
        except Exception as exc:  # handed to the caller, which keeps the app up
            out["e"] = exc
        finally:
            q.put(_DONE)

    threading.Thread(target=work, daemon=True).start()
    last, done = None, False
    while not done:
        item = q.get()
        done = item is _DONE
        while not done and not q.empty():  # only the newest partial answer matters
            nxt = q.get()
            done = nxt is _DONE
            item = item if done else nxt
        if item is not _DONE and item != last:
            last = item
            yield item
    yield out["e"] if "e" in out else out["r"]


def _not_answered(exc: Exception) -> str:
    if isinstance(exc, KvgraftError):
        return f"Not answered: {exc}"
    log.error("answer failed", exc_info=exc)
    return f"Not answered: internal error ({type(exc).__name__}: {exc}); the app is still running"


def _chat_tab(library: services.LibraryDoor, guard: Guard):
    def chat(message, history, graft, k, max_new, check, compare, admin_token="", request: gr.Request = None):
        problem = text_problem(message, history, admin_token)  # before any work: echoed, it would break the stream
        if problem:
            kept = list(history or []) if text_problem(history) is None else []
            yield [*kept, warn(problem)], gr.skip(), ""
            return
        history = list(history or [])
        try:
            options = _answer_options(guard, request, k, graft, max_new, check, compare, admin_token)
            problem = input_problem(message)
        except KvgraftError as exc:
            options, problem = services.DEFAULT_ANSWER, str(exc)
        if problem:
            if isinstance(message, str) and message.strip():
                history.append({"role": "user", "content": shown(message)})
            history.append(warn(problem))
            yield history, gr.skip(), message
            return
        history += [{"role": "user", "content": shown(message)}, {"role": "assistant", "content": "…"}]
        yield history, gr.skip(), ""
        for item in _stream_answer(library, message, turn=lambda: guard.turn(request), options=options):
            if isinstance(item, str):
                history[-1] = {"role": "assistant", "content": item or "…"}
                yield history, gr.skip(), ""
            elif isinstance(item, Exception):
                history[-1] = warn(_not_answered(item))
                yield history, gr.skip(), ""
            else:
                history[-1] = {"role": "assistant", "content": item.answer or "(empty answer)"}
                title, md = evidence_summary(item)
                history.append({"role": "assistant", "content": md, "metadata": {"title": title, "status": "done"}})
                yield history, evidence_html(item), ""

    with gr.Tab("Chat", id="chat") as tab:
        with gr.Row():
            with gr.Column(scale=3):
                chatbot = gr.Chatbot(label="Chat", height=460, elem_id="kv-chat")
                with gr.Row():
                    box = gr.Textbox(
                        placeholder="Ask a question, e.g. Who founded the town of Velmora?",
                        show_label=False,
                        scale=5,
                        elem_id="kv-question",
                    )
                    send = gr.Button("Ask", variant="primary", scale=1, elem_id="kv-ask")
                with gr.Row():
                    graft = gr.Checkbox(True, label="graft")
                    check = gr.Checkbox(False, label="check exactness (a fresh recomputation)")
                    compare = gr.Checkbox(False, label="compare with no graft (measured)")
                    atok = gr.Textbox(label="admin token (check, compare)", type="password", scale=2)
                with gr.Row():
                    k = gr.Slider(1, services.MAX_K, 3, step=1, label="k (retrieved)")
                    max_new = gr.Slider(1, anon_max_new_tokens(), min(16, anon_max_new_tokens()), step=1, label="max new tokens")
                clear = gr.Button("Clear chat", size="sm")
            with gr.Column(scale=2):
                gr.Markdown("### Evidence")
                evidence = gr.HTML(
                    '<div class="kv-evidence kv-muted">Ask a question to see what was grafted and whether it was exact.</div>',
                    elem_id="kv-evidence",
                )
        inputs, outputs = [box, chatbot, graft, k, max_new, check, compare, atok], [chatbot, evidence, box]
        model = {"concurrency_id": "model", "concurrency_limit": MODEL_WORKERS}
        box.submit(chat, inputs, outputs, api_name="chat", api_visibility="undocumented", **model)
        send.click(chat, inputs, outputs, api_visibility="private", **model)
        clear.click(lambda: ([], ""), None, [chatbot, evidence], api_visibility="private", queue=False)
    return tab


# ---- deposit -------------------------------------------------------------------------------


def _deposit(
    library: services.LibraryDoor, question, solution, answer, verifier, reference, text, title, attested_by, on_progress=None
):
    """A verified item when a question is given, else free text; the service decides everything else."""
    try:
        if question and question.strip():
            item = (question, solution or "", answer or "", verifier or "exact", reference or "")
            return library.deposit_item(*item, title=title or "", admin=True, on_progress=on_progress)
        if text and text.strip():
            return library.deposit_text(
                text, title=title or "", attested_by=attested_by or None, admin=True, on_progress=on_progress
            )
    except VerificationFailed as exc:
        raise Refusal(str(exc)) from None
    except KvgraftError as exc:
        raise Refusal(f"Refused, nothing deposited: {exc}") from None
    raise Refusal("Nothing to deposit: fill in a verified item (question, solution, answer, reference) or free text.")


def _deposit_tab(library: services.LibraryDoor, token: str, guard: Guard) -> gr.Tab:
    def deposit_ui(
        admin_token,
        mode,
        question,
        solution,
        answer,
        verifier,
        reference,
        text,
        title,
        attested_by,
        request: gr.Request,
        progress=gr.Progress(),
    ):
        require_text(admin_token, mode, question, solution, answer, verifier, reference, text, title, attested_by)
        _call(guard.admin, admin_token, request)
        if mode == "verified item":
            text, attested_by = "", ""
        else:
            question = ""
        fields = (question, solution, answer, verifier, reference, text, title, attested_by)
        with _model(guard, request):
            d = _deposit(library, *fields, on_progress=lambda f, m: progress(f, desc=m))
        verb = "Deposited" if d.created else "Already deposited (nothing computed)"
        return (
            f"**{verb}** `{d.id[:16]}…` — {d.tokens} tokens at position {d.start}, {d.bytes:,} bytes, "
            f"{d.kind}, {d.provenance} ({d.verifier}), prefill {d.prefill_s:.2f} s"
            + (f"; gate {d.gate_s:.2f} s, {d.gate_tokens} tokens" if d.gate_tokens else "")
        )

    with gr.Tab("Deposit", id="deposit") as tab:
        if not token:
            gr.Markdown(f"> ⚠️ {ADMIN_HELP}", elem_id="kv-admin-help")
        tok = gr.Textbox(label="admin token", type="password")
        mode = gr.Radio(["verified item", "free text"], value="verified item", label="what to deposit")
        with gr.Group():
            dq = gr.Textbox(label="question")
            ds = gr.Textbox(label="solution (the fact or worked solution)", lines=3)
            with gr.Row():
                da = gr.Textbox(label="answer (optional pre-check; the model's own answer is what is verified)")
                dv = gr.Dropdown(VERIFIERS, value="exact", label="verifier")
                dr = gr.Textbox(label="reference (what the verifier compares the answer with)")
        with gr.Group():
            dt = gr.Textbox(label="free text (fact sheet, document)", lines=5)
            dat = gr.Textbox(label="attested by (optional: marks the text as vouched for)")
        dtitle = gr.Textbox(label="title (optional)")
        dbtn = gr.Button("Deposit", variant="primary")
        dout = gr.Markdown()
        dbtn.click(
            deposit_ui,
            [tok, mode, dq, ds, da, dv, dr, dt, dtitle, dat],
            dout,
            concurrency_id="model",
            concurrency_limit=MODEL_WORKERS,
            api_visibility="private",
        )
    return tab


# ---- verify --------------------------------------------------------------------------------


def _verify_tab(library: services.LibraryDoor, guard: Guard) -> gr.Tab:
    def verify_ui(samples, do_relocate, offset, request: gr.Request, progress=gr.Progress()):
        rep, relocate = _exactness_report(library, guard, request, samples, offset if do_relocate else None, progress=progress)
        return (*verify_summary(rep), verify_plot(rep.rows, relocate))

    with gr.Tab("Verify", id="verify") as tab:
        gr.Markdown(
            "Draw N (artifact, query) pairs from the store and compare the grafted logits with a fresh "
            "recomputation byte for byte. With *relocate*, roots are grafted at another offset (keys re-rotated): "
            "the approximate tier, measured."
        )
        with gr.Row():
            vn = gr.Slider(1, ANON_REPORT_SAMPLES, ANON_REPORT_SAMPLES, step=1, label="samples")
            vrel = gr.Checkbox(False, label="relocate")
            voff = gr.Number(64, precision=0, minimum=0, label="offset")
            vbtn = gr.Button("Run", variant="primary")
        vsum = gr.HTML()
        with gr.Row():
            vtbl = gr.Dataframe(
                headers=["artifact", "query", "byte-equal", "KL", "max |diff|", "argmax", "fresh sha256", "grafted sha256"],
                interactive=False,
            )
            vplot = gr.Plot(label="per sample", show_label=False)
        vbtn.click(
            verify_ui,
            [vn, vrel, voff],
            [vsum, vtbl, vplot],
            concurrency_id="model",
            concurrency_limit=MODEL_WORKERS,
            api_visibility="private",
        )
    return tab


# ---- dashboard -----------------------------------------------------------------------------


# ---- named API endpoints -------------------------------------------------------------------


def _apis(library: services.LibraryDoor, guard: Guard) -> None:
    """`/answer`, `/deposit`, `/verify`: the JSON objects `cli.py ask|deposit|verify --json` print."""

    def answer_api(
        question: str,
        k: int = 3,
        graft: bool = True,
        max_new_tokens: int = 32,
        check: bool = False,
        compare: bool = False,
        admin_token: str = "",
        request: gr.Request = None,
    ) -> dict:
        """Answer a question; returns the same JSON object as `cli.py ask --json`. Without the admin token:
        max_new_tokens <= 32 and no `check` (a fresh recomputation) or `compare` (a no-graft run)."""
        require_text(question, admin_token)
        options = _call(_answer_options, guard, request, k, graft, max_new_tokens, check, compare, admin_token)
        problem = input_problem(question)
        if problem:
            raise Refusal(problem)
        with _model(guard, request):
            result = library.answer(question, options)
        return json.loads(json.dumps(result.to_json(), default=str))

    def deposit_api(
        admin_token: str,
        question: str = "",
        solution: str = "",
        answer: str = "",
        verifier: str = "exact",
        reference: str = "",
        text: str = "",
        title: str = "",
        attested_by: str = "",
        request: gr.Request = None,
    ) -> dict:
        """Deposit a verified item (question/solution/answer/verifier/reference) or free text; admin token required."""
        require_text(admin_token, question, solution, answer, verifier, reference, text, title, attested_by)
        _call(guard.admin, admin_token, request)
        with _model(guard, request):
            return _deposit(library, question, solution, answer, verifier, reference, text, title, attested_by).to_json()

    def verify_api(samples: int = 5, relocate: int | None = None, admin_token: str = "", request: gr.Request = None) -> dict:
        """N-sample exactness check (<= 5 samples without the admin token); with `relocate` the relocation
        experiment at that offset (approximate tier), within the model's context."""
        require_text(admin_token)
        rep, _ = _exactness_report(library, guard, request, samples, relocate, admin_token)
        return json.loads(json.dumps(rep.to_json(every_field=False), default=str))

    model = {"concurrency_id": "model", "concurrency_limit": MODEL_WORKERS}
    gr.api(answer_api, api_name="answer", **model)
    gr.api(deposit_api, api_name="deposit", **model)
    gr.api(verify_api, api_name="verify", **model)


# ---- the app -------------------------------------------------------------------------------


def build_app(
    library: services.LibraryDoor,
    admin_token: str | None = None,
    startup: Startup | None = None,
    where: Hosting | None = None,
    guard: Guard | None = None,
    admission: Admission | None = None,
) -> gr.Blocks:
    """The Blocks app over one Library. `admin_token` defaults to $KVGRAFT_ADMIN_TOKEN (read now);
    `guard` (the admin gate and the fair model turns) defaults to one over that token; `admission` (the model
    requests counted when they join the queue) to one with the guard's per-session and per-address depth.

    With a `startup` tracker the page is built at once and every model
    call says "still starting" until the tracker is ready; without one the model is loaded here, now."""
    token = admin_token if admin_token is not None else settings.get("KVGRAFT_ADMIN_TOKEN")
    # in process, answers run together up to KVGRAFT_DECODE_TOGETHER at once: their prompts and steps share passes
    # (graft_core.batch, same bytes as alone), and everything else that runs the model takes the model lock
    guard = guard or Guard(token, turns=FairTurns(per_address=per_address(), slots=decode_together(), depth=address_depth()))
    tracker = startup
    if tracker is None:
        library.lm  # noqa: B018  (load the model now, not on the first request)
        library.start_decoding_together()
        tracker = Startup.already_done()
    read_only = where is not None and where.read_only
    gated = StartingLibrary(library, tracker)
    reads = {"concurrency_id": "reads", "concurrency_limit": 4, "api_visibility": "private"}

    def status_line():
        snap = tracker.snapshot()
        n = library.count()
        seeded = any(s.key == "seed" and s.state == "done" for s in snap.stages)
        ready = (
            f"Built-in library ready: {n} artifacts. Try: Who founded the town of Velmora?"
            if seeded
            else f"Library: {n} artifacts."
        )
        return status_html(snap, ready), gr.Timer(active=not snap.ready and snap.model_failed is None)

    with gr.Blocks(title="kvgraft", delete_cache=CACHE_CLEANUP) as demo:
        with gr.Row(elem_classes="kv-top"):
            gr.Markdown("## kvgraft · verified knowledge, grafted byte-exact into a frozen model")
            status_md = gr.HTML(elem_id="kv-status")
        for notice in where.notices() if where else []:
            gr.Markdown(f"> ⚠️ {notice}", elem_classes="kv-hosting")
        status_timer = gr.Timer(1.0)
        chat_tab = _chat_tab(gated, guard)
        tabs = [chat_tab]
        if not read_only:
            tabs.append(_deposit_tab(gated, token, guard))
        lib_tab, tbl = library_tab(gated, guard, reads, writable=not read_only)
        ver_tab = _verify_tab(gated, guard)
        sol_tab = solve_tab(gated, guard, HERE / "datasets" / "problems.jsonl")
        dashboard_tab(gated, [*tabs, lib_tab, ver_tab, sol_tab], reads)
        _apis(gated, guard)
        status_timer.tick(status_line, None, [status_md, status_timer], show_progress="hidden", **reads)
        demo.load(status_line, None, [status_md, status_timer], **reads)
        demo.load(lambda: table_rows(library), None, tbl, **reads)

    quiet_checks(demo)  # a value Gradio's own checks refuse is one log line, not a traceback
    demo.queue(default_concurrency_limit=MODEL_WORKERS, max_size=QUEUE_MAX)
    admission = admission or Admission(per_session=guard.turns.per_session, depth=guard.turns.depth)
    joins.install(demo._queue, admission, guard.client, counted=lambda fn: fn.concurrency_id == "model")
    demo.upload_door = uploads.UploadDoor(guard.tokens)  # `serve` puts it in front: the admin's uploads only
    demo.parts = PageParts(gated, guard, admission)  # what another front end on the same port shares (server.py)
    return demo


@dataclass(frozen=True)
class PageParts:
    """What a page shares with a front end served beside it on its port: the library as the page sees it (through
    the start-up), the guard (admin token, fair turns) and the admission counting requests at arrival."""

    library: services.LibraryDoor
    guard: Guard
    admission: Admission


def serve(demo: gr.Blocks, where: Hosting, joins: tuple[float, int] | None = None, mounts: list = (), **launch) -> None:
    """Launch `demo` where `hosting` says: the client address of a request is its socket's peer, unless that
    peer is one of `where.proxies` (then uvicorn takes the nearest X-Forwarded-For hop that is not a proxy),
    and every page's root is `where.root`, never the Host header a request claims. Gradio builds uvicorn's
    Config without forwarded_allow_ips, so uvicorn reads FORWARDED_ALLOW_IPS (default: trust 127.0.0.1) as
    `launch` makes it: it is set here, to exactly the configured proxies ("" trusts no peer). Every request
    body passes `TextGate` first, after the per-address `JoinLimiter` (`joins`: its rate a second and burst,
    KVGRAFT_JOINS_PER_S / KVGRAFT_JOINS_BURST unless given) and the upload door (`access.uploads.UploadGate`: an
    upload is the admin's, refused before its body is read otherwise, and bounded while it streams), and every body
    within `access.arrivals.BodyDeadline`'s time and per-address count of bodies arriving. `mounts`
    (starlette Middleware) sit right after the limiter: other front ends on this port (the entry's /v1 and
    /metrics), rate-limited as the page is and with their own bounds."""
    os.environ["FORWARDED_ALLOW_IPS"] = ",".join(where.proxies)
    rate, burst = joins or (settings.get("KVGRAFT_JOINS_PER_S"), settings.get("KVGRAFT_JOINS_BURST"))
    limiter = Middleware(JoinLimiter, rate=rate, burst=burst)
    door = getattr(demo, "upload_door", None)  # a Blocks not made by build_app has none: every upload is refused
    gate = Middleware(uploads.UploadGate, door=door, secure=where.root.startswith("https://"))
    # outermost the per-address rate of work requests and uploads, then the deadline of a body's arrival (and how
    # many may be arriving per address), then what is mounted beside the page (its own bounds), then the upload door (the admin's only, before a byte is read), then text that cannot be encoded or
    # files by URL, before Gradio parses them
    edge = {"middleware": [limiter, Middleware(BodyDeadline), *mounts, gate, Middleware(TextGate)]}
    launch = {"server_name": where.host, "server_port": where.port, "root_path": where.root, "app_kwargs": edge, **launch}
    demo.launch(**launch)


def server_address() -> tuple[str, int]:
    """Host and port from Gradio's own variables; loopback unless the operator (or a Space) says otherwise."""
    where = hosting.detect()
    return where.host, where.port
