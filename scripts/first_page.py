"""Measure what a new user waits for: seconds from `python app.py` (what `make run` starts after its
install step) to the first HTTP 200 (the placeholder page `web/placeholder.py` serves while Gradio is imported), to the
app's own page, and to the first answer, on a fresh clone with a throwaway store.

By default the committed HEAD of this checkout is `git clone`d into a temp folder (no bytecode caches,
no store) and the model cache is an empty temp folder too, so the packaged model is read from its GGUF as on a
fresh machine; only the venv (this Python) is reused (and fma16's kernel cache, KVGRAFT_KERNEL_CACHE). `--in-place` runs `--checkout` as it is;
`--model-cache DIR` reuses a converted model (a warm start). Prints one JSON object.

    python -m scripts.first_page [--checkout DIR] [--in-place] [--model-cache DIR] [--model NAME] [--timeout-s 900]

`stages_s` are the app's start-up stages (convert, load, seed: bringing in the built-in library with its
proof, index) as it measured them; `app_cpu_s_at_first_answer` the app's CPU seconds until then.
`app_says` are the app's own lines: seconds from its first import to the placeholder and to the page,
with the CPU seconds of the latter (what a machine shared with other jobs does not inflate). `gradio_import`
is the floor measured just before, in the same run: a bare `import gradio` in this Python (wall and CPU seconds). `load` is
the load average at the start and the end. Run it on a quiet machine for the figure.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

QUESTION = "Who founded the town of Velmora?"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


PLACEHOLDER_MARK = b"<h1>kvgraft is starting</h1>"  # web/placeholder.py's page, served while Gradio is imported


def _page(url: str) -> str | None:
    """Who answers `url` with HTTP 200: "placeholder" (web/placeholder.py's page), "app" (Gradio's), or None (nobody yet)."""
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            if r.status != 200:
                return None
            return "placeholder" if PLACEHOLDER_MARK in r.read() else "app"
    except OSError:
        return None


def _child_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def gradio_import() -> dict:
    """The floor: wall and CPU seconds of a bare `import gradio` in a fresh process of this Python."""
    t, cpu = time.perf_counter(), _child_cpu()
    subprocess.run([sys.executable, "-c", "import gradio"], check=True, capture_output=True)
    return {"wall_s": round(time.perf_counter() - t, 1), "cpu_s": round(_child_cpu() - cpu, 1)}


def _process_cpu(pid: int) -> float | None:
    """CPU seconds (user + system) the process has used so far, from /proc (None elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return round((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), 1)


def _stage_seconds(model_cache: Path, proc, t0: float, timeout_s: float) -> dict:
    """The app's own start-up stages in seconds (convert, load, seed: the built-in library's import and its
    proof, index), as it remembers them in the model cache once the start-up is done (web/startup.py)."""
    path = model_cache / "kvgraft-startup-times.json"
    while not path.exists() and proc.poll() is None and time.perf_counter() - t0 < timeout_s:
        time.sleep(0.2)  # the index stage may still be finishing after the first answer
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _clone(checkout: Path, into: Path) -> str:
    """`git clone` of the checkout's committed HEAD (what a new user gets); returns its commit."""
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(checkout), str(into)], check=True)
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=into, check=True, capture_output=True, text=True).stdout.strip()


