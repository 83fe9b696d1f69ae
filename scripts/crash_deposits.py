"""Crash safety: SIGKILL a process at random points of a deposit, an import or an `fsck --repair`, and
check the store after each kill.

A child process opens a `services.Library` on the tiny Gemma-3 model with the hash embedder and runs
one operation in a loop, printing `committed <id>` for every artifact the operation acknowledged
(after it returned): `deposit` deposits texts (some as chain children); `import` imports bundles made
beforehand from another store (each bundle's artifacts are acknowledged when the import returns);
`repair` deposits one text, then leaves an orphan blob, a partial file and no index behind, and runs
`fsck --repair` over them. The parent kills it with SIGKILL after a random delay, then checks with
`services.fsck`: no catalog row without its blob, no corrupt blob, every blob on disk hash-valid,
no partial file visible as a blob, and every id any child ever printed is in the catalog. Orphan
blobs, partial files and an index caught between its two files ("half-saved") are allowed (a kill
between the blob write and the commit, or inside a save, leaves them; fsck --repair removes them), and
are repaired before the next round so that every round starts clean.

    python -m scripts.crash_deposits --kills 50                                # the deposit figures
    python -m scripts.crash_deposits --kills 100 --fork --ops deposit,import,repair   # spread over three
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import select
import signal
import subprocess
import sys
import tempfile
import time
import traceback
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


def _import_loop(lib, seed: int, tag: str = "") -> None:
    """Import the prepared bundles forever (those not yet in the store first), announcing each bundle's
    artifacts once its import returned."""
    import services

    rng = random.Random(seed)
    bundles = json.loads((lib.home.parent / "bundles" / "bundles.json").read_text())
    first = True
    while True:
        have = set(lib.artifact_ids())
        todo = [b for b in bundles if not set(b["ids"]) <= have] or bundles  # all in: re-import (no new rows)
        b = rng.choice(todo)
        r = services.import_bundle(lib, lib.home.parent / "bundles" / b["file"])
        for i in r.artifacts:
            _say(f"{tag}committed {i}")
        if first:
            _say(f"{tag}ready")
            first = False


def _repair_loop(lib, seed: int, tag: str = "") -> None:
    """Deposit one text, then leave an orphan blob, a partial file and no index, and `fsck --repair` them."""
    import shutil

    import services
    from files import write_atomic

    rng = random.Random(seed)
    i = 0
    while True:
        d = lib.deposit_text(f"Repair round {seed}-{i}: {rng.random():.12f} is the number of this note.")
        _say(f"{tag}committed {d.id}")
        data = rng.randbytes(4096)  # a hash-valid blob no row refers to, as a deposit killed before its commit leaves

        orphan = lib.blob_file(hashlib.sha256(data).hexdigest())
        write_atomic(orphan, data)  # as the blob store writes: a kill inside leaves a .part file, never a half blob
        partial = orphan.parent / f".tmp-{seed}-{i}.part"
        partial.write_bytes(rng.randbytes(1024))
        for p in (orphan, partial):
            os.utime(p, (0, 0))
        shutil.rmtree(lib.home / "index", ignore_errors=True)
        services.fsck(lib, repair=True, grace_s=0)
        if i == 0:
            _say(f"{tag}ready")
        i += 1


LOOPS = {"deposit": _deposit_loop, "import": _import_loop, "repair": _repair_loop}


def prepare_bundles(work: Path, model_dir: str | None = None, lm=None, count: int = 40) -> None:
    """`count` bundles for the import children, made from a store of their own: one artifact each, and
    every fourth a chain of three; listed in <work>/bundles/bundles.json. Made by the process whose
    model configuration the children share (the thread count is part of the fingerprint): the parent
    for fresh children, the zygote for forked ones."""
    import services
    from retrieval import HashEmbedder

    folder = work / "bundles"
    folder.mkdir(parents=True, exist_ok=True)
    src = services.Library(home=work / "bundle-source", model_name=model_dir, lm=lm, embedder=HashEmbedder())
    listed = []
    for k in range(count):
        leaf = src.deposit_text(f"Bundle {k}: the imported note number {k} is kept whole or not at all.")
        if k % 4 == 0:
            for j in range(2):
                leaf = src.deposit_text(f"Bundle {k} part {j + 2}: chains travel with their parents.", parent=leaf.id)
        r = services.export_bundle(src, [leaf.id], folder / f"b{k:03d}.tar")
        listed.append({"file": f"b{k:03d}.tar", "ids": list(r.artifacts)})
    src.close()
    (folder / "bundles.json").write_text(json.dumps(listed))


def child(home: str, model_dir: str, seed: int, op: str = "deposit") -> None:
    """A fresh process: import everything, load the model, run `op` forever."""
    import services
    from retrieval import HashEmbedder

    LOOPS[op](services.Library(home=home, model_name=model_dir, embedder=HashEmbedder()), seed)


def zygote(home: str, model_dir: str, bundles: str = "no-bundles") -> None:
    """Load the model once, then fork one child per "<op> <seed>" line read from stdin and print its pid.

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
    if bundles == "bundles":
        prepare_bundles(Path(home).parent, lm=lm)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    sys.stdout.flush()
    _say("zygote ready")
    for line in sys.stdin:
        op, seed = line.split()[0], int(line.split()[1])
        pid = os.fork()
        if pid == 0:
            try:
                LOOPS[op](services.Library(home=home, lm=lm, embedder=HashEmbedder()), seed, tag=f"{seed} ")
            except BaseException:
                traceback.print_exc()  # on the zygote's stderr, which the parent shows when a child never gets ready
            finally:
                os._exit(1)
        _say(f"pid {seed} {pid}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


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


def _run_forked(home: Path, model_dir: str, kills: int, rng: random.Random, seed: int, max_delay_s: float, env: dict, ops):
    """Yield (op, delay, committed ids) per kill of a child forked from a warm zygote (no import per kill)."""
    z = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "scripts.crash_deposits",
            "--zygote",
            str(home),
            model_dir,
            "bundles" if "import" in ops else "no-bundles",
        ],
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
            op = ops[k % len(ops)]
            z.stdin.write(f"{op} {tag}\n".encode())
            z.stdin.flush()
            lines: list[str] = []
            pid = None
            give_up = time.monotonic() + 300
            while f"{tag} ready" not in lines or pid is None:  # the child may say ready before the zygote prints its pid
                assert time.monotonic() < give_up, f"no ready/pid line for child {tag} in 300 s; last lines: {lines[-5:]}"
                lines += out.read(60)
                pid = pid or next((int(x.split()[2]) for x in lines if x.startswith(f"pid {tag} ")), None)
                assert z.poll() is None, f"zygote died: {z.stderr.read().decode()[-2000:]}"
                if pid is not None and f"{tag} ready" not in lines and not _alive(pid):
                    lines += out.read(0.2)  # its last words may still be in the pipe
                    if f"{tag} ready" not in lines:
                        os.set_blocking(z.stderr.fileno(), False)
                        said = (z.stderr.read() or b"").decode(errors="replace")
                        raise AssertionError(f"child {tag} ({op}) died before it was ready: {said[-2000:]}")
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
            yield [op], [delay], [x.split()[2] for x in lines if x.startswith(f"{tag} committed ")]
    finally:
        if live is not None:  # an error while a child runs: kill it too, or it keeps the pipes open
            with contextlib.suppress(ProcessLookupError):
                os.kill(live, signal.SIGKILL)
        z.kill()
        z.communicate(timeout=60)


