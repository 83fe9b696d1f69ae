"""Crash safety: SIGKILL a depositing process at random points and check the store after each kill.

A child process (`--child`) opens a `services.Library` on the tiny Gemma-3 model with the hash
embedder and deposits texts (some as chain children) in a loop, printing `committed <id>` after each
deposit returns. The parent kills it with SIGKILL after a random delay, then checks with
`services.fsck`: no catalog row without its blob, no corrupt blob, every blob on disk hash-valid,
no partial file visible as a blob, and every id the child printed is in the catalog. Orphan blobs and
partial files are allowed (a kill between the blob write and the commit leaves them; fsck --repair
removes them), and are repaired before the next round so that every round starts clean.

    python -m scripts.crash_deposits --kills 50            # the figure in docs/RELIABILITY.md
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _say(line: str) -> None:
    """One protocol line in one write(2) to the pipe (atomic below PIPE_BUF): a SIGKILL can cut between
    two writes of a buffered print, and the half line left behind would swallow the next one (the
    zygote's pid line), so the parent would wait for it forever."""
    os.write(1, (line + "\n").encode())


def _deposit_loop(lib, seed: int, tag: str = "") -> None:
    """Deposit forever, announcing each committed id on stdout before the next one starts."""
    rng = random.Random(seed)
    parent = None
    i = 0
    while True:  # chains of three ~70-token deposits stay well inside the tiny model's 512 positions
        words = " ".join(rng.choice(["alpha", "beta", "gamma", "delta", "kv", "graft", "store", "fact"]) for _ in range(10))
        text = f"Note {seed}-{i}: {words}."
        d = lib.deposit_text(text, parent=parent if i % 3 else None)
        _say(f"{tag}committed {d.id}")
        if i == 0:  # the first deposit warms the model up; the kill window starts after it
            _say(f"{tag}ready")
        parent = d.id
        i += 1


def child(home: str, model_dir: str, seed: int) -> None:
    """A fresh process: import everything, load the model, deposit forever."""
    import services
    from retrieval import HashEmbedder

    _deposit_loop(services.Library(home=home, model_name=model_dir, embedder=HashEmbedder()), seed)


def zygote(home: str, model_dir: str) -> None:
    """Load the model once, then fork one depositing child per seed read from stdin and print its pid.

    One torch thread, and no forward pass before forking, so no OpenMP pool crosses a fork; each
    child opens its own Library (catalog connection) after the fork. Children are reaped by the
    kernel (SIGCHLD ignored)."""
    import torch

    os.environ["KVGRAFT_THREADS"] = "1"  # the pin (graft_core/determinism.py) applies it at load
    torch.set_num_threads(1)
    import services
    from graft_core import model as model_mod
    from retrieval import HashEmbedder

    lm = model_mod.load(model_dir)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    sys.stdout.flush()
    _say("zygote ready")
    for line in sys.stdin:
        seed = int(line)
        pid = os.fork()
        if pid == 0:
            try:
                _deposit_loop(services.Library(home=home, lm=lm, embedder=HashEmbedder()), seed, tag=f"{seed} ")
            finally:
                os._exit(1)
        _say(f"pid {seed} {pid}")


class _Lines:
    """Non-blocking line reader over a pipe."""

    def __init__(self, stream):
        self.fd = stream.fileno()
        self.buf = b""

    def read(self, timeout: float) -> list[str]:
        ready, _, _ = select.select([self.fd], [], [], max(timeout, 0))
        if ready:
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                raise EOFError("zygote closed its stdout")
            self.buf += chunk
        *lines, self.buf = self.buf.split(b"\n")
        return [x.decode().strip() for x in lines]


def _run_forked(home: Path, model_dir: str, kills: int, rng: random.Random, seed: int, max_delay_s: float, env: dict):
    """Yield (delay, committed ids) per kill of a child forked from a warm zygote (no import per kill)."""
    z = subprocess.Popen(
        [sys.executable, "-m", "scripts.crash_deposits", "--zygote", str(home), model_dir],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=ROOT,
    )
    out = _Lines(z.stdout)
    live = None  # the pid of a child not yet killed
    try:
        seen: list[str] = []
        while "zygote ready" not in seen:
            seen += out.read(120)
            assert z.poll() is None, f"zygote died: {z.stderr.read().decode()[-2000:]}"
        for k in range(kills):
            tag = str(seed * 1000 + k)
            z.stdin.write(f"{tag}\n".encode())
            z.stdin.flush()
            lines: list[str] = []
            pid = None
            give_up = time.monotonic() + 300
            while f"{tag} ready" not in lines or pid is None:  # the child may say ready before the zygote prints its pid
                assert time.monotonic() < give_up, f"no ready/pid line for child {tag} in 300 s; last lines: {lines[-5:]}"
                lines += out.read(60)
                pid = pid or next((int(x.split()[2]) for x in lines if x.startswith(f"pid {tag} ")), None)
                assert z.poll() is None, f"zygote died: {z.stderr.read().decode()[-2000:]}"
            live = pid
            delay = rng.uniform(0.0, max_delay_s)
            deadline = time.monotonic() + delay
            while (left := deadline - time.monotonic()) > 0:
                lines += out.read(left)
            os.kill(pid, signal.SIGKILL)
            while True:  # wait until the kernel has reaped it, then take what it wrote before dying
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.005)
            live = None
            lines += out.read(0.05)
            yield delay, [x.split()[2] for x in lines if x.startswith(f"{tag} committed ")]
    finally:
        if live is not None:  # an error while a child runs: kill it too, or it keeps the pipes open
            with contextlib.suppress(ProcessLookupError):
                os.kill(live, signal.SIGKILL)
        z.kill()
        z.communicate(timeout=60)


