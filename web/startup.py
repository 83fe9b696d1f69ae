"""The web app's start-up: convert the model, load it, seed the built-in library, build the index, each a
stage with its progress and measured time, run in a background thread while the page is already served.

Owns the stage tracker (what the status line, the terminal bars and the "still starting" message read),
the duration estimates (remembered in the model cache from the last start, else typical figures, labelled
as such) and `StartingLibrary`, the Library seen through the start-up. It knows nothing about Gradio.
"""

from __future__ import annotations

import gc
import html
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import settings
from errors import KvgraftError, NotReady
from services.forwarding import DoorCall, forwarding

if TYPE_CHECKING:
    from services.door import LibraryDoor

log = logging.getLogger("kvgraft.startup")

STAGES = (
    ("convert", "converting the model"),
    ("load", "loading the model"),
    ("seed", "seeding the built-in library"),
    ("index", "building the index"),
)
# Seconds per stage before this machine has measured them (2 shared CPU cores, Gemma 3 270M read from its GGUF,
# the built-in library's 11 artifacts recomputed from library.json; convert runs only without fma16).
TYPICAL_S = {"convert": 90.0, "load": 14.0, "seed": 14.0, "index": 1.0}
TIMES_FILE = "kvgraft-startup-times.json"
SLOW_LOAD_ENV = "KVGRAFT_TEST_SLOW_LOAD_S"  # test-only: sleep this long in the load stage (the browser test)
_FINISHED = ("done", "skipped", "failed")


@dataclass
class Stage:
    key: str
    label: str
    state: str = "waiting"  # waiting | running | done | skipped | failed
    fraction: float | None = None  # measured progress, None where only time tells (convert, load)
    detail: str = ""
    started: float | None = None
    finished: float | None = None

    def elapsed(self, now: float) -> float:
        if self.started is None:
            return 0.0
        return (self.finished if self.finished is not None else now) - self.started


@dataclass(frozen=True)
class StageView:
    """One stage as shown: `progress` is measured where the stage reports it, else elapsed / expected."""

    key: str
    label: str
    state: str
    progress: float
    measured_progress: bool
    elapsed_s: float
    expected_s: float
    detail: str


@dataclass(frozen=True)
class Snapshot:
    stages: tuple[StageView, ...]
    ready: bool
    model_failed: str | None
    elapsed_s: float
    left_s: float
    basis: str  # where the expected durations come from

    @property
    def current(self) -> StageView | None:
        running = [s for s in self.stages if s.state == "running"]
        waiting = [s for s in self.stages if s.state == "waiting"]
        return (running or waiting or [None])[0]


