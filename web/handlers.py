"""The web app's handlers' glue to `access.guard`: the bounds of one answer or exactness report by who asks, the fair
model turn, and the Library tab's admin handlers (export, import, delete).

Each handler checks the admin token itself (Gradio's API visibility is not access control), then holds
the model through the guard's fair turns; a kvgraft error becomes the message the user sees. It formats
one line per result and knows nothing about torch or SQL.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import gradio as gr

import services
from access.bounds import ADMIN_ONLY_ANSWER, answer_options  # noqa: F401  (the handlers' names, kept where they were)
from access.guard import Guard
from errors import KvgraftError
from services.limits import (
    ANON_REPORT_SAMPLES,
    MAX_REPORT_SAMPLES,
    report_bounds,
    whole,
)
from web.refusal import Refusal, require_text

EXPORT_TTL_S = 600.0  # our own export file is removed this long after the handler returned it
MODEL_WORKERS = 16  # handlers that may wait at once for the model; `FairTurns` runs KVGRAFT_DECODE_TOGETHER at a time


def call(fn: Callable, *args, **kwargs):
    """Run one service call; a kvgraft error becomes the message the user sees."""
    try:
        return fn(*args, **kwargs)
    except KvgraftError as exc:
        raise Refusal(str(exc)) from None


@contextlib.contextmanager
def model_turn(guard: Guard, request):
    """Hold the model for one request, fairly (`FairTurns`); a refusal or error becomes the message shown."""
    try:
        with guard.turn(request) as turn:
            yield turn
    except KvgraftError as exc:
        raise Refusal(str(exc)) from None


def expire(folder: Path, after_s: float) -> threading.Timer:
    """Remove an export's folder `after_s` seconds from now (Gradio serves its own copy, which the
    Blocks' `delete_cache` removes)."""
    timer = threading.Timer(after_s, shutil.rmtree, args=(folder,), kwargs={"ignore_errors": True})
    timer.daemon = True
    timer.start()
    return timer


def exactness_report(library: services.LibraryDoor, guard: Guard, request, samples, relocate, admin_token=None, progress=None):
    """The N-sample report within this caller's bounds. Without the admin token: at most ANON_REPORT_SAMPLES
    samples of artifacts whose chain holds at most ANON_REPORT_TOKENS tokens, ANON_REPORT_STEPS greedy steps
    each and no monolithic comparison, so one sample costs about one default chat. A relocate offset stays
    inside the model's context. Every sample is its own model turn: between samples the model goes to the
    next waiting client in the turn order."""
    require_text(admin_token)
    admin = call(guard.is_admin, admin_token, request)
    top = MAX_REPORT_SAMPLES if admin else ANON_REPORT_SAMPLES
    try:
        n = whole("samples", samples, 1, top)
        offset = None if relocate is None else whole("relocate offset", relocate, 0, library.lm.info.max_positions - 1)
    except KvgraftError as exc:
        more = " (more with the admin token)" if top < MAX_REPORT_SAMPLES else ""
        raise Refusal(f"{exc}{more}") from None
    bounds = report_bounds(admin)
    with model_turn(guard, request) as turn:

        def step(fraction: float, message: str) -> None:
            if progress is not None:
                progress(fraction, desc=message)
            turn.pause()

        return library.exactness_report(n, relocate=offset, on_progress=step, **bounds), offset


def upkeep(library: services.LibraryDoor, guard: Guard, table: Callable[[], list[list]]):
    """The export, import and delete handlers of the Library tab; each needs the admin token.
    `table` renders the library table shown after an import or a delete."""

    def export_bundle(admin_token, ref, request: gr.Request):
        require_text(admin_token, ref)
        call(guard.admin, admin_token, request)
        ref = ref if isinstance(ref, str) else ""
        with model_turn(guard, request):
            ids = [s.strip() for s in ref.replace(",", " ").split() if s.strip()] or library.artifact_ids()
            if not ids:
                raise Refusal("The store is empty: nothing to export.")
            folder = Path(tempfile.mkdtemp(prefix="kvgraft-export-"))
            expire(folder, EXPORT_TTL_S)
            rep = services.export_bundle(library, ids, folder / f"kvgraft-bundle-{time.strftime('%Y%m%d-%H%M%S')}.tar")
        return (
            rep.path,
            f"Exported {len(rep.artifacts)} artifacts, {rep.bytes:,} bytes, bundle sha256 `{rep.bundle_sha256[:16]}…`",
        )

    def import_bundle(admin_token, file, request: gr.Request):
        require_text(admin_token)
        call(guard.admin, admin_token, request)
        if not file:
            raise Refusal("Choose a bundle file to import.")
        upload = Path(file if isinstance(file, str) else file.name)
        try:
            with model_turn(guard, request):
                rep = services.import_bundle(library, upload)
        finally:
            upload.unlink(missing_ok=True)  # the upload cache keeps nothing that was handed to import
        rebuilt = (
            f", {rep.rebuilt} rebuilt here from their tokens: made under another numerical definition" if rep.rebuilt else ""
        )
        return (
            f"Imported {len(rep.artifacts)} artifacts ({len(rep.new)} new, {rep.blobs_written} blobs written{rebuilt}).",
            table(),
        )

    def delete_artifact(admin_token, ref, request: gr.Request):
        require_text(admin_token, ref)
        call(guard.admin, admin_token, request)
        if not isinstance(ref, str) or not ref.strip():
            raise Refusal("Select an artifact (click a row) or paste its id first.")
        with model_turn(guard, request):
            rep = library.delete(ref.strip())
        return f"Deleted `{rep.id[:16]}…` (blob {'removed' if rep.blob_removed else 'kept: still referenced'}).", table()

    return export_bundle, import_bundle, delete_artifact


DASHBOARD_TTL_S = 5.0  # the dashboard page's own refresh period: one render serves every open dashboard meanwhile


class SharedRender:
    """One render serves every caller for `ttl_s` seconds. The dashboard's figures change only with new answers
    and deposits, and drawing its plots costs the server ~0.3 s of CPU: eight sessions' timers must not each pay
    it beside the model. Callers that arrive during a render wait for it and share its result, which must be
    immutable (the plots are handed over already encoded, as Gradio's PlotData)."""

    def __init__(self, render: Callable[[], tuple], ttl_s: float = DASHBOARD_TTL_S, clock: Callable[[], float] = time.monotonic):
        self._render, self._ttl_s, self._clock = render, ttl_s, clock
        self._lock = threading.Lock()
        self._value: tuple | None = None
        self._at = 0.0
        self.renders = 0

    def __call__(self) -> tuple:
        with self._lock:
            if self._value is None or self._clock() - self._at >= self._ttl_s:
                self._value = self._render()
                self._at = self._clock()
                self.renders += 1
            return self._value