def _spawned(home: Path, model_dir: str, kills: int, parallel: int, rng: random.Random, seed: int, max_delay_s: float, env: dict):
    done = 0
    while done < kills:
        n = min(parallel, kills - done)
        started = [_start(home, model_dir, seed * 1000 + done + j, env) for j in range(n)]
        procs, lines = [p for p, _ in started], [ls for _, ls in started]
        delays = [rng.uniform(0.0, max_delay_s) for _ in range(n)]
        _kill_at(procs, lines, delays)
        committed = []
        for p, ls in zip(procs, lines):
            out, err = p.communicate(timeout=60)
            assert p.returncode == -signal.SIGKILL, f"child exited by itself ({p.returncode}): {err.decode()[-2000:]}"
            ls += out.decode().split("\n")
            committed += [x.split()[1] for x in ls if x.startswith("committed ")]
        done += n
        yield delays, committed


def _check(home: Path, model_dir: str, committed: list[str]) -> dict:
    """fsck the store after a kill; raise AssertionError on any inconsistency, repair leftovers."""
    import services
    from retrieval import HashEmbedder

    lib = services.Library(home=home, model_name=model_dir, embedder=HashEmbedder())
    try:
        rep = services.fsck(lib)
        assert not rep.missing, f"catalog rows without their blob: {rep.missing}"
        assert not rep.corrupt, f"corrupt blobs: {rep.corrupt}"
        bad = lib.corrupt_blobs()  # every visible blob, referenced or orphan, is complete and hash-valid
        assert not bad, f"blobs {bad} are visible but not hash-valid"
        assert not any(Path(p).name.endswith(".safetensors") for p in rep.partials), "a partial file looks like a blob"
        ids = set(lib.artifact_ids())
        lost = [c for c in committed if c not in ids]
        assert not lost, f"committed deposits lost after SIGKILL: {lost}"
        fixed = services.fsck(lib, repair=True, grace_s=0)
        assert fixed.consistent, f"store not consistent after repair: {fixed.to_json()}"
        return {
            "artifacts": rep.artifacts,
            "orphans": len(rep.orphans),
            "partials": len(rep.partials),
            "index": rep.index.status,
        }
    finally:
        lib.close()