@dataclass
class Startup:
    """The start-up stages of one process; one writer (the start-up thread), any number of readers."""

    expected: dict[str, float] = field(default_factory=lambda: dict(TYPICAL_S))
    basis: str = "typical figures, not yet measured on this machine"
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self):
        self._lock = threading.Lock()
        self._stages = {k: Stage(k, label) for k, label in STAGES}
        self.t0 = self.clock()
        self.ended: float | None = None

    @classmethod
    def already_done(cls) -> Startup:
        """A tracker for a library that was made ready by its caller (tests, benchmarks)."""
        s = cls()
        for key in s._stages:
            s.skip(key, "done before the app was built")
        s.ended = s.t0
        return s

    @classmethod
    def remembered(cls, cache_dir: Path) -> Startup:
        """A tracker whose estimates are the durations measured at the last start (typical figures where none)."""
        try:
            times = json.loads((cache_dir / TIMES_FILE).read_text())
            measured = {k: float(times[k]) for k in TYPICAL_S if isinstance(times.get(k), int | float)}
        except (OSError, ValueError):
            measured = {}
        if not measured:
            return cls()
        basis = "measured at the last start on this machine" + ("" if len(measured) == len(TYPICAL_S) else ", typical elsewhere")
        return cls(expected={**TYPICAL_S, **measured}, basis=basis)

    # ---- the writer's side -------------------------------------------------------------------

    def begin(self, key: str, detail: str = "") -> None:
        with self._lock:
            st = self._stages[key]
            st.state, st.started, st.detail = "running", self.clock(), detail
        log.debug("start-up: %s…", st.label)

    def progress(self, key: str, fraction: float, detail: str = "") -> None:
        with self._lock:
            st = self._stages[key]
            st.fraction, st.detail = max(0.0, min(1.0, fraction)), detail or st.detail

    def _end(self, key: str, state: str, detail: str) -> None:
        with self._lock:
            st = self._stages[key]
            now = self.clock()
            st.state, st.detail, st.finished = state, detail, now
            st.started = now if st.started is None else st.started
            if all(s.state in _FINISHED for s in self._stages.values()):
                self.ended = now
        log.debug("start-up: %s %s%s", st.label, state, f" ({detail})" if detail else "")

    def finish(self, key: str, detail: str = "") -> None:
        self._end(key, "done", detail)

    def skip(self, key: str, detail: str) -> None:
        self._end(key, "skipped", detail)

    def fail(self, key: str, exc: BaseException) -> None:
        self._end(key, "failed", f"{type(exc).__name__}: {exc}")

    def measured(self) -> dict[str, float]:
        """Seconds of each stage that ran to completion (what the next start's estimates use)."""
        with self._lock:
            return {k: s.finished - s.started for k, s in self._stages.items() if s.state == "done"}

    # ---- the readers' side -------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        with self._lock:
            now = self.clock()
            views, left = [], 0.0
            for s in self._stages.values():
                expected = self.expected.get(s.key, 1.0)
                elapsed = s.elapsed(now)
                if s.state in _FINISHED:
                    progress = 1.0
                elif s.state == "waiting":
                    progress, left = 0.0, left + expected
                elif s.fraction:  # measured progress: the rest at the measured rate
                    progress = s.fraction
                    left += elapsed * (1 - s.fraction) / s.fraction
                else:
                    progress = min(0.99, elapsed / expected) if expected > 0 else 0.0
                    left += max(1.0, expected - elapsed)
                measured = s.fraction is not None or s.state in _FINISHED
                views.append(StageView(s.key, s.label, s.state, progress, measured, elapsed, expected, s.detail))
            load = self._stages["load"]
            failed = load.detail if load.state == "failed" else None
            ready = failed is None and all(s.state in _FINISHED for s in self._stages.values())
            total = (self.ended if self.ended is not None else now) - self.t0
            return Snapshot(tuple(views), ready, failed, total, left, self.basis)

    @property
    def ready(self) -> bool:
        return self.snapshot().ready

    def not_ready_message(self) -> str:
        snap = self.snapshot()
        if snap.model_failed:
            return f"The model failed to load ({snap.model_failed}); see the server log, fix the cause and restart the app."
        cur = snap.current
        if cur is None:
            return "Still starting: finishing up, ask again in a second."
        n = [s.key for s in snap.stages].index(cur.key) + 1
        return (
            f"Still starting: {cur.label} (stage {n} of {len(snap.stages)}), about {snap.left_s:.0f} s left "
            f"({snap.basis}). Ask again when the status line says ready."
        )

    def save_times(self, cache_dir: Path) -> None:
        """Remember the measured stage durations for the next start's estimates (best effort)."""
        measured = self.measured()
        if not measured:
            return
        path = cache_dir / TIMES_FILE
        try:
            old = json.loads(path.read_text()) if path.exists() else {}
        except (OSError, ValueError):
            old = {}
        try:
            cache_dir.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".part")
            tmp.write_text(json.dumps({**old, **{k: round(v, 2) for k, v in measured.items()}}, sort_keys=True))
            os.replace(tmp, path)
        except OSError as exc:
            log.info("start-up times not remembered (%s): the next start shows typical estimates", exc)


# ---- running it ----------------------------------------------------------------------------


def model_cache() -> Path:
    """The model cache (where the stage times are remembered), read when called: a Space may move it."""
    from graft_core.model import model_cache_dir

    return model_cache_dir()


def _convert_in_child() -> None:
    """The one-time GGUF conversion in a child process: its minute of mostly pure-Python work (the
    tokenizer) would otherwise hold the GIL and leave the page unanswered while it runs."""
    code = "from graft_core import model; model.resolve_model_dir(model.DEFAULT_MODEL)"
    root = Path(__file__).resolve().parents[1]  # the checkout
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise KvgraftError(f"converting the packaged model failed (exit {done.returncode}): {' | '.join(tail)}")


def _model_stages(library: LibraryDoor, tracker: Startup) -> bool:
    import retrieval  # noqa: F401  (faiss before torch, see retrieval/__init__.py; the page did not load either)
    from graft_core import model as model_mod

    if library.model_loaded:
        tracker.skip("convert", "model given by the caller")
    elif model_mod.needs_conversion(library.model_name):
        tracker.begin("convert", "GGUF from PyPI -> float32 safetensors, once per model cache (products without fma16)")
        _convert_in_child()
        tracker.finish("convert", f"saved in {model_mod.model_cache_dir()}")
    else:
        tracker.skip("convert", "not needed (read from the GGUF, or converted in the model cache)")
    tracker.begin("load")
    slow = settings.get(SLOW_LOAD_ENV)
    if slow > 0:  # test-only hook: a model load that takes `slow` seconds
        time.sleep(slow)
    lm = library.lm
    tracker.finish("load", f"{lm.info.name}, {lm.info.num_layers} layers")
    return True


