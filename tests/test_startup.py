"""The first five minutes: the start-up tracker, its estimates and messages, the gate that
answers "still starting" instead of blocking, Space detection, and `python app.py` started with the
Space environment variables set (tiny model, loopback port, slowed model load)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

from errors import KvgraftError, NotReady
from web import hosting, startup
from web import placeholder as boot

ROOT = Path(__file__).resolve().parents[1]


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _tracker(**kw) -> tuple[startup.Startup, Clock]:
    clock = Clock()
    return startup.Startup(clock=clock, **kw), clock


# ---- the tracker -----------------------------------------------------------------------------


def test_time_left_sums_the_running_stage_and_the_waiting_ones():
    tr, clock = _tracker(expected={"convert": 90.0, "load": 6.0, "seed": 10.0, "index": 1.0})
    assert tr.snapshot().left_s == 107.0 and not tr.ready
    tr.begin("convert")
    clock.t += 30
    snap = tr.snapshot()
    assert snap.left_s == 60 + 6 + 10 + 1
    assert snap.stages[0].progress == 30 / 90 and not snap.stages[0].measured_progress
    clock.t += 100  # slower than expected: the running stage still counts at least a second, never negative
    assert tr.snapshot().left_s == 1 + 17
    assert tr.snapshot().stages[0].progress == 0.99
    tr.finish("convert")
    tr.begin("load")
    tr.finish("load")
    tr.begin("seed")
    clock.t += 4
    tr.progress("seed", 0.25, "seeding 4/16")
    snap = tr.snapshot()
    assert snap.left_s == 4 * 0.75 / 0.25 + 1  # the rest of the seed at its measured rate, then the index
    assert snap.current.key == "seed" and snap.current.detail == "seeding 4/16" and snap.stages[2].measured_progress
    tr.finish("seed")
    tr.skip("index", "not needed")
    assert tr.ready and tr.snapshot().left_s == 0
    assert tr.snapshot().elapsed_s == 134.0


def test_not_ready_message_names_the_stage_and_the_estimate():
    tr, clock = _tracker(expected={"convert": 90.0, "load": 6.0, "seed": 10.0, "index": 1.0}, basis="measured at the last start")
    tr.skip("convert", "cached")
    tr.begin("load")
    clock.t += 2
    assert tr.not_ready_message() == (
        "Still starting: loading the model (stage 2 of 4), about 15 s left (measured at the last start). "
        "Ask again when the status line says ready."
    )
    tr.fail("load", OSError("no config.json"))
    assert tr.not_ready_message() == (
        "The model failed to load (OSError: no config.json); see the server log, fix the cause and restart the app."
    )
    tr.skip("seed", "x")
    tr.skip("index", "x")
    assert not tr.ready  # every stage finished, but without a model nothing is ready


def test_measured_times_are_remembered_for_the_next_estimate(tmp_path):
    assert startup.Startup.remembered(tmp_path).basis.startswith("typical figures")
    tr, clock = _tracker()
    tr.skip("convert", "cached")  # skipped stages are not measurements
    for key, secs in (("load", 3.5), ("seed", 7.25), ("index", 0.5)):
        tr.begin(key)
        clock.t += secs
        tr.finish(key)
    tr.save_times(tmp_path)
    again = startup.Startup.remembered(tmp_path)
    assert again.expected == {"convert": startup.TYPICAL_S["convert"], "load": 3.5, "seed": 7.25, "index": 0.5}
    assert again.basis == "measured at the last start on this machine, typical elsewhere"
    (tmp_path / startup.TIMES_FILE).write_text("{not json")
    assert startup.Startup.remembered(tmp_path).expected == startup.TYPICAL_S


def test_terminal_and_page_show_every_stage_with_its_time():
    tr, clock = _tracker()
    tr.skip("convert", "already converted (model cache)")
    tr.begin("load")
    clock.t += startup.TYPICAL_S["load"] / 2
    half = f"{startup.TYPICAL_S['load'] / 2:.1f} s"
    lines = startup.terminal_lines(tr.snapshot())
    assert len(lines) == 4
    assert "skip" in lines[0] and "already converted" in lines[0]
    assert (
        "loading the model" in lines[1]
        and f"{half} of ~{startup.TYPICAL_S['load']:.0f} s expected" in lines[1]
        and "50%" in lines[1]
    )
    assert lines[2].endswith("wait")
    page = startup.status_html(tr.snapshot(), "ready text")
    assert "Starting: loading the model" in page and page.count("<progress") == 4 and 'value="50"' in page
    assert "ready text" not in page
    for key in ("load", "seed", "index"):
        tr.finish(key) if key == "load" else tr.skip(key, "x")
    done = startup.status_html(tr.snapshot(), "Library: 3 artifacts.")
    assert "Library: 3 artifacts." in done and "<progress" not in done and f"started in {half} (loading {half})" in done


def test_printer_on_a_log_file_prints_at_stage_changes_and_stops_when_ready():
    import io

    tr, clock = _tracker()
    out = io.StringIO()
    printer = startup.TerminalProgress(tr, stream=out, every_s=3600)
    t = printer.start()
    for key in ("convert", "load", "seed", "index"):
        tr.begin(key)
        time.sleep(0.7)
        clock.t += 1
        tr.finish(key)
        time.sleep(0.7)
    t.join(timeout=5)
    assert not t.is_alive()
    text = out.getvalue()
    assert "\x1b[" not in text  # no cursor moves in a file
    assert text.count("kvgraft start-up:") >= 5 and "  building the index" in text.splitlines()[-1]
    assert text.rstrip().splitlines()[-5] == "kvgraft start-up: 4.0 s"


# ---- the gate ----------------------------------------------------------------------------------


class FakeLibrary:
    """Counts what reaches it; `lm` stands for the model load that the gate must not trigger."""

    model_name = None

    def __init__(self, load_s: float = 0.0, fail: Exception | None = None, n: int = 0):
        self.loaded, self.answers, self.load_s, self.fail, self.n = 0, 0, load_s, fail, n
        self.others = 0
        self.store = "the store"

    @property
    def model_loaded(self) -> bool:
        return self.loaded > 0

    @property
    def lm(self):
        time.sleep(self.load_s)
        if self.fail:
            raise self.fail
        self.loaded += 1
        return SimpleNamespace(info=SimpleNamespace(name="fake", num_layers=2))

    def count(self) -> int:
        return self.n

    def holds_own(self) -> bool:
        return self.n > self.others  # `others`: artifacts of other models in the store

    def answer(self, question: str, options=None, on_token=None) -> str:
        self.answers += 1
        return f"answered {question}"

    def index(self):
        return SimpleNamespace(ids=lambda: {"a", "b"})

    def start_decoding_together(self) -> str:
        return "answers decode one at a time"


def test_gate_refuses_model_calls_with_the_stage_until_ready_and_never_loads():
    lib = FakeLibrary()
    tr, _ = _tracker()
    gate = startup.StartingLibrary(lib, tr)
    assert gate.count() == 0 and gate.store == "the store"  # reads and the store pass at once
    with pytest.raises(AttributeError):
        gate._catalog  # noqa: B018  (nothing outside the door passes through)
    ask = gate.answer  # taking the method is not calling it (handlers pass `library.answer` along)
    with pytest.raises(NotReady) as exc:
        ask("q")
    assert str(exc.value).startswith("Still starting: converting the model (stage 1 of 4)")
    assert isinstance(exc.value, KvgraftError)  # handlers turn it into the message the user sees
    with pytest.raises(NotReady):
        gate.lm  # noqa: B018
    assert lib.loaded == 0 and lib.answers == 0
    for key in ("convert", "load", "seed", "index"):
        tr.skip(key, "x")
    assert ask("q") == "answered q" and gate.lm.info.name == "fake" and lib.answers == 1


def test_run_records_each_stage_and_seeds_only_an_empty_store(monkeypatch, tmp_path):
    seeded = []

    def seed(library, on_progress):
        on_progress(0.5, "half")
        seeded.append(library)
        library.n = 3
        return 3

    monkeypatch.setenv("KVGRAFT_MODEL", str(tmp_path))  # a local folder: nothing to convert
    lib = FakeLibrary()
    tr = startup.Startup()
    startup.run(lib, tr, seed=seed, remember_in=tmp_path / "cache")
    states = {s.key: (s.state, s.detail) for s in tr.snapshot().stages}
    assert states == {
        "convert": ("skipped", "not needed (read from the GGUF, or converted in the model cache)"),
        "load": ("done", "fake, 2 layers"),
        "seed": ("done", "3 artifacts (3 new)"),
        "index": ("done", "2 vectors"),
    }
    assert tr.ready and seeded == [lib] and lib.loaded == 1
    assert set(json.loads((tmp_path / "cache" / startup.TIMES_FILE).read_text())) == {"load", "seed", "index"}
    tr2 = startup.Startup()
    startup.run(lib, tr2, seed=seed)  # the store holds artifacts now: no second seeding
    assert seeded == [lib] and tr2.snapshot().stages[2].detail == "the store holds 3 artifacts"
    assert tr2.snapshot().stages[0].detail == "model given by the caller"
    other = FakeLibrary()  # a store holding only another model's artifacts is seeded for this one
    other.n = other.others = 2
    startup.run(other, startup.Startup(), seed=seed)
    assert seeded == [lib, other]


def test_run_ends_by_collecting_then_freezing_what_start_up_built(monkeypatch, tmp_path):
    """What start-up built leaves the collector's generations (gc.freeze), after its garbage is collected: a cycle
    nothing refers to is freed, not kept for good."""
    import gc
    import weakref

    class Node:
        pass

    monkeypatch.setenv("KVGRAFT_MODEL", str(tmp_path))
    gc.unfreeze()  # what earlier tests froze goes back to the generations
    assert gc.get_freeze_count() == 0
    gc.disable()  # no automatic collection: only start-up's own can free the cycle
    try:
        cycle = Node()
        cycle.me = cycle
        gone = weakref.ref(cycle)
        del cycle
        startup.run(FakeLibrary(), startup.Startup(), seed=lambda library, on_progress: 0)
        assert gc.get_freeze_count() > 0 and gone() is None
    finally:
        gc.enable()
        gc.unfreeze()


def test_a_failed_load_keeps_the_app_up_and_says_so(monkeypatch, tmp_path):
    monkeypatch.setenv("KVGRAFT_MODEL", str(tmp_path))
    tr = startup.Startup()
    lib = FakeLibrary(fail=OSError("disk full"))
    startup.run(lib, tr, seed=lambda library, on_progress: 0)
    snap = tr.snapshot()
    assert snap.model_failed == "OSError: disk full" and not snap.ready
    assert [s.state for s in snap.stages] == ["skipped", "failed", "skipped", "skipped"]
    with pytest.raises(NotReady, match=r"^The model failed to load \(OSError: disk full\)"):
        startup.StartingLibrary(lib, tr).answer("q")
    assert "The model failed to load: OSError: disk full" in startup.status_html(snap, "x")


def test_the_slow_load_hook_holds_the_load_stage(monkeypatch, tmp_path):
    monkeypatch.setenv("KVGRAFT_MODEL", str(tmp_path))
    monkeypatch.setenv(startup.SLOW_LOAD_ENV, "0.6")
    tr = startup.Startup()
    t = startup.start(FakeLibrary(), tr)
    time.sleep(0.3)
    assert tr.snapshot().current.key == "load" and not tr.ready
    t.join(timeout=10)
    assert tr.ready and tr.snapshot().stages[1].elapsed_s >= 0.6


# ---- hosting -------------------------------------------------------------------------------------

SPACE_ENV = {"SYSTEM": "spaces", "SPACE_ID": "someone/kvgraft"}


def test_local_defaults_are_loopback_and_writable():
    h = hosting.detect({})
    assert (h.on_space, h.host, h.port, h.home, h.model_cache, h.read_only, h.notices()) == (
        False,
        "127.0.0.1",
        7860,
        None,
        None,
        False,
        [],
    )
    assert h.url == "http://127.0.0.1:7860"


def test_space_with_persistent_storage_keeps_store_and_model_under_data(tmp_path):
    h = hosting.detect(SPACE_ENV, data_root=tmp_path)
    assert (h.on_space, h.space_id, h.host, h.port) == (True, "someone/kvgraft", "0.0.0.0", 7860)
    assert (h.home, h.model_cache, h.persistent) == (tmp_path / "kvgraft", tmp_path / "kvgraft-models", True)
    assert h.read_only and h.url == "http://127.0.0.1:7860"
    assert [n.split(":")[0] for n in h.notices()] == ["Read-only public demo"]
    env: dict = {}
    hosting.apply(h, env)
    assert env == {"KVGRAFT_HOME": str(tmp_path / "kvgraft"), "KVGRAFT_MODEL_CACHE": str(tmp_path / "kvgraft-models")}
    with_token = hosting.detect({**SPACE_ENV, "KVGRAFT_ADMIN_TOKEN": "t"}, data_root=tmp_path)
    assert not with_token.read_only and with_token.notices() == []


def test_space_without_storage_says_the_store_is_ephemeral(tmp_path):
    missing = tmp_path / "no-data"
    h = hosting.detect({"SPACE_ID": "x/y"}, data_root=missing)
    assert h.on_space and not h.persistent and h.home is None
    assert h.notices()[0].startswith("This Space has no persistent storage: the store")
    (tmp_path / "data").mkdir()
    explicit = hosting.detect({**SPACE_ENV, "KVGRAFT_HOME": str(tmp_path / "elsewhere")}, data_root=tmp_path / "data")
    assert explicit.home == tmp_path / "elsewhere" and not explicit.persistent  # the operator's choice wins, and is named
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    assert not hosting.detect(SPACE_ENV, data_root=not_a_folder).persistent
    readonly = tmp_path / "ro"
    readonly.mkdir()
    readonly.chmod(0o500)
    try:
        # As root a mode-0500 folder is still writable, and then it is persistent storage indeed.
        assert hosting.detect(SPACE_ENV, data_root=readonly).persistent == os.access(readonly, os.W_OK)
    finally:
        readonly.chmod(0o700)


# ---- python app.py on a (simulated) Space --------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _read_lines(stream, into: list[str]) -> None:
    for line in stream:
        into.append(line)


def test_app_started_as_a_space_serves_at_once_as_a_read_only_demo(tiny_dirs, tmp_path):
    gradio_client = pytest.importorskip("gradio_client")
    port = _free_port()
    env = dict(os.environ, **SPACE_ENV)
    env.update(
        GRADIO_SERVER_NAME="127.0.0.1",  # the test's explicit override; a Space binds 0.0.0.0:7860 (asserted above)
        GRADIO_SERVER_PORT=str(port),
        KVGRAFT_MODEL=str(tiny_dirs["gemma3"]),
        KVGRAFT_HOME=str(tmp_path / "home"),
        KVGRAFT_MODEL_CACHE=str(tmp_path / "models"),
        GRADIO_TEMP_DIR=str(tmp_path / "gradio"),
        **{startup.SLOW_LOAD_ENV: "15", boot.SLOW_IMPORT_ENV: "3"},
    )
    env.pop("KVGRAFT_ADMIN_TOKEN", None)
    proc = subprocess.Popen(
        [sys.executable, "app.py"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines: list[str] = []
    threading.Thread(target=_read_lines, args=(proc.stdout, lines), daemon=True).start()
    url = f"http://127.0.0.1:{port}/"
    placeholder = []  # the stages the placeholder page reported while Gradio was imported
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, "".join(lines)
            try:
                with urllib.request.urlopen(url + "config", timeout=2) as r:
                    config = json.loads(r.read())
                break
            except urllib.error.HTTPError as exc:  # the placeholder: 503 + Retry-After on every path but its own
                assert exc.code == 503 and exc.headers["Retry-After"] == str(boot.RETRY_AFTER_S)
                with contextlib.suppress(OSError), urllib.request.urlopen(url + boot.STATUS_PATH[1:], timeout=2) as r:
                    placeholder.append(json.loads(r.read())["stage"])  # (suppressed: the handover came in between)
            except OSError:
                assert time.monotonic() < deadline, "".join(lines)
            time.sleep(0.3)
        assert "loading the web framework" in placeholder
        ours = [line for line in lines if line.startswith("kvgraft:")]
        assert ours[0].startswith(f"kvgraft: http://127.0.0.1:{port}  (bound to 127.0.0.1:{port}")  # the URL comes first
        assert ours[1].startswith("kvgraft: a placeholder page answers there after ")
        texts = json.dumps(config)
        assert "This Space has no persistent storage" in texts and "Read-only public demo" in texts
        tabs = [c["props"].get("label") for c in config["components"] if c.get("type") == "tabitem"]
        assert "Deposit" not in tabs and "Chat" in tabs
        client = gradio_client.Client(url, verbose=False)
        with pytest.raises(Exception, match=r"Still starting: loading the model \(stage 2 of 4\)"):
            client.predict("Who founded the town of Velmora?", api_name="/answer")
        with pytest.raises(Exception, match="KVGRAFT_ADMIN_TOKEN"):
            client.predict("guess", question="q", solution="s", answer="a", reference="a", api_name="/deposit")
        from access import uploads  # a public demo takes no upload from anyone, the token header neither

        files = lambda: sorted((tmp_path / "gradio").rglob("*"))  # noqa: E731
        before = files()
        for headers in ({}, {"X-Kvgraft-Admin-Token": "guess"}):
            req = urllib.request.Request(
                url + "gradio_api/upload",
                data=b'--b\r\nContent-Disposition: form-data; name="files"; filename="x"\r\n\r\nx\r\n--b--\r\n',
                headers={"Content-Type": "multipart/form-data; boundary=b", **headers},
            )
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(req, timeout=10)
            assert refused.value.code == 403 and json.loads(refused.value.read())["detail"] == uploads.NO_TOKEN
        assert files() == before
        while True:
            try:
                r = client.predict("Who founded the town of Velmora?", max_new_tokens=4, api_name="/answer")
                break
            except Exception as exc:
                assert "Still starting" in str(exc) and time.monotonic() < deadline + 120, "".join(lines)
                time.sleep(1)
        assert r["tier"] in ("exact", "none") and r["ledger_id"] == 1
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    out = "".join(lines)
    assert "page served at" in out and "loading the model" in out


# ---- the page path loads no engine -------------------------------------------------------------

HEAVY = ("torch", "transformers", "faiss", "sentence_transformers", "safetensors", "matplotlib")
PAGE_PATH = """
import sys
import services
from web import app, hosting
from web.startup import Startup, model_cache
where = hosting.detect()
library = services.Library()
tracker = Startup.remembered(model_cache())
app.build_app(library, admin_token="t", startup=tracker, where=where)
print(library.count())
print(sorted({m.split('.')[0] for m in sys.modules} & set(sys.argv[1:])))
"""


def test_the_page_path_imports_no_torch_transformers_faiss_or_matplotlib(tmp_path):
    """What `python app.py` runs before `launch()` (import app, the Library over an empty store, the
    remembered estimates, every tab built) must leave the engine unloaded: it loads in the background
    start-up, so the page comes as soon as Gradio can serve it."""
    env = dict(os.environ, KVGRAFT_HOME=str(tmp_path / "home"), KVGRAFT_MODEL_CACHE=str(tmp_path / "models"))
    done = subprocess.run([sys.executable, "-c", PAGE_PATH, *HEAVY], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    count, loaded = done.stdout.strip().splitlines()[-2:]
    assert count == "0"  # the catalog was opened and read, without the engine
    assert loaded == "[]", f"the page path imported {loaded}; import them inside the function that needs them"


def test_the_cli_and_upkeep_modules_import_no_torch_either():
    code = "import sys, services, cli, cli.upkeep, cli.evaluation, web.handlers, web.views, web.solve_tab; print(sorted({m.split('.')[0] for m in sys.modules} & set(sys.argv[1:])))"
    done = subprocess.run([sys.executable, "-c", code, *HEAVY], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]", done.stdout


def test_seeding_goes_on_past_an_item_the_gate_refuses(tmp_path, caplog):
    """One seed implementation (services/seed.py) for the app, `cli.py seed` and `verify`: a refused item
    is logged and left out, every other item and fact sheet is still deposited."""
    import json

    from errors import VerificationFailed
    from services import seed

    folder = tmp_path / "seed"
    folder.mkdir()
    items = [
        {"question": f"Q{i}?", "solution": f"S{i}.", "answer": str(i), "verifier": "exact", "reference": str(i)} for i in range(3)
    ]
    (folder / "items.jsonl").write_text("".join(json.dumps(it) + "\n" for it in items))
    (folder / "sheet.txt").write_text("A fact sheet.\n")

    class Recorder:  # records what reached the library; the second item is refused as the gate would
        def __init__(self):
            self.deposited = []

        def deposit_item(self, **it):
            if it["question"] == "Q1?":
                raise VerificationFailed("the model answered 'x' with the graft; the reference is '1'; nothing deposited")
            self.deposited.append(it["question"])
            return type("D", (), {"created": True})()

        def deposit_text(self, text, **kw):
            self.deposited.append(kw["title"])
            return type("D", (), {"created": True})()

    lib = Recorder()
    with caplog.at_level("WARNING", logger="kvgraft.seed"):
        assert seed.seed_library(lib, folder) == 3
    assert lib.deposited == ["Q0?", "Q2?", "sheet"]
    assert "seed item refused by the gate: the model answered 'x'" in caplog.text