def _spawned(
    home: Path, model_dir: str, kills: int, parallel: int, rng: random.Random, seed: int, max_delay_s: float, env: dict, ops
):
    done = 0
    while done < kills:
        n = min(parallel, kills - done)
        round_ops = [ops[(done + j) % len(ops)] for j in range(n)]
        started = [_start(home, model_dir, seed * 1000 + done + j, env, round_ops[j]) for j in range(n)]
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
        yield round_ops, delays, committed


def _check(home: Path, model_dir: str, committed: set[str]) -> dict:
    """fsck the store after a kill against every id ever acknowledged (returned as `lost` when missing);
    raise AssertionError on any other inconsistency, repair leftovers."""
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
        lost = sorted(c for c in committed if c not in ids)  # counted by the caller, which must find none
        fixed = services.fsck(lib, repair=True, grace_s=0)
        assert fixed.consistent, f"store not consistent after repair: {fixed.to_json()}"
        return {
            "artifacts": rep.artifacts,
            "orphans": len(rep.orphans),
            "partials": len(rep.partials),
            "index": rep.index.status,
            "consistent_before_repair": rep.consistent,
            "lost": lost,
        }
    finally:
        lib.close()


def _start(home: Path, model_dir: str, seed: int, env: dict, op: str = "deposit") -> tuple[subprocess.Popen, list[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "scripts.crash_deposits", "--child", str(home), model_dir, str(seed), op],
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
    ops: tuple[str, ...] = ("deposit",),
) -> dict:
    """Kill `kills` processes at random points, `parallel` at a time on the same store, each running the
    next of `ops` in turn (deposit, import, repair), and check the store after each round against every
    id acknowledged so far; returns counts, in total and per operation. `fork`: children are forked from
    one warm process instead of started fresh (seconds per kill instead of an import of torch per kill).
    Acknowledged ids missing afterwards are counted in `lost` (must be 0); any other fault raises AssertionError."""
    import retrieval  # noqa: F401  (faiss before torch: see retrieval/__init__.py)
    from graft_core import tiny

    rng = random.Random(seed)
    work = Path(work or tempfile.mkdtemp(prefix="kvgraft-crash-"))
    home = work / "home"
    model_dir = str(tiny.build("gemma3", work / "tiny-gemma3"))
    if "import" in ops and not fork:
        prepare_bundles(work, model_dir)
    totals = {
        "kills": 0,
        "rounds": 0,
        "committed": 0,
        "lost": 0,
        "rounds_with_orphan_blob": 0,
        "partials_seen": 0,
        "index_stale_or_missing": 0,
        "index_half_saved": 0,
        "index_corrupt": 0,
        "rounds_inconsistent_before_repair": 0,
        "by_op": {op: {"kills": 0, "committed": 0} for op in ops},
    }
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    rounds = (
        _run_forked(home, model_dir, kills, rng, seed, max_delay_s, env, ops)
        if fork
        else _spawned(home, model_dir, kills, parallel, rng, seed, max_delay_s, env, ops)
    )
    done = 0
    acknowledged: set[str] = set()
    for round_ops, delays, committed in rounds:
        acknowledged.update(committed)
        state = _check(home, model_dir, acknowledged)
        totals["lost"] = len(state["lost"])  # of everything acknowledged so far: it only ever grows if one goes
        done += len(delays)
        totals["kills"] += len(delays)
        totals["rounds"] += 1
        totals["committed"] += len(committed)
        for op in round_ops:
            totals["by_op"][op]["kills"] += 1
        if len(round_ops) == 1:
            totals["by_op"][round_ops[0]]["committed"] += len(committed)
        totals["rounds_with_orphan_blob"] += int(state["orphans"] > 0)
        totals["partials_seen"] += state["partials"]
        totals["index_stale_or_missing"] += int(state["index"] in ("stale", "missing"))
        totals["index_half_saved"] += int(state["index"] == "half-saved")  # killed between the index's two files
        totals["index_corrupt"] += int(state["index"] == "corrupt")
        totals["rounds_inconsistent_before_repair"] += int(not state["consistent_before_repair"])
        totals["artifacts"] = state["artifacts"]
        log(
            f"kills {done}/{kills} ({'/'.join(round_ops)} after {', '.join(f'{d:.2f}' for d in delays)} s): "
            f"{len(committed)} committed this round, {state['artifacts']} in catalog, orphans {state['orphans']}, "
            f"partials {state['partials']}, index {state['index']}"
        )
    totals["acknowledged"] = len(acknowledged)
    return totals


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kills", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-delay", type=float, default=1.0, help="kill after a uniform random delay in [0, this] seconds")
    p.add_argument("--parallel", type=int, default=1, help="children depositing into the store at once, killed independently")
    p.add_argument("--work", default=None, help="folder for the store and the tiny model (default: a new temp folder)")
    p.add_argument("--fork", action="store_true", help="fork children from one warm process (fast; one kill at a time)")
    p.add_argument("--ops", default="deposit", help="what the killed children run, in turn: deposit, import, repair")
    p.add_argument("--zygote", nargs=3, metavar=("HOME", "MODEL_DIR", "BUNDLES"), help=argparse.SUPPRESS)
    p.add_argument("--child", nargs=4, metavar=("HOME", "MODEL_DIR", "SEED", "OP"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.zygote:
        zygote(*args.zygote)
        return 0
    if args.child:
        child(args.child[0], args.child[1], int(args.child[2]), args.child[3])
        return 0
    ops = tuple(args.ops.split(","))
    unknown = [o for o in ops if o not in LOOPS]
    if unknown:
        p.error(f"--ops takes {', '.join(LOOPS)}, got {', '.join(unknown)}")
    t0 = time.perf_counter()
    totals = run(
        args.kills, seed=args.seed, work=args.work, max_delay_s=args.max_delay, parallel=args.parallel, fork=args.fork, ops=ops
    )
    totals["seconds"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(totals, indent=2))
    if totals["lost"]:
        print(f"FAILED: {totals['lost']} acknowledged artifacts lost after {totals['kills']} SIGKILLs")
        return 1
    print(
        f"OK: {totals['kills']} SIGKILLs over {', '.join(ops)}, {totals['acknowledged']} acknowledged artifacts, none lost, "
        "store consistent after every kill"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
