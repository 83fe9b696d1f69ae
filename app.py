"""kvgraft's web app: a Gradio Blocks front end, thin over `services`.

`build_app` assembles one small builder per tab; each callback calls one `Library` (or `maintenance`)
function and formats its result (HTML, tables, matplotlib figures); it knows nothing about torch or SQL. The model runs one request at a time behind
Gradio's queue (every model event shares the concurrency group "model"; reads of the catalog run
beside it). Named API endpoints for `gradio_client`: `/answer`, `/deposit`, `/verify`.

Run `python app.py` (host/port from GRADIO_SERVER_NAME / GRADIO_SERVER_PORT, store from
KVGRAFT_HOME, deposits enabled by KVGRAFT_ADMIN_TOKEN). An empty store is seeded with the built-in
verified library in `library_seed/` at startup.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import queue
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import gradio as gr  # noqa: E402

import maintenance  # noqa: E402
import services  # noqa: E402
from app_views import (  # noqa: E402
    LIBRARY_HEADERS,
    esc,
    evidence_html,
    evidence_summary,
    input_problem,
    library_table,
    shown,
    speedup_plot,
    stats_html,
    store_plot,
    tokens_plot,
    verify_plot,
    verify_summary,
    warn,
)
from errors import KvgraftError, VerificationFailed  # noqa: E402  (types, not the engine)

log = logging.getLogger("kvgraft.app")

HERE = Path(__file__).resolve().parent
SEED_DIR = HERE / "library_seed"
STATIC = HERE / "static"
QUEUE_MAX = 64
VERIFIERS = ["exact", "numeric", "sympy", "attested"]
ADMIN_HELP = (
    "Deposits are disabled: no admin token is configured. Set the environment variable "
    "`KVGRAFT_ADMIN_TOKEN` to a secret and restart the app (`KVGRAFT_ADMIN_TOKEN=... python app.py`)."
)


# ---- the built-in library ------------------------------------------------------------------


class SeedStatus:
    """What the startup seeding is doing, for the status line (thread-safe enough: one writer)."""

    def __init__(self, message: str = "", done: bool = True):
        self.message, self.done, self.fraction = message, done, 1.0 if done else 0.0

    def update(self, fraction: float, message: str, done: bool = False) -> None:
        self.fraction, self.message, self.done = fraction, message, done
        log.info("seed: %s", message)


def seed_items(folder: Path = SEED_DIR) -> tuple[list[dict], list[tuple[str, str]]]:
    """The verified items (items.jsonl) and the fact sheets (*.txt: (title, text)) of a seed folder."""
    items = [json.loads(line) for line in (folder / "items.jsonl").read_text(encoding="utf-8").splitlines() if line.strip()]
    sheets = [(p.stem, p.read_text(encoding="utf-8")) for p in sorted(folder.glob("*.txt"))]
    return items, sheets


def seed_library(
    library: services.Library, folder: Path = SEED_DIR, on_progress: Callable[[float, str], None] | None = None
) -> int:
    """Deposit the built-in library, each item through the deposit gate (an item the model does not
    answer correctly with its graft is refused, logged and left out); returns how many were new."""
    progress = on_progress or (lambda f, m: None)
    items, sheets = seed_items(folder)
    total, created = len(items) + len(sheets), 0
    for i, it in enumerate(items):
        progress(i / total, f"seeding the built-in library: {i + 1}/{total} {it['question']}")
        try:
            created += library.deposit_item(**it).created
        except VerificationFailed as e:
            log.warning("seed item refused by the gate: %s", e)
    for j, (title, text) in enumerate(sheets, start=len(items)):
        progress(j / total, f"seeding the built-in library: {j + 1}/{total} fact sheet '{title}'")
        created += library.deposit_text(text, title=title, attested_by="kvgraft built-in library", admin=True).created
    progress(1.0, f"built-in library ready: {total} artifacts ({created} new)")
    return created


# ---- the app ------------------------------------------------------------------------------

_DONE = object()


MAX_UPLOAD = "4gb"  # a bundle upload; bundle import applies its own per-member and total limits after


def launch_kwargs() -> dict:
    """What `launch()` needs besides host and port (Gradio 6 takes css/theme there); uploads bounded."""
    return {"css_paths": [STATIC / "app.css"], "theme": gr.themes.Soft(primary_hue="blue"), "max_file_size": MAX_UPLOAD}


def _admin_check(token: str) -> Callable[[str | None], None]:
    """A guard each admin handler calls first: refuses unless `given` equals the configured token."""

    def admin_ok(given: str | None) -> None:
        if not token:
            raise gr.Error(ADMIN_HELP)
        if not isinstance(given, str) or not hmac.compare_digest(given.encode(), token.encode()):
            raise gr.Error("Admin token refused: give the value of KVGRAFT_ADMIN_TOKEN set on the server.")

    return admin_ok


def _call(fn: Callable, *args, **kwargs):
    """Run one service call; a kvgraft error becomes the message the user sees."""
    try:
        return fn(*args, **kwargs)
    except KvgraftError as exc:
        raise gr.Error(str(exc)) from None


# ---- chat ----------------------------------------------------------------------------------


def _stream_answer(library: services.Library, message: str, **options) -> Iterator[str | services.AnswerResult | Exception]:
    """Run `library.answer` in a thread; yield each newer partial answer text, then the result (or the error)."""
    q: queue.Queue = queue.Queue()
    out: dict = {}

    def work():
        try:
            out["r"] = library.answer(message, on_token=q.put, **options)
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


def _chat_tab(library: services.Library):
    def chat(message, history, graft, k, max_new, check, compare):
        history = list(history or [])
        problem = input_problem(message)
        if problem:
            if isinstance(message, str) and message.strip():
                history.append({"role": "user", "content": shown(message)})
            history.append(warn(problem))
            yield history, gr.skip(), message
            return
        history += [{"role": "user", "content": shown(message)}, {"role": "assistant", "content": "…"}]
        yield history, gr.skip(), ""
        options = dict(k=int(k), graft=bool(graft), max_new_tokens=int(max_new), check=bool(check), compare=bool(compare))
        for item in _stream_answer(library, message, **options):
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
                    check = gr.Checkbox(True, label="check exactness")
                    compare = gr.Checkbox(False, label="compare with no graft (measured)")
                with gr.Row():
                    k = gr.Slider(1, services.MAX_K, 3, step=1, label="k (retrieved)")
                    max_new = gr.Slider(1, 128, 32, step=1, label="max new tokens")
                clear = gr.Button("Clear chat", size="sm")
            with gr.Column(scale=2):
                gr.Markdown("### Evidence")
                evidence = gr.HTML(
                    '<div class="kv-evidence kv-muted">Ask a question to see what was grafted and whether it was exact.</div>',
                    elem_id="kv-evidence",
                )
        inputs, outputs = [box, chatbot, graft, k, max_new, check, compare], [chatbot, evidence, box]
        box.submit(chat, inputs, outputs, concurrency_id="model", api_name="chat", api_visibility="undocumented")
        send.click(chat, inputs, outputs, concurrency_id="model", api_visibility="private")
        clear.click(lambda: ([], ""), None, [chatbot, evidence], api_visibility="private", queue=False)
    return tab


# ---- deposit -------------------------------------------------------------------------------


def _deposit(
    library: services.Library, question, solution, answer, verifier, reference, text, title, attested_by, on_progress=None
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
        raise gr.Error(str(exc)) from None
    except KvgraftError as exc:
        raise gr.Error(f"Refused, nothing deposited: {exc}") from None
    raise gr.Error("Nothing to deposit: fill in a verified item (question, solution, answer, reference) or free text.")


def _deposit_tab(library: services.Library, token: str, admin_ok) -> gr.Tab:
    def deposit_ui(
        admin_token, mode, question, solution, answer, verifier, reference, text, title, attested_by, progress=gr.Progress()
    ):
        admin_ok(admin_token)
        if mode == "verified item":
            text, attested_by = "", ""
        else:
            question = ""
        fields = (question, solution, answer, verifier, reference, text, title, attested_by)
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
            deposit_ui, [tok, mode, dq, ds, da, dv, dr, dt, dtitle, dat], dout, concurrency_id="model", api_visibility="private"
        )
    return tab


# ---- library -------------------------------------------------------------------------------


def _table(library: services.Library, search: str = "") -> list[list]:
    return library_table(library.entries(query=(search or "").strip(), limit=500))


def _show(library: services.Library, ref: str) -> tuple[str, dict]:
    ref = (ref or "").strip()
    if not ref:
        return "", {}
    r = _call(library.show, ref).to_json()
    return r["source"]["text"], {"artifact": r["artifact"], "chain": r["chain"], "verifications": r["verifications"]}


def _upkeep(library: services.Library, admin_ok):
    """The export, import and delete handlers of the Library tab."""

    def export_bundle(ref: str):
        ids = [s.strip() for s in (ref or "").replace(",", " ").split() if s.strip()] or library.artifact_ids()
        if not ids:
            raise gr.Error("The store is empty: nothing to export.")
        out = Path(tempfile.mkdtemp(prefix="kvgraft-export-")) / f"kvgraft-bundle-{time.strftime('%Y%m%d-%H%M%S')}.tar"
        rep = _call(maintenance.export_bundle, library, ids, out)
        return (
            rep.path,
            f"Exported {len(rep.artifacts)} artifacts, {rep.bytes:,} bytes, bundle sha256 `{rep.bundle_sha256[:16]}…`",
        )

    def import_bundle(admin_token, file):
        admin_ok(admin_token)
        if not file:
            raise gr.Error("Choose a bundle file to import.")
        rep = _call(maintenance.import_bundle, library, Path(file if isinstance(file, str) else file.name))
        return f"Imported {len(rep.artifacts)} artifacts ({len(rep.new)} new, {rep.blobs_written} blobs written).", _table(
            library
        )

    def delete_artifact(admin_token, ref):
        admin_ok(admin_token)
        if not (ref or "").strip():
            raise gr.Error("Select an artifact (click a row) or paste its id first.")
        rep = _call(library.delete, ref.strip())
        return f"Deleted `{rep.id[:16]}…` (blob {'removed' if rep.blob_removed else 'kept: still referenced'}).", _table(library)

    return export_bundle, import_bundle, delete_artifact


def _library_tab(library: services.Library, admin_ok, reads: dict) -> tuple[gr.Tab, gr.Dataframe]:
    export_bundle, import_bundle, delete_artifact = _upkeep(library, admin_ok)

    def pick(evt: gr.SelectData, data):
        rid = evt.row_value[0] if evt.row_value else ""
        return (rid, *_show(library, rid))

    with gr.Tab("Library", id="library") as tab:
        with gr.Row():
            search = gr.Textbox(placeholder="search titles and text", show_label=False, scale=4)
            refresh = gr.Button("Search", scale=1)
        tbl = gr.Dataframe(headers=LIBRARY_HEADERS, interactive=False, wrap=True, elem_id="kv-library")
        sel = gr.Textbox(label="selected artifact id (click a row, or paste an id or prefix)")
        with gr.Row():
            src_text = gr.Textbox(label="deposited text", lines=8)
            manifest = gr.JSON(label="manifest (row, chain, verifier record)")
        with gr.Accordion("Export / import / delete", open=False):
            with gr.Row():
                exp_btn = gr.Button("Export bundle (selected id, or all when empty)")
                exp_file = gr.File(label="bundle")
            ltok = gr.Textbox(label="admin token (import, delete)", type="password")
            with gr.Row():
                imp_file = gr.File(label="bundle to import", type="filepath")
                imp_btn = gr.Button("Import")
                del_btn = gr.Button("Delete selected", variant="stop")
            lout = gr.Markdown()
        table = lambda search="": _table(library, search)  # noqa: E731
        refresh.click(table, search, tbl, **reads)
        search.submit(table, search, tbl, **reads)
        tab.select(table, search, tbl, **reads)
        tbl.select(pick, tbl, [sel, src_text, manifest], **reads)
        sel.submit(lambda ref: _show(library, ref), sel, [src_text, manifest], **reads)
        admin = {"concurrency_id": "model", "api_visibility": "undocumented"}
        exp_btn.click(export_bundle, sel, [exp_file, lout], api_name="export", **admin)
        imp_btn.click(import_bundle, [ltok, imp_file], [lout, tbl], api_name="import", **admin)
        del_btn.click(delete_artifact, [ltok, sel], [lout, tbl], api_name="delete", **admin)
    return tab, tbl


# ---- verify --------------------------------------------------------------------------------


def _verify_tab(library: services.Library) -> gr.Tab:
    def verify_ui(samples, do_relocate, offset, progress=gr.Progress()):
        relocate = int(offset) if do_relocate else None
        rep = _call(library.verify_samples, int(samples), relocate=relocate, on_progress=lambda f, m: progress(f, desc=m))
        return (*verify_summary(rep), verify_plot(rep.rows, relocate))

    with gr.Tab("Verify", id="verify") as tab:
        gr.Markdown(
            "Draw N (artifact, query) pairs from the store and compare the grafted logits with a fresh "
            "recomputation byte for byte. With *relocate*, roots are grafted at another offset (keys re-rotated): "
            "the approximate tier, measured."
        )
        with gr.Row():
            vn = gr.Slider(1, 100, 10, step=1, label="samples")
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
        vbtn.click(verify_ui, [vn, vrel, voff], [vsum, vtbl, vplot], concurrency_id="model", api_visibility="private")
    return tab


# ---- dashboard -----------------------------------------------------------------------------


def _dashboard(library: services.Library):
    s = library.stats()
    return stats_html(s), tokens_plot(s.recent), speedup_plot(s.recent), store_plot(s.store_tokens, s.window)


def _dashboard_tab(library: services.Library, other_tabs: list[gr.Tab], reads: dict) -> None:
    dashboard = lambda: _dashboard(library)  # noqa: E731
    with gr.Tab("Dashboard", id="dashboard") as tab:
        stats = gr.HTML(elem_id="kv-stats")
        with gr.Row():
            p_tokens = gr.Plot(label="computed vs baseline tokens", show_label=False, elem_id="kv-plot-tokens")
            p_speed = gr.Plot(label="time-to-first-token speedup", show_label=False, elem_id="kv-plot-ttft")
        p_store = gr.Plot(label="store size vs context window", show_label=False, elem_id="kv-plot-store")
        # Ticks only while the dashboard is open: rendering plots beside an answer would skew its timings.
        timer = gr.Timer(5.0, active=False)
        outputs = [stats, p_tokens, p_speed, p_store]
        timer.tick(dashboard, None, outputs, show_progress="hidden", **reads)
        tab.select(lambda: (*dashboard(), gr.Timer(active=True)), None, [*outputs, timer], show_progress="hidden", **reads)
        for other in other_tabs:
            other.select(lambda: gr.Timer(active=False), None, timer, queue=False, api_visibility="private")


# ---- named API endpoints -------------------------------------------------------------------


def _apis(library: services.Library, admin_ok) -> None:
    """`/answer`, `/deposit`, `/verify`: the JSON objects `cli.py ask|deposit|verify --json` print."""

    def answer_api(
        question: str, k: int = 3, graft: bool = True, max_new_tokens: int = 32, check: bool = True, compare: bool = False
    ) -> dict:
        """Answer a question; returns the same JSON object as `cli.py ask --json`."""
        problem = input_problem(question)
        if problem:
            raise gr.Error(problem)
        options = dict(k=int(k), graft=bool(graft), max_new_tokens=int(max_new_tokens), check=bool(check), compare=bool(compare))
        return json.loads(json.dumps(_call(library.answer, question, **options).to_json(), default=str))

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
    ) -> dict:
        """Deposit a verified item (question/solution/answer/verifier/reference) or free text; admin token required."""
        admin_ok(admin_token)
        return _deposit(library, question, solution, answer, verifier, reference, text, title, attested_by).to_json()

    def verify_api(samples: int = 10, relocate: int | None = None) -> dict:
        """N-sample exactness check; with `relocate` the relocation experiment at that offset (approximate tier)."""
        rep = _call(library.verify_samples, int(samples), relocate=None if relocate is None else int(relocate))
        return json.loads(json.dumps(rep.to_json(every_field=False), default=str))

    gr.api(answer_api, api_name="answer", concurrency_id="model")
    gr.api(deposit_api, api_name="deposit", concurrency_id="model")
    gr.api(verify_api, api_name="verify", concurrency_id="model")


# ---- the app -------------------------------------------------------------------------------


def build_app(library: services.Library, admin_token: str | None = None, seed_status: SeedStatus | None = None) -> gr.Blocks:
    """The Blocks app over one Library. `admin_token` defaults to $KVGRAFT_ADMIN_TOKEN (read now)."""
    token = admin_token if admin_token is not None else os.environ.get("KVGRAFT_ADMIN_TOKEN", "")
    status = seed_status or SeedStatus()
    admin_ok = _admin_check(token)
    library.lm  # noqa: B018  (load the model now, not on the first request)
    reads = {"concurrency_id": "reads", "concurrency_limit": 4, "api_visibility": "private"}

    def status_line():
        msg = status.message or f"Library: {library.count()} artifacts."
        cls = "kv-status-busy" if not status.done else "kv-status"
        return f'<div class="{cls}">{esc(msg)}</div>', gr.Timer(active=not status.done)

    with gr.Blocks(title="kvgraft") as demo:
        with gr.Row(elem_classes="kv-top"):
            gr.Markdown("## kvgraft · verified knowledge, grafted byte-exact into a frozen model")
            status_md = gr.HTML(elem_id="kv-status")
        status_timer = gr.Timer(1.0)
        chat_tab = _chat_tab(library)
        dep_tab = _deposit_tab(library, token, admin_ok)
        lib_tab, tbl = _library_tab(library, admin_ok, reads)
        ver_tab = _verify_tab(library)
        _dashboard_tab(library, [chat_tab, dep_tab, lib_tab, ver_tab], reads)
        _apis(library, admin_ok)
        status_timer.tick(status_line, None, [status_md, status_timer], show_progress="hidden", **reads)
        demo.load(status_line, None, [status_md, status_timer], **reads)
        demo.load(lambda: _table(library), None, tbl, **reads)

    demo.queue(default_concurrency_limit=1, max_size=QUEUE_MAX)
    return demo


def start_seeding(library: services.Library, status: SeedStatus) -> threading.Thread | None:
    """Seed an empty store with the built-in library in the background; the status line follows it."""
    if library.count() > 0:
        return None
    status.update(0.0, "Empty store: seeding the built-in library…")

    def seed():
        try:
            seed_library(library, on_progress=lambda f, m: status.update(f, m))
            n = library.count()
            status.update(1.0, f"Built-in library ready: {n} artifacts. Try: Who founded the town of Velmora?", done=True)
        except Exception as exc:  # the app stays up; the status line says what failed
            log.exception("seeding failed")
            status.update(1.0, f"Seeding the built-in library failed: {exc}", done=True)

    t = threading.Thread(target=seed, name="kvgraft-seed", daemon=True)
    t.start()
    return t


def server_address() -> tuple[str, int]:
    """Host and port from Gradio's own variables; loopback unless the operator says otherwise."""
    return os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"), int(os.environ.get("GRADIO_SERVER_PORT", "7860"))


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    library = services.Library()
    log.info("store %s; loading the model", library.home)
    status = SeedStatus()
    demo = build_app(library, seed_status=status)
    start_seeding(library, status)
    host, port = server_address()
    demo.launch(server_name=host, server_port=port, **launch_kwargs())


if __name__ == "__main__":
    main()
