"""The web app's Library tab: the store's artifacts listed and searched (catalog reads, beside the model), one
artifact's text and manifest, and the admin's export, import and delete (web.handlers.upkeep, the admin token
checked per call; uploads are the admin's only, decided at the edge by access.uploads, and the token once entered
opens this browser's upload session). Formatting lives in web/views.py; the work in services.
"""

from __future__ import annotations

import gradio as gr

import services
from access import uploads
from access.guard import Guard
from web.handlers import MODEL_WORKERS, call, upkeep
from web.refusal import require_text
from web.views import LIBRARY_HEADERS, library_table


def table_rows(library: services.LibraryDoor, search: str = "") -> list[list]:
    require_text(search)
    return library_table(library.entries(query=(search or "").strip(), limit=500))


def shown_artifact(library: services.LibraryDoor, ref: str) -> tuple[str, dict]:
    require_text(ref)
    ref = (ref or "").strip()
    if not ref:
        return "", {}
    r = call(library.show, ref).to_json()
    return r["source"]["text"], {"artifact": r["artifact"], "chain": r["chain"], "verifications": r["verifications"]}


def library_tab(library: services.LibraryDoor, guard: Guard, reads: dict, writable: bool = True) -> tuple[gr.Tab, gr.Dataframe]:
    export_bundle, import_bundle, delete_artifact = upkeep(library, guard, lambda: table_rows(library))

    def pick(evt: gr.SelectData, data):
        rid = evt.row_value[0] if evt.row_value else ""
        return (rid, *shown_artifact(library, rid))

    with gr.Tab("Library", id="library") as tab:
        with gr.Row():
            search = gr.Textbox(placeholder="search titles and text", show_label=False, scale=4)
            refresh = gr.Button("Search", scale=1)
        tbl = gr.Dataframe(headers=LIBRARY_HEADERS, interactive=False, wrap=True, elem_id="kv-library")
        sel = gr.Textbox(label="selected artifact id (click a row, or paste an id or prefix)")
        with gr.Row():
            src_text = gr.Textbox(label="deposited text", lines=8)
            manifest = gr.JSON(label="manifest (row, chain, verifier record)")
        with gr.Accordion("Export / import / delete", open=False, visible=writable):  # admin only: none on a read-only demo
            ltok = gr.Textbox(
                label="admin token (export, import, delete; enter it before choosing a bundle: uploads are the admin's)",
                type="password",
                elem_id="kv-library-token",
            )
            upload_note = gr.Markdown(elem_id="kv-upload-session")
            with gr.Row():
                exp_btn = gr.Button("Export bundle (selected id, or all when empty)")
                exp_file = gr.File(label="bundle")
            with gr.Row():
                imp_file = gr.File(label="bundle to import", type="filepath", elem_id="kv-import-file")
                imp_btn = gr.Button("Import")
                del_btn = gr.Button("Delete selected", variant="stop")
            lout = gr.Markdown(elem_id="kv-library-out")
        table = lambda search="": table_rows(library, search)  # noqa: E731
        refresh.click(table, search, tbl, **reads)
        search.submit(table, search, tbl, **reads)
        tab.select(table, search, tbl, **reads)
        tbl.select(pick, tbl, [sel, src_text, manifest], **reads)
        sel.submit(lambda ref: shown_artifact(library, ref), sel, [src_text, manifest], **reads)
        admin = {"concurrency_id": "model", "concurrency_limit": MODEL_WORKERS, "api_visibility": "undocumented"}
        exp_btn.click(export_bundle, [ltok, sel], [exp_file, lout], api_name="export", **admin)
        imp_btn.click(import_bundle, [ltok, imp_file], [lout, tbl], api_name="import", **admin)
        del_btn.click(delete_artifact, [ltok, sel], [lout, tbl], api_name="delete", **admin)
        for event in (ltok.blur, ltok.submit):  # the token, once entered, opens this browser's upload session
            event(None, ltok, upload_note, js=UPLOAD_SESSION_JS, api_visibility="private", queue=False)
    return tab, tbl


# The page posts the token to access.uploads' session route, which answers with an HttpOnly cookie that the page's
# uploads carry; the same value is not sent twice (a wrong one counts as a failed guess of the address).
UPLOAD_SESSION_JS = f"""async (token) => {{
  token = (token || "").trim();
  const w = window;
  if (token === (w.__kvgraftUploadToken || "")) return w.__kvgraftUploadNote || "";
  w.__kvgraftUploadToken = token;
  let note;
  try {{
    const base = w.location.pathname.replace(/[^/]*$/, "");
    const r = await fetch(base + "{uploads.SESSION_PATH.lstrip("/")}", {{
      method: "POST", headers: {{"Content-Type": "application/json"}}, body: JSON.stringify({{token}}),
      credentials: "same-origin"}});
    const j = await r.json().catch(() => ({{}}));
    note = (r.ok ? "" : "⚠️ ") + (j.detail || ("HTTP " + r.status));
  }} catch (e) {{
    note = "⚠️ Could not open an upload session: " + e;
  }}
  w.__kvgraftUploadNote = note;
  return note;
}}"""