def _start(home: Path, model_dir: str, seed: int, env: dict) -> tuple[subprocess.Popen, list[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "scripts.crash_deposits", "--child", str(home), model_dir, str(seed)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=ROOT,
    )
    lines: list[str] = []
    while (line := proc.stdout.readline().decode().strip()) != "ready":
        if not line:
            proc.kill()
            raise RuntimeError(f"deposit child did not start: {proc.stderr.read().decode()[-2000:]}")
        lines.append(line)
    return proc, lines


def _kill_at(procs: list[subprocess.Popen], lines: list[list[str]], delays: list[float]) -> None:
    """SIGKILL each child after its delay, draining every stdout meanwhile so no child ever blocks."""
    t0 = time.monotonic()
    alive = dict(enumerate(procs))
    while alive:
        now = time.monotonic() - t0
        for i in [i for i in alive if delays[i] <= now]:
            alive.pop(i).send_signal(signal.SIGKILL)
        if not alive:
            break
        wait = min(delays[i] for i in alive) - (time.monotonic() - t0)
        ready, _, _ = select.select([p.stdout for p in alive.values()], [], [], max(wait, 0))
        for i, p in list(alive.items()):
            if p.stdout in ready:
                got = p.stdout.readline()
                if got:
                    lines[i].append(got.decode().strip())


def run(
    kills: int,
    seed: int = 0,
    work: str | os.PathLike | None = None,
    max_delay_s: float = 1.0,
    parallel: int = 1,
    fork: bool = False,
    log=print,
) -> dict:
    """Kill `kills` deposit processes at random points, `parallel` at a time on the same store, and
    check the store after each round; returns counts. `fork`: children are forked from one warm
    process instead of started fresh (seconds per kill instead of an import of torch per kill). Raises AssertionError on a fault."""
    import retrieval  # noqa: F401  (faiss before torch: see retrieval/__init__.py)
    from graft_core import tiny

    rng = random.Random(seed)
    work = Path(work or tempfile.mkdtemp(prefix="kvgraft-crash-"))
    home = work / "home"
    model_dir = str(tiny.build("gemma3", work / "tiny-gemma3"))
    totals = {
        "kills": 0,
        "rounds": 0,
        "committed": 0,
        "rounds_with_orphan_blob": 0,
        "partials_seen": 0,
        "index_stale_or_missing": 0,
    }
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    rounds = (
        _run_forked(home, model_dir, kills, rng, seed, max_delay_s, env)
        if fork
        else _spawned(home, model_dir, kills, parallel, rng, seed, max_delay_s, env)
    )
    done = 0
    for delays, committed in rounds:
        delays = delays if isinstance(delays, list) else [delays]
        state = _check(home, model_dir, committed)
        done += len(delays)
        totals["kills"] += len(delays)
        totals["rounds"] += 1
        totals["committed"] += len(committed)
        totals["rounds_with_orphan_blob"] += int(state["orphans"] > 0)
        totals["partials_seen"] += state["partials"]
        totals["index_stale_or_missing"] += int(state["index"] != "ok")
        totals["artifacts"] = state["artifacts"]
        log(
            f"kills {done}/{kills} (after {', '.join(f'{d:.2f}' for d in delays)} s): {len(committed)} committed this round, "
            f"{state['artifacts']} in catalog, orphans {state['orphans']}, partials {state['partials']}, index {state['index']}"
        )
    return totals


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kills", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-delay", type=float, default=1.0, help="kill after a uniform random delay in [0, this] seconds")
    p.add_argument("--parallel", type=int, default=1, help="children depositing into the store at once, killed independently")
    p.add_argument("--work", default=None, help="folder for the store and the tiny model (default: a new temp folder)")
    p.add_argument("--fork", action="store_true", help="fork children from one warm process (fast; one kill at a time)")
    p.add_argument("--zygote", nargs=2, metavar=("HOME", "MODEL_DIR"), help=argparse.SUPPRESS)
    p.add_argument("--child", nargs=3, metavar=("HOME", "MODEL_DIR", "SEED"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.zygote:
        zygote(*args.zygote)
        return 0
    if args.child:
        child(args.child[0], args.child[1], int(args.child[2]))
        return 0
    t0 = time.perf_counter()
    totals = run(args.kills, seed=args.seed, work=args.work, max_delay_s=args.max_delay, parallel=args.parallel, fork=args.fork)
    totals["seconds"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(totals, indent=2))
    print(
        f"OK: {totals['kills']} SIGKILLs, {totals['committed']} committed deposits, none lost, store consistent after every kill"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