def run(
    library: LibraryDoor, tracker: Startup, seed: Callable | None = None, remember_in: Path | None = None, warm: int = 0
) -> None:
    """Every stage in order; a failure is recorded in its stage (the app stays up and says so). Then, with
    `warm` > 0 and the app already answering, the first-use probe of the `warm` newest artifacts
    (`Library.warm_proofs`): not a stage, because answers need not wait for it (each probe takes the model
    lock on its own, and an answer that comes first proves its artifact itself)."""
    try:
        _model_stages(library, tracker)
    except Exception as exc:  # the page stays up; the status line and every answer say what failed
        log.exception("model start-up failed")
        running = [s.key for s in tracker.snapshot().stages if s.state == "running"]
        for key in ("convert", "load") if running == ["convert"] else ("load",):
            tracker.fail(key, exc)  # a failed conversion is a failed load too: the gate reads the load stage
        tracker.skip("seed", "the model did not load")
        tracker.skip("index", "the model did not load")
        return
    n = library.count()
    if seed is None or (n > 0 and library.holds_own()):
        tracker.skip("seed", f"the store holds {n} artifacts" if n else "no seeding asked")
    else:
        tracker.begin("seed")
        try:
            created = seed(library, on_progress=lambda f, m: tracker.progress("seed", f, m))
            tracker.finish("seed", f"{library.count()} artifacts ({created} new)")
        except Exception as exc:  # the app answers from whatever was deposited
            log.exception("seeding failed")
            tracker.fail("seed", exc)
    tracker.begin("index", "embedder and FAISS index")
    try:
        idx = library.index()
        tracker.finish("index", f"{len(idx.ids())} vectors")
    except Exception as exc:  # answers rebuild it on demand
        log.exception("index build failed")
        tracker.fail("index", exc)
    if remember_in is not None:
        tracker.save_times(remember_in)
    try:  # not a stage: until built, answers decode alone
        library.start_decoding_together()
    except Exception:
        log.exception("building the decode group failed; answers decode one at a time")
    if warm > 0:
        try:
            report = library.warm_proofs(warm)
            log.info("%s", report.line())
            for why in report.skipped_why:
                log.info("warm-up passed over %s", why)
        except Exception:  # answers prove their artifacts themselves
            log.exception("warming the proofs failed")
    # what start-up built (the model's modules, the library, the index) lives as long as the process: out of the
    # collector's generations, so that the full collections answers trigger do not walk it again and again (its
    # garbage collected first, so that none of it is kept for good)
    gc.collect()
    gc.freeze()


def start(
    library: LibraryDoor, tracker: Startup, seed: Callable | None = None, remember_in: Path | None = None, warm: int = 0
) -> threading.Thread:
    """`run` in a daemon thread; returns the thread (join it in tests)."""
    t = threading.Thread(target=run, args=(library, tracker, seed, remember_in, warm), name="kvgraft-startup", daemon=True)
    t.start()
    return t


# ---- the gate ------------------------------------------------------------------------------


@forwarding
class StartingLibrary:
    """A library door (`services.LibraryDoor`) seen through the start-up: catalog reads (and the store, which
    is open from the start) pass at once; every other member raises `NotReady` (stage, time left) when called
    before the start-up is done, instead of blocking on the model. Taking a method is not calling it: handlers
    pass `library.answer` along. Every member is the door's, generated from its declaration (`services.forwarding`);
    nothing else passes through."""

    PASSING = frozenset({"home", "model_name", "model_loaded", "store", "count", "entries", "show", "artifact_ids", "ledger"})

    def __init__(self, library: LibraryDoor, tracker: Startup):
        self._library, self._tracker = library, tracker

    def _ready(self) -> LibraryDoor:
        """The library once the start-up is done; `NotReady` before."""
        if not self._tracker.ready:
            raise NotReady(self._tracker.not_ready_message())
        return self._library

    def _forward(self, call: DoorCall):
        """Reads pass at once; the rest (the model's, `lm` itself: reading it before would load the model here,
        `holds_own`: it reads the model's fingerprint) waits for the start-up."""
        return call.on(self._library if call.member in self.PASSING else self._ready())


# ---- showing it ----------------------------------------------------------------------------


def _bar(progress: float, width: int = 24) -> str:
    full = int(round(progress * width))
    return "#" * full + "." * (width - full)


