"""kvgraft's web app: a Gradio Blocks front end, thin over services.py.

Each callback calls one `Library` method and formats its result (HTML, tables, matplotlib
figures); it knows nothing about torch or SQL. The model runs one request at a time behind
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
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import gradio as gr  # noqa: E402

import services  # noqa: E402
from app_views import (  # noqa: E402
    esc,
    evidence_html,
    evidence_summary,
    input_problem,
    shown,
    speedup_plot,
    store_plot,
    tokens_plot,
    verify_plot,
    warn,
)
from graft_core.errors import KvgraftError  # noqa: E402  (a type, not the engine)

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
    """Deposit the built-in library (each item through its verifier); returns how many were new."""
    progress = on_progress or (lambda f, m: None)
    items, sheets = seed_items(folder)
    total, created = len(items) + len(sheets), 0
    for i, it in enumerate(items):
        progress(i / total, f"seeding the built-in library: {i + 1}/{total} {it['question']}")
        created += library.deposit_item(**it).created
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


def build_app(library: services.Library, admin_token: str | None = None, seed_status: SeedStatus | None = None) -> gr.Blocks:
    """The Blocks app over one Library. `admin_token` defaults to $KVGRAFT_ADMIN_TOKEN (read now)."""
    token = admin_token if admin_token is not None else os.environ.get("KVGRAFT_ADMIN_TOKEN", "")
    status = seed_status or SeedStatus()
    window = library.lm.info.max_positions

    def admin_ok(given: str | None) -> None:
        if not token:
            raise gr.Error(ADMIN_HELP)
        if not isinstance(given, str) or not hmac.compare_digest(given.encode(), token.encode()):
            raise gr.Error("Admin token refused: give the value of KVGRAFT_ADMIN_TOKEN set on the server.")

    # -- chat --------------------------------------------------------------------------------

    def chat(message, history, graft, k, max_new, check, compare):
        history = list(history or [])
        problem = input_problem(message)
        if problem:
            if isinstance(message, str) and message.strip():
                history.append({"role": "user", "content": shown(message)})
            history.append(warn(problem))
            yield history, gr.skip(), message
            return
        history.append({"role": "user", "content": shown(message)})
        history.append({"role": "assistant", "content": "…"})
        yield history, gr.skip(), ""
        q: queue.Queue = queue.Queue()
        out: dict = {}

        def work():
            try:
                out["r"] = library.answer(
                    message,
                    k=int(k),
                    graft=bool(graft),
                    max_new_tokens=int(max_new),
                    check=bool(check),
                    compare=bool(compare),
                    on_token=q.put,
                )
            except KvgraftError as exc:
                out["e"] = str(exc)
            except Exception as exc:  # the app must stay up; the message says what broke
                log.exception("answer failed")
                out["e"] = f"internal error ({type(exc).__name__}: {exc}); the app is still running"
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
                history[-1] = {"role": "assistant", "content": item or "…"}
                yield history, gr.skip(), ""
        if "e" in out:
            history[-1] = warn(f"Not answered: {out['e']}")
            yield history, gr.skip(), ""
            return
        r = out["r"]
        history[-1] = {"role": "assistant", "content": r.answer or "(empty answer)"}
        title, md = evidence_summary(r)
        history.append({"role": "assistant", "content": md, "metadata": {"title": title, "status": "done"}})
        yield history, evidence_html(r), ""

    def answer_api(
        question: str, k: int = 3, graft: bool = True, max_new_tokens: int = 32, check: bool = True, compare: bool = False
    ) -> dict:
        """Answer a question; returns the same JSON object as `cli.py ask --json`."""
        problem = input_problem(question)
        if problem:
            raise gr.Error(problem)
        try:
            r = library.answer(
                question,
                k=int(k),
                graft=bool(graft),
                max_new_tokens=int(max_new_tokens),
                check=bool(check),
                compare=bool(compare),
            )
        except KvgraftError as exc:
            raise gr.Error(str(exc)) from None
        return json.loads(json.dumps(r.as_json(), default=str))

    # -- deposit -----------------------------------------------------------------------------

    def do_deposit(
        admin_token, question, solution, answer, verifier, reference, text, title, attested_by, on_progress=None
    ) -> dict:
        admin_ok(admin_token)
        try:
            if question and question.strip():
                d = library.deposit_item(
                    question,
                    solution or "",
                    answer or "",
                    verifier or "exact",
                    reference or "",
                    title=title or "",
                    admin=True,
                    on_progress=on_progress,
                )
            elif text and text.strip():
                d = library.deposit_text(
                    text, title=title or "", attested_by=attested_by or None, admin=True, on_progress=on_progress
                )
            else:
                raise gr.Error(
                    "Nothing to deposit: fill in a verified item (question, solution, answer, reference) or free text."
                )
        except KvgraftError as exc:
            raise gr.Error(f"Refused, nothing deposited: {exc}" if "refused" not in str(exc) else str(exc)) from None
        return d.as_dict()

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
        return do_deposit(admin_token, question, solution, answer, verifier, reference, text, title, attested_by)

    def deposit_ui(
        admin_token, mode, question, solution, answer, verifier, reference, text, title, attested_by, progress=gr.Progress()
    ):
        if mode == "verified item":
            text, attested_by = "", ""
        else:
            question = ""
        d = do_deposit(
            admin_token,
            question,
            solution,
            answer,
            verifier,
            reference,
            text,
            title,
            attested_by,
            on_progress=lambda f, m: progress(f, desc=m),
        )
        verb = "Deposited" if d["created"] else "Already deposited (nothing computed)"
        return (
            f"**{verb}** `{d['id'][:16]}…` — {d['tokens']} tokens at position {d['start']}, {d['bytes']:,} bytes, "
            f"{d['kind']}, verifier {d['verifier']}, prefill {d['prefill_s']:.2f} s"
        )

    # -- library -----------------------------------------------------------------------------

    def table(search: str = ""):
        rows = []
        for a in library.catalog.list_artifacts(query=(search or "").strip(), limit=500):
            vs = library.catalog.verifications(a.id)
            last = vs[-1] if vs else None
            rows.append(
                [
                    a.id[:16],
                    a.title,
                    a.kind,
                    a.tokens,
                    a.start,
                    last.verifier if last else "none",
                    last.verdict if last else "unverified",
                    a.created_at.strftime("%Y-%m-%d %H:%M"),
                ]
            )
        return rows

    def show(ref: str):
        ref = (ref or "").strip()
        if not ref:
            return "", {}
        try:
            row = library.catalog.get(ref)
            src = library.catalog.source(row.id)
            manifest = {
                "artifact": asdict(row),
                "chain": [r.id for r in library.catalog.chain(row.id)],
                "verifications": [asdict(v) for v in library.catalog.verifications(row.id)],
            }
        except KvgraftError as exc:
            raise gr.Error(str(exc)) from None
        return src.text, json.loads(json.dumps(manifest, default=str))

    def pick(evt: gr.SelectData, data):
        rid = evt.row_value[0] if evt.row_value else ""
        return (rid, *show(rid))

    def maintenance_fn(name: str):
        try:
            import maintenance
        except ImportError:
            raise gr.Error(f"maintenance.py is not installed in this build; '{name}' is unavailable") from None
        fn = getattr(maintenance, name, None)
        if fn is None:
            raise gr.Error(f"maintenance.{name} is not available in this build")
        return fn

    def export_bundle(ref: str):
        fn = maintenance_fn("export_bundle")
        ids = [s.strip() for s in (ref or "").replace(",", " ").split() if s.strip()]
        try:
            ids = ids or [a.id for a in library.catalog.list_artifacts(limit=100_000)]
            if not ids:
                raise gr.Error("The store is empty: nothing to export.")
            out = Path(tempfile.mkdtemp(prefix="kvgraft-export-")) / f"kvgraft-bundle-{time.strftime('%Y%m%d-%H%M%S')}.tar"
            rep = fn(library, ids, out)
        except KvgraftError as exc:
            raise gr.Error(str(exc)) from None
        return (
            rep.path,
            f"Exported {len(rep.artifacts)} artifacts, {rep.bytes:,} bytes, bundle sha256 `{rep.bundle_sha256[:16]}…`",
        )

    def import_bundle(admin_token, file):
        admin_ok(admin_token)
        if not file:
            raise gr.Error("Choose a bundle file to import.")
        fn = maintenance_fn("import_bundle")
        try:
            rep = fn(library, Path(file if isinstance(file, str) else file.name))
        except KvgraftError as exc:
            raise gr.Error(str(exc)) from None
        return f"Imported {len(rep.artifacts)} artifacts ({len(rep.new)} new, {rep.blobs_written} blobs written).", table("")

    def delete_artifact(admin_token, ref):
        admin_ok(admin_token)
        if not (ref or "").strip():
            raise gr.Error("Select an artifact (click a row) or paste its id first.")
        fn = maintenance_fn("delete")
        try:
            rep = fn(library, ref.strip())
        except KvgraftError as exc:
            raise gr.Error(str(exc)) from None
        return f"Deleted `{rep.id[:16]}…` (blob {'removed' if rep.blob_removed else 'kept: still referenced'}).", table("")

    # -- verify ------------------------------------------------------------------------------

    def run_verify(samples: int, relocate: int | None, on_progress=None):
        try:
            return library.verify_samples(
                int(samples), relocate=None if relocate is None else int(relocate), on_progress=on_progress
            )
        except KvgraftError as exc:
            raise gr.Error(str(exc)) from None

    def verify_api(samples: int = 10, relocate: int | None = None) -> dict:
        """N-sample exactness check; with `relocate` the relocation experiment at that offset (approximate tier)."""
        rep = run_verify(samples, relocate).as_dict()
        keep = ("artifact", "query", "exact", "tier", "kl", "max_abs_diff", "argmax_agreement", "fresh_sha256", "grafted_sha256")
        rep["rows"] = [{k: r.get(k) for k in keep} for r in rep["rows"]]
        return json.loads(json.dumps(rep, default=str))

    def verify_ui(samples, do_relocate, offset, progress=gr.Progress()):
        relocate = int(offset) if do_relocate else None
        rep = run_verify(samples, relocate, on_progress=lambda f, m: progress(f, desc=m))
        tier = f"relocated to offset {relocate} (approximate tier)" if relocate is not None else "own position (exact tier)"
        badge = (
            '<span class="kv-badge kv-pass">EXACT</span>'
            if rep.byte_equal == rep.samples
            else '<span class="kv-badge kv-fail">NOT EXACT</span>'
        )
        summary = (
            f'<div class="kv-evidence">{badge} <b>{rep.byte_equal}/{rep.samples}</b> byte-equal, {esc(tier)}; '
            f"max KL {rep.max_kl:.3g}, argmax agreement {rep.argmax_agreement * 100:.2f}%</div>"
        )
        rows = [
            [
                r["artifact"][:12],
                r["query"],
                "yes" if r["exact"] else "no",
                f"{r['kl']:.3g}",
                f"{r['max_abs_diff']:.3g}",
                f"{r['argmax_agreement'] * 100:.1f}%",
                r["fresh_sha256"][:16],
                r["grafted_sha256"][:16],
            ]
            for r in rep.rows
        ]
        return summary, rows, verify_plot(rep.rows, relocate)

    # -- dashboard ---------------------------------------------------------------------------

    def dashboard():
        t = library.catalog.ledger_totals()
        entries = library.catalog.ledger(last=60)
        store = library.catalog.total_tokens()
        n = library.catalog.count_artifacts()
        checks = t.checks_passed + t.checks_failed
        md = (
            f'<div class="kv-stats">'
            f'<div class="kv-stat"><b>{t.tokens_saved:,}</b><span>tokens saved (cumulative)</span></div>'
            f'<div class="kv-stat"><b>{t.answers:,}</b><span>answers</span></div>'
            f'<div class="kv-stat"><b>{t.grafted_tokens:,}</b><span>tokens grafted</span></div>'
            f'<div class="kv-stat"><b>{t.baseline_flops / max(1, t.flops):.1f}×</b><span>fewer FLOPs (estimate)</span></div>'
            f'<div class="kv-stat"><b>{store:,}</b><span>tokens in store ({n} artifacts) / window {window:,}</span></div>'
            f'<div class="kv-stat"><b class="{"kv-ok" if not t.checks_failed else "kv-bad"}">{t.checks_passed}/{checks}</b>'
            f"<span>exactness checks passed ({t.checks_failed} failed)</span></div></div>"
        )
        return md, tokens_plot(entries), speedup_plot(entries), store_plot(store, window)

    def status_line():
        msg = status.message or f"Library: {library.catalog.count_artifacts()} artifacts."
        cls = "kv-status-busy" if not status.done else "kv-status"
        return f'<div class="{cls}">{esc(msg)}</div>', gr.Timer(active=not status.done)

    # -- layout ------------------------------------------------------------------------------

    with gr.Blocks(title="kvgraft") as demo:
        with gr.Row(elem_classes="kv-top"):
            gr.Markdown("## kvgraft · verified knowledge, grafted byte-exact into a frozen model")
            status_md = gr.HTML(elem_id="kv-status")
        status_timer = gr.Timer(1.0)

        with gr.Tab("Chat", id="chat") as chat_tab:
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
            chat_inputs = [box, chatbot, graft, k, max_new, check, compare]
            box.submit(
                chat,
                chat_inputs,
                [chatbot, evidence, box],
                concurrency_id="model",
                api_name="chat",
                api_visibility="undocumented",
            )
            send.click(chat, chat_inputs, [chatbot, evidence, box], concurrency_id="model", api_visibility="private")
            clear.click(lambda: ([], ""), None, [chatbot, evidence], api_visibility="private", queue=False)

        with gr.Tab("Deposit", id="deposit") as dep_tab:
            if not token:
                gr.Markdown(f"> ⚠️ {ADMIN_HELP}", elem_id="kv-admin-help")
            tok = gr.Textbox(label="admin token", type="password")
            mode = gr.Radio(["verified item", "free text"], value="verified item", label="what to deposit")
            with gr.Group():
                dq = gr.Textbox(label="question")
                ds = gr.Textbox(label="solution (the fact or worked solution)", lines=3)
                with gr.Row():
                    da = gr.Textbox(label="answer")
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
                api_visibility="private",
            )

        with gr.Tab("Library", id="library") as lib_tab:
            with gr.Row():
                search = gr.Textbox(placeholder="search titles and text", show_label=False, scale=4)
                refresh = gr.Button("Search", scale=1)
            tbl = gr.Dataframe(
                headers=["id", "title", "kind", "tokens", "start", "verifier", "verdict", "created"],
                interactive=False,
                wrap=True,
                elem_id="kv-library",
            )
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
            reads = {"concurrency_id": "reads", "concurrency_limit": 4, "api_visibility": "private"}
            refresh.click(table, search, tbl, **reads)
            search.submit(table, search, tbl, **reads)
            lib_tab.select(table, search, tbl, **reads)
            tbl.select(pick, tbl, [sel, src_text, manifest], **reads)
            sel.submit(show, sel, [src_text, manifest], **reads)
            exp_btn.click(
                export_bundle, sel, [exp_file, lout], concurrency_id="model", api_name="export", api_visibility="undocumented"
            )
            imp_btn.click(
                import_bundle,
                [ltok, imp_file],
                [lout, tbl],
                concurrency_id="model",
                api_name="import",
                api_visibility="undocumented",
            )
            del_btn.click(
                delete_artifact,
                [ltok, sel],
                [lout, tbl],
                concurrency_id="model",
                api_name="delete",
                api_visibility="undocumented",
            )

        with gr.Tab("Verify", id="verify") as ver_tab:
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

        with gr.Tab("Dashboard", id="dashboard") as dash_tab:
            stats = gr.HTML(elem_id="kv-stats")
            with gr.Row():
                p_tokens = gr.Plot(label="computed vs baseline tokens", show_label=False, elem_id="kv-plot-tokens")
                p_speed = gr.Plot(label="time-to-first-token speedup", show_label=False, elem_id="kv-plot-ttft")
            p_store = gr.Plot(label="store size vs context window", show_label=False, elem_id="kv-plot-store")
            # Ticks only while the dashboard is open: rendering plots beside an answer would skew its timings.
            timer = gr.Timer(5.0, active=False)
            dash_out = [stats, p_tokens, p_speed, p_store]
            timer.tick(dashboard, None, dash_out, show_progress="hidden", **reads)
            dash_tab.select(
                lambda: (*dashboard(), gr.Timer(active=True)), None, [*dash_out, timer], show_progress="hidden", **reads
            )
            for other in (chat_tab, dep_tab, lib_tab, ver_tab):
                other.select(lambda: gr.Timer(active=False), None, timer, queue=False, api_visibility="private")

        gr.api(answer_api, api_name="answer", concurrency_id="model")
        gr.api(deposit_api, api_name="deposit", concurrency_id="model")
        gr.api(verify_api, api_name="verify", concurrency_id="model")

        status_timer.tick(status_line, None, [status_md, status_timer], show_progress="hidden", **reads)
        demo.load(status_line, None, [status_md, status_timer], **reads)
        demo.load(table, None, tbl, **reads)

    demo.queue(default_concurrency_limit=1, max_size=QUEUE_MAX)
    return demo


def start_seeding(library: services.Library, status: SeedStatus) -> threading.Thread | None:
    """Seed an empty store with the built-in library in the background; the status line follows it."""
    if library.catalog.count_artifacts() > 0:
        return None
    status.update(0.0, "Empty store: seeding the built-in library…")

    def seed():
        try:
            seed_library(library, on_progress=lambda f, m: status.update(f, m))
            n = library.catalog.count_artifacts()
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