def measure(checkout: Path, model_cache: Path | None, timeout_s: float, clone: bool = True, model: str | None = None) -> dict:
    from gradio_client import Client

    with tempfile.TemporaryDirectory(prefix="kvgraft-first-page-") as tmp:
        load_before = os.getloadavg()[0]
        floor = gradio_import()
        where = f"as it is: {checkout}"
        if clone:
            commit = _clone(checkout, Path(tmp) / "clone")
            checkout, where = Path(tmp) / "clone", f"fresh git clone of {checkout} at {commit[:12]}"
        port = _free_port()
        env = dict(os.environ, KVGRAFT_HOME=str(Path(tmp) / "home"), GRADIO_SERVER_NAME="127.0.0.1", GRADIO_SERVER_PORT=str(port))
        models = model_cache or Path(tmp) / "models"
        env["KVGRAFT_MODEL_CACHE"] = str(models)
        for var in ("SYSTEM", "SPACE_ID", "KVGRAFT_MODEL", "KVGRAFT_DB_URL"):
            env.pop(var, None)
        if model:
            env["KVGRAFT_MODEL"] = model
        url = f"http://127.0.0.1:{port}/"
        log = open(Path(tmp) / "app.log", "w")  # noqa: SIM115  (closed below, after the process)
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "app.py"], cwd=checkout, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            first_200 = first_by = None
            while (who := _page(url)) != "app":
                if who and first_200 is None:
                    first_200, first_by = time.perf_counter() - t0, who
                if proc.poll() is not None or time.perf_counter() - t0 > timeout_s:
                    raise SystemExit(
                        f"no page after {time.perf_counter() - t0:.0f} s:\n{(Path(tmp) / 'app.log').read_text()[-3000:]}"
                    )
                time.sleep(0.1)
            first_page = time.perf_counter() - t0
            if first_200 is None:
                first_200, first_by = first_page, "app"
            print(
                f"first HTTP 200 ({first_by}) after {first_200:.1f} s, the app's page after {first_page:.1f} s; "
                "waiting for the first answer...",
                file=sys.stderr,
                flush=True,
            )
            client, tries, answer, slowest_page, timeouts = None, 0, None, 0.0, 0
            while answer is None:
                tries += 1
                t = time.perf_counter()
                _page(url)  # how long the page takes while the model arrives
                slowest_page = max(slowest_page, time.perf_counter() - t)
                try:  # the client too is made in the loop: on a busy machine its config read may time out
                    client = client or Client(url, verbose=False, httpx_kwargs={"timeout": 60})
                    answer = client.predict(QUESTION, check=False, max_new_tokens=16, api_name="/answer")
                except Exception as exc:  # "Still starting: ..." until the model is in
                    slow = type(exc).__name__ in ("ReadTimeout", "TimeoutException", "ConnectTimeout")
                    timeouts += slow
                    if not (slow or "Still starting" in str(exc)) or time.perf_counter() - t0 > timeout_s:
                        raise
                    time.sleep(0.25)  # a user's click lands any time: a coarse poll would add up to its period
            first_answer = time.perf_counter() - t0
            app_cpu = _process_cpu(proc.pid)
            stages = _stage_seconds(models, proc, t0, timeout_s)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            log.close()
        said = (Path(tmp) / "app.log").read_text().splitlines()
        served = [line for line in said if "page served at" in line or "placeholder page answers" in line]
        return {
            "first_http_200_s": round(first_200, 1),
            "first_http_200_from": first_by,
            "first_app_page_s": round(first_page, 1),
            "app_says": served,
            "first_answer_s": round(first_answer, 1),
            "app_cpu_s_at_first_answer": app_cpu,
            "stages_s": stages,
            "answer": answer["answer"],
            "tier": answer["tier"],
            "asks_before_ready": tries - 1,
            "slowest_page_while_starting_s": round(slowest_page, 2),
            "client_timeouts_while_starting": timeouts,
            "gradio_import": floor,
            "load": [round(load_before, 1), round(os.getloadavg()[0], 1)],
            "model": model or "packaged:gemma-3-270m (the default)",
            "model_cache": "given: " + str(model_cache) if model_cache else "empty temp folder",
            "checkout": where,
            "python": sys.executable,
        }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkout", type=Path, default=Path(__file__).resolve().parents[1])
    ap.add_argument("--in-place", action="store_true", help="run the checkout as it is instead of a fresh clone of its HEAD")
    ap.add_argument("--model-cache", type=Path, default=None)
    ap.add_argument("--timeout-s", type=float, default=900)
    ap.add_argument("--model", default=None, help="KVGRAFT_MODEL for the app (default: the packaged Gemma)")
    ap.add_argument("--runs", type=int, default=1, help="starts measured one after the other (the median is reported)")
    ap.add_argument("--out", type=Path, default=None, help="also write the runs and their medians to this JSON file")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    runs = []
    for i in range(args.runs):
        runs.append(measure(args.checkout.resolve(), args.model_cache, args.timeout_s, clone=not args.in_place, model=args.model))
        print(f"run {i + 1}/{args.runs}: first answer after {runs[-1]['first_answer_s']} s", file=sys.stderr, flush=True)
    doc = runs[0] if args.runs == 1 else {"runs": runs, **medians(runs)}
    print(json.dumps(doc, indent=2))
    if args.out is not None:
        args.out.write_text(
            json.dumps({"benchmark": "first_page", "date": time.strftime("%Y-%m-%d"), "runs": runs, **medians(runs)}, indent=2)
            + "\n"
        )
    return 0


def medians(runs: list[dict]) -> dict:
    """The median of each headline figure over `runs`, and of each start-up stage."""
    import statistics

    out = {
        f"median_{k}": statistics.median(r[k] for r in runs) for k in ("first_http_200_s", "first_app_page_s", "first_answer_s")
    }
    stages = sorted({k for r in runs for k in r["stages_s"]})
    out["median_stages_s"] = {k: round(statistics.median(r["stages_s"].get(k, 0.0) for r in runs), 2) for k in stages}
    return out


if __name__ == "__main__":
    sys.exit(main())