def terminal_lines(snap: Snapshot) -> list[str]:
    """One line per stage: bar, percentage, measured seconds (and the expectation while it runs)."""
    out = []
    for s in snap.stages:
        if s.state == "running":
            how = "" if s.measured_progress else f" of ~{s.expected_s:.0f} s expected"
            out.append(f"  {s.label:<30} [{_bar(s.progress)}] {s.progress:4.0%}  {s.elapsed_s:6.1f} s{how}  {s.detail}")
        elif s.state in _FINISHED:
            out.append(f"  {s.label:<30} [{_bar(1.0)}] {s.state:>4}  {s.elapsed_s:6.1f} s  {s.detail}")
        else:
            out.append(f"  {s.label:<30} [{_bar(0.0)}] wait")
    return out


class TerminalProgress:
    """Prints the stages to a terminal while the start-up runs: redrawn in place on a TTY, else a block
    of lines at each stage change (and every `every_s` seconds), so a log file stays readable."""

    def __init__(self, tracker: Startup, stream: TextIO | None = None, every_s: float = 10.0):
        self.tracker, self.stream, self.every_s = tracker, stream or sys.stderr, every_s
        self._stop = threading.Event()

    def _draw(self, snap: Snapshot, drawn: int) -> int:
        tty = self.stream.isatty()
        lines = terminal_lines(snap)
        head = f"kvgraft start-up: {snap.elapsed_s:.1f} s" + ("" if snap.ready else f", about {snap.left_s:.0f} s left")
        if tty and drawn:
            self.stream.write(f"\x1b[{drawn}F")
        self.stream.write("\n".join((head + "\x1b[K" if tty else head, *[x + ("\x1b[K" if tty else "") for x in lines])) + "\n")
        self.stream.flush()
        return len(lines) + 1

    def run(self) -> None:
        drawn, last_key, last_t = 0, None, 0.0
        while True:
            snap = self.tracker.snapshot()
            key = tuple(s.state for s in snap.stages)
            now = time.monotonic()
            done = snap.ready or snap.model_failed is not None or snap.current is None
            if self.stream.isatty() or key != last_key or now - last_t >= self.every_s or done:
                drawn = self._draw(snap, drawn if self.stream.isatty() else 0)
                last_key, last_t = key, now
            if done or self._stop.wait(0.5):
                return

    def start(self) -> threading.Thread:
        t = threading.Thread(target=self.run, name="kvgraft-startup-printer", daemon=True)
        t.start()
        return t

    def stop(self) -> None:
        self._stop.set()


def status_html(snap: Snapshot, ready_text: str) -> str:
    """The status area: one line, then (while starting, or on failure) a progress bar per stage."""
    if snap.ready:
        ran = ", ".join(f"{s.label.split(' ')[0]} {s.elapsed_s:.1f} s" for s in snap.stages if s.state == "done")
        failed = [f"{s.label} failed: {s.detail}" for s in snap.stages if s.state == "failed"]
        line = html.escape(" · ".join([ready_text, *failed]))
        note = f"started in {snap.elapsed_s:.1f} s" + (f" ({ran})" if ran else "")
        cls = "kv-status-busy" if failed else "kv-status"
        return f'<div class="{cls}">{line} <span class="kv-muted">{html.escape(note)}</span></div>'
    if snap.model_failed:
        head = f"The model failed to load: {snap.model_failed}. See the server log, fix the cause and restart."
    else:
        cur = snap.current
        what = cur.label if cur else "finishing up"
        head = f"Starting: {what} · {snap.elapsed_s:.0f} s so far · about {snap.left_s:.0f} s left ({snap.basis})"
    rows = []
    for s in snap.stages:
        pct = int(round(s.progress * 100))
        if s.state == "running":
            t = f"{s.elapsed_s:.1f} s" + ("" if s.measured_progress else f" of ~{s.expected_s:.0f} s")
        elif s.state in _FINISHED:
            t = f"{s.state}, {s.elapsed_s:.1f} s"
        else:
            t = "waiting"
        rows.append(
            f'<div class="kv-stage kv-stage-{s.state}" data-stage="{s.key}"><span class="kv-stage-label">{html.escape(s.label)}</span>'
            f'<progress max="100" value="{pct}"></progress><span class="kv-stage-time">{html.escape(t)}</span>'
            f'<span class="kv-muted">{html.escape(s.detail)}</span></div>'
        )
    return f'<div class="kv-status-busy"><div class="kv-status-head">{html.escape(head)}</div>{"".join(rows)}</div>'
