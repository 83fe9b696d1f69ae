"""Fault sweeps: make every write of one store operation fail in turn, and check what the store is left with.

`faultfs.c` (beside this file) is built into a shared library and preloaded into a child process; the
child loads the tiny Gemma-3 model once and, for each operation (deposit, import, export, index rebuild,
ledger write) and each write point N of it (every write, pwrite, writev, fsync and fdatasync under the
store's folder, SQLite's own included), copies a prepared store, arms the Nth call to fail with the
errno given (ENOSPC staying full until "freed", or one EIO), runs the operation, disarms, and records:
the error (type and message), the blobs, partial files and catalog ids left, whether every artifact
stored before reads back byte-identical, fsck's verdict without repair, and the same operation run
again after the fault is gone (it must give what a fault-free run gives) with fsck after it. The
caller (tests/test_faults.py, bench/faults.py) judges the records.

    python -m scripts.sweeps --op deposit --errno ENOSPC      # one sweep: its records as JSON, problems on stderr
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno as errno_mod
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from services import AnswerOptions

ROOT = Path(__file__).resolve().parent.parent
OPS = ("deposit", "import", "export", "index", "ledger")
TEXT = "Fact sheet: the Orlen Gate of Vasska was rebuilt in the year of the long frost."
ROOT_TEXT = "The harbour of Vasska faces north. Its lighthouse is called the Grey Finger."
CHILD_TEXT = "The Grey Finger was built from basalt carried down from the Tarn hills."
OTHER_TEXTS = ("Quill moss grows only on the eastern cliffs of Sorrow Bay.", "Its spores glow faintly blue at dusk.")
QUESTION = "What is the lighthouse of Vasska called?"
AGAIN_TEXT = "Once the disk had room again, the Orlen Gate was painted green."

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def build_shim(out_dir: str | os.PathLike) -> Path:
    """Compile faultfs.c into `out_dir`/faultfs.so (gcc) and return its path."""
    out = Path(out_dir) / "faultfs.so"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        src = Path(__file__).with_name("faultfs.c")
        subprocess.run(["gcc", "-O2", "-Wall", "-shared", "-fPIC", "-o", str(out), str(src), "-ldl"], check=True)
    return out


# ---- the child: runs with faultfs preloaded ------------------------------------------------------


class _Shim:
    def __init__(self):
        lib = ctypes.CDLL(None)
        if not hasattr(lib, "kvfault_arm"):
            raise RuntimeError("faultfs is not preloaded: run the sweep through scripts.sweeps.sweep()")
        lib.kvfault_arm.argtypes = [ctypes.c_char_p, ctypes.c_long, ctypes.c_int, ctypes.c_int]
        lib.kvfault_calls.restype = ctypes.c_long
        lib.kvfault_faults.restype = ctypes.c_long
        lib.kvfault_first.restype = ctypes.c_char_p
        self.lib = lib

    def arm(self, prefix: Path, at: int, err: int, sticky: bool) -> None:
        self.lib.kvfault_arm(str(prefix).encode(), at, err, int(sticky))

    def disarm(self) -> tuple[int, int, str]:
        """Stop; returns (calls counted, calls failed, "<call> <path>" of the first failure)."""
        calls, faults, first = self.lib.kvfault_calls(), self.lib.kvfault_faults(), self.lib.kvfault_first()
        self.lib.kvfault_disarm()
        return calls, faults, first.decode(errors="replace")


def _prepare(work: Path, lm, embedder) -> dict:
    """The store every write point starts from (a chain of two, its index saved, one answer in the ledger)
    and a bundle of two other artifacts to import."""
    import services

    lib = services.Library(home=work / "pristine", lm=lm, embedder=embedder)
    root = lib.deposit_text(ROOT_TEXT)
    lib.deposit_text(CHILD_TEXT, parent=root.id)
    lib.answer(QUESTION, AnswerOptions(max_new_tokens=2))
    lib.index()
    ids = lib.artifact_ids()
    before = {i: bytes(lib.read_blob(lib.show(i).artifact.content_sha256)) for i in ids}
    lib.close()
    src = services.Library(home=work / "source", lm=lm, embedder=embedder)
    r2 = src.deposit_text(OTHER_TEXTS[0])
    leaf = src.deposit_text(OTHER_TEXTS[1], parent=r2.id)
    services.export_bundle(src, [leaf.id], work / "bundle.tar")
    src.close()
    return {"ids": ids, "before": before}


def _run_op(op: str, lib, work: Path, out: Path):
    """Run one operation; returns what a fault-free run must reproduce."""
    import services

    if op == "deposit":
        d = lib.deposit_text(TEXT)
        return {"id": d.id, "content_sha256": d.content_sha256, "bytes": d.bytes}
    if op == "import":
        r = services.import_bundle(lib, work / "bundle.tar")
        return {"new": sorted(r.new), "bundle_bytes": (work / "bundle.tar").stat().st_size}
    if op == "export":
        ids = lib.artifact_ids()
        blobs = sum(lib.blob_file(lib.show(i).artifact.content_sha256).stat().st_size for i in ids)
        r = services.export_bundle(lib, ids, out / "export.tar")
        return {"bundle_sha256": r.bundle_sha256, "blob_bytes": blobs}
    if op == "index":
        idx = lib.store.rebuild_index()
        return {"vectors": len(idx), "dim": lib.embedder.dim}
    if op == "ledger":
        r = lib.answer(QUESTION, AnswerOptions(max_new_tokens=2))
        return {"output": r.answer, "ledger_rows": len(lib.ledger())}
    raise ValueError(f"unknown operation {op!r}; one of {', '.join(OPS)}")


def _cause(e: BaseException) -> str:
    """Where an error came from: the chain of causes, SQLite's own error name where there is one."""
    parts = []
    while (e := e.__cause__ or e.__context__) is not None and len(parts) < 4:
        orig = getattr(e, "orig", None)
        name = getattr(orig, "sqlite_errorname", None)
        parts.append(f"{type(e).__name__}({name or getattr(e, 'errno', None) or ''})")
    return " <- ".join(parts)


def _observe(lib, prep: dict) -> dict:
    import services

    ids = lib.artifact_ids()
    exact = {}
    for i, data in prep["before"].items():
        try:
            exact[i] = bytes(lib.read_blob(lib.show(i).artifact.content_sha256)) == data
        except Exception as e:  # reported, judged by the caller
            exact[i] = f"{type(e).__name__}: {e}"
    rep = services.fsck(lib)
    return {
        "artifacts": sorted(ids),
        "blobs": sorted(p.name for p in lib.home.glob("blobs/??/??/*")),
        "strays": sorted(p.name for p in lib.home.glob(".import-*")),
        "exact": exact,
        "fsck_consistent": rep.consistent,
        "fsck_index": rep.index.status,
        "fsck_counts": rep.to_json()["counts"],
        "ledger_rows": len(lib.ledger()),
    }


def child(spec: dict) -> list[dict]:
    """Load the model once, prepare the store, then run every (operation, errno) sweep of `spec`."""
    import retrieval  # noqa: F401  (faiss before torch)
    import services
    from graft_core import model as model_mod
    from retrieval import HashEmbedder

    shim = _Shim()
    work = Path(spec["work"])
    lm = model_mod.load(spec["model_dir"])
    embedder = HashEmbedder()
    prep = _prepare(work, lm, embedder)
    lib = services.Library(home=work / "pristine", lm=lm, embedder=embedder)
    pristine = _observe(lib, prep)
    lib.close()

    def fresh(n: int):
        store, out = work / f"store-{n}", work / f"out-{n}"
        shutil.copytree(work / "pristine", store)
        out.mkdir()
        return services.Library(home=store, lm=lm, embedder=embedder), store, out

    def one(op: str, err: int, every: int) -> dict:
        sticky = err in (errno_mod.ENOSPC, errno_mod.EDQUOT)  # a full disk stays full; an I/O error is one call
        t_start = time.perf_counter()
        lib, store, out = fresh(0)  # the count: every write point of one fault-free run
        shim.arm(out if op == "export" else store, 0, err, sticky)
        clean = _run_op(op, lib, work, out)
        total, _, _ = shim.disarm()
        lib.close()
        shutil.rmtree(store)
        shutil.rmtree(out)
        points = range(1, total + 2) if every == 1 else sorted({*range(1, total + 1, every), total, total + 1})
        records = [_point(op, err, sticky, n, fresh) for n in points]
        return {
            "op": op,
            "errno": errno_mod.errorcode[err],
            "sticky": sticky,
            "write_points": total,
            "every": every,
            "clean": clean,
            "pristine": pristine,
            "records": records,
            "seconds": round(time.perf_counter() - t_start, 1),
        }

    def _point(op: str, err: int, sticky: bool, n: int, fresh) -> dict:
        lib, store, out = fresh(n)
        shim.arm(out if op == "export" else store, n, err, sticky)
        t0 = time.perf_counter()
        result = None
        try:
            result = _run_op(op, lib, work, out)
            error = None
        except Exception as e:
            error = {
                "type": type(e).__name__,
                "message": str(e),
                "mro": [c.__name__ for c in type(e).__mro__],
                "cause": _cause(e),
            }
        calls, faults, first = shim.disarm()
        where = first.split(" ", 1)
        rec = {
            "n": n,
            "calls": calls,
            "faults": faults,
            "call": where[0],
            "path": where[-1],
            "error": error,
            "result": result,
            "seconds": round(time.perf_counter() - t0, 3),
            "store": str(store),
            "out": str(out),
            "out_files": sorted(p.name for p in out.iterdir()),
            "after_fault": _observe(lib, prep),
        }
        try:  # the fault is gone: the same operation must now give what the fault-free run gave
            rec["retry"] = _run_op(op, lib, work, out)
        except Exception as e:
            rec["retry"] = {"error": f"{type(e).__name__}: {e}"}
        rec["after_retry"] = _observe(lib, prep)
        lib.close()
        again = services.Library(home=store, lm=lm, embedder=embedder)  # a new process's view: fresh connection
        rec["reopened"] = _observe(again, prep)
        again.close()
        shutil.rmtree(store)
        shutil.rmtree(out)
        return rec

    return [one(op, getattr(errno_mod, name), every) for op, name, every in spec["sweeps"]]


# ---- a real full file system -------------------------------------------------------------------


@contextlib.contextmanager
def small_filesystem(size_mb: int = 24) -> Iterator[Path]:
    """A tmpfs of `size_mb` MB mounted on a new temporary folder, unmounted and removed afterwards. Raises
    FilesystemUnavailable (saying why) where this process may not mount one (not root, no CAP_SYS_ADMIN)."""
    where = Path(tempfile.mkdtemp(prefix="kvgraft-fullfs-"))
    if os.geteuid() != 0:
        where.rmdir()
        raise FilesystemUnavailable("mounting a tmpfs needs root (with CAP_SYS_ADMIN); this process is not root")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(where)], capture_output=True, text=True)
    if proc.returncode != 0:
        where.rmdir()
        raise FilesystemUnavailable(f"mount -t tmpfs refused: {proc.stderr.strip() or proc.returncode}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)
        shutil.rmtree(where, ignore_errors=True)


class FilesystemUnavailable(RuntimeError):
    """No small file system can be mounted here."""


def fill(folder: Path) -> Path:
    """Write a filler file in `folder` until the file system refuses (ENOSPC), down to 4 KiB writes; returns it."""
    filler = folder / "filler"
    with open(filler, "wb", buffering=0) as f:
        for size in (1 << 20, 64 << 10, 4 << 10):
            block = b"\0" * size
            try:
                while True:
                    f.write(block)
            except OSError as e:
                if e.errno != errno_mod.ENOSPC:
                    raise
    return filler


def full_disk_run(mount: Path, model_dir: str | os.PathLike, lm, embedder) -> dict:
    """On the file system at `mount`: a store with a chain of two, an index and a ledger row; then the disk
    filled and every writing operation tried (the CLI's deposit in a process of its own); then the filler
    removed and every operation tried again. Returns what each step gave and what the store held."""
    import services

    store, exports = mount / "store", mount / "exports"
    exports.mkdir()
    lib = services.Library(home=store, lm=lm, embedder=embedder)
    root = lib.deposit_text(ROOT_TEXT)
    lib.deposit_text(CHILD_TEXT, parent=root.id)
    lib.answer(QUESTION, AnswerOptions(max_new_tokens=2))
    lib.index()
    prep = {"ids": lib.artifact_ids()}
    prep["before"] = {i: bytes(lib.read_blob(lib.show(i).artifact.content_sha256)) for i in prep["ids"]}
    before = _observe(lib, prep)
    side = Path(tempfile.mkdtemp(prefix="kvgraft-fullfs-side-"))
    src = services.Library(home=side / "source", lm=lm, embedder=embedder)
    leaf = src.deposit_text(OTHER_TEXTS[1], parent=src.deposit_text(OTHER_TEXTS[0]).id)
    services.export_bundle(src, [leaf.id], side / "bundle.tar")
    src.close()
    text_file = side / "text.txt"
    text_file.write_text(TEXT, encoding="utf-8")
    (side / "text2.txt").write_text(AGAIN_TEXT, encoding="utf-8")
    cli_deposit = [
        sys.executable,
        str(ROOT / "cli.py"),
        "--home",
        str(store),
        "--model",
        str(model_dir),
        "deposit",
        "--text-file",
    ]
    env = dict(os.environ, PYTHONPATH=str(ROOT))

    from db import bundles

    small_disk = bundles.Limits(disk_margin_bytes=_MB)  # the default keeps 256 MB free: more than this disk holds

    def attempt(name: str, fn) -> dict:
        try:
            return {"op": name, "ok": True, "result": fn()}
        except Exception as e:
            return {
                "op": name,
                "ok": False,
                "type": type(e).__name__,
                "mro": [c.__name__ for c in type(e).__mro__],
                "message": str(e),
            }

    def ops() -> list[dict]:
        return [
            attempt("deposit", lambda: lib.deposit_text(TEXT).to_json()),
            attempt("import", lambda: list(services.import_bundle(lib, side / "bundle.tar", limits=small_disk).new)),
            attempt("export", lambda: services.export_bundle(lib, lib.artifact_ids(), exports / "all.tar").bundle_sha256),
            attempt("index", lambda: len(lib.store.rebuild_index())),
            attempt("ledger", lambda: lib.answer(QUESTION, AnswerOptions(max_new_tokens=2)).answer),
        ]

    filler = fill(mount)
    free_when_full = shutil.disk_usage(mount).free
    cli_full = subprocess.run([*cli_deposit, str(text_file)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    full = ops()
    at_full = _observe(lib, prep)
    at_full["exports"] = sorted(p.name for p in exports.iterdir())
    filler_bytes = filler.stat().st_size
    filler.unlink()  # space freed: everything must work again, without a repair
    freed = ops()
    after = _observe(lib, prep)
    lib.close()
    cli_again = subprocess.run([*cli_deposit, str(side / "text2.txt")], capture_output=True, text=True, env=env, cwd=ROOT)
    bundle_bytes = (side / "bundle.tar").stat().st_size
    shutil.rmtree(side, ignore_errors=True)
    return {
        "store": str(store),
        "exports": str(exports),
        "filler_bytes": filler_bytes,
        "bundle_bytes": bundle_bytes,
        "free_when_full": free_when_full,
        "before": before,
        "cli_full": {"code": cli_full.returncode, "stdout": cli_full.stdout, "stderr": cli_full.stderr},
        "full": full,
        "at_full": at_full,
        "freed": freed,
        "after": after,
        "cli_again": {"code": cli_again.returncode, "stdout": cli_again.stdout, "stderr": cli_again.stderr},
    }


# ---- judging a sweep ---------------------------------------------------------------------------

_MB = 1 << 20


def _mb(n: int) -> int:
    return -(-n // _MB)


def expected_messages(result: dict, rec: dict) -> tuple[str, str]:
    """The two one-line errors a write point may give, (disk full, I/O error), spelled out here from the
    words of docs/RELIABILITY.md rather than from the product's own formatter."""
    op, clean = result["op"], result["clean"]
    store, out = rec["store"], rec["out"]
    home_hint = "or move KVGRAFT_HOME to a larger disk"
    folder, action, outcome, hint, mb = {
        "deposit": (store, "deposit again", "nothing was stored", home_hint, _mb(clean.get("bytes", 0) + _MB)),
        "import": (store, "import again", "nothing was stored", home_hint, _mb(2 * clean.get("bundle_bytes", 0) + _MB)),
        "export": (
            out,
            "export again",
            "nothing was written",
            "or export to a folder on another disk",
            _mb(clean.get("blob_bytes", 0) + _MB),
        ),
        "index": (
            store,
            "rebuild it again (`cli.py fsck --repair`)",
            "answers rebuild it in memory meanwhile",
            home_hint,
            _mb(2 * clean.get("vectors", 0) * clean.get("dim", 0) * 4 + _MB),
        ),
        "ledger": (store, "ask again", "the answer was not recorded", home_hint, 1),
    }[op]
    full = f"no space left on device in {folder}: free at least {mb} MB there ({hint}), then {action}; {outcome}"
    eio = (
        f"input/output error writing to {folder}: its disk or file system is failing; check the device (dmesg, smartctl), "
        f"then {action}; {outcome}"
    )
    return full, eio


def judge(result: dict) -> list[str]:
    """Every way the sweep's records break the promise, one line each; [] when every write point kept it.

    At a write point that failed: the error is a StorageError with the exact message (disk full for ENOSPC,
    except where SQLite reported a failed fsync, which it calls an I/O error whatever the errno); the
    store holds exactly the artifacts, blobs and ledger rows it held before, no partial or staging file,
    every earlier artifact byte-identical, fsck consistent without repair (also from a fresh process);
    the same operation run again gives what the fault-free run gave, and fsck stays consistent. The one
    failure an operation may absorb is SQLite's: it ignores a failed fsync of the store's folder after
    creating its WAL file (its unixSync); the operation must then give what a fault-free run gives."""
    problems = []
    pristine, clean = result["pristine"], result["clean"]
    full_only = result["errno"] in ("ENOSPC", "EDQUOT")
    for rec in result["records"]:
        at = f"{result['op']} {result['errno']} write point {rec['n']} ({rec['call']} {rec['path']})"
        err, after = rec["error"], rec["after_fault"]
        if rec["faults"] and err is None and not (rec["path"] == rec["store"] and rec["call"] in ("fsync", "fdatasync")):
            problems.append(f"{at}: the fault was absorbed and the operation reported success")
        if err is None and rec["result"] != clean:
            problems.append(f"{at}: the operation gave {rec['result']}, a fault-free run {clean}")
        if err is not None:
            full, eio = expected_messages(result, rec)
            sqlite_fsync = "SQLITE_IOERR_FSYNC" in err["cause"]
            allowed = [full, eio] if full_only and sqlite_fsync else [full] if full_only else [eio]
            if "StorageError" not in err["mro"] or err["message"] not in allowed:
                problems.append(f"{at}: {err['type']}: {err['message']!r} is not {allowed[0]!r}")
            if not rec["faults"]:
                problems.append(f"{at}: failed without a fault: {err['message']}")
            if result["op"] == "export" and rec["out_files"]:
                problems.append(f"{at}: files left in the export folder: {rec['out_files']}")
            for key in ("artifacts", "blobs", "ledger_rows"):
                if after[key] != pristine[key]:
                    problems.append(f"{at}: {key} changed by a failed operation: {pristine[key]} -> {after[key]}")
        for view in ("after_fault", "after_retry", "reopened"):
            seen = rec[view]
            lost = [i for i in pristine["artifacts"] if i not in seen["artifacts"] or seen["exact"].get(i) is not True]
            if lost:
                problems.append(f"{at}: {view}: earlier artifacts lost or changed: {lost}")
            if seen["strays"] or not seen["fsck_consistent"] or any(seen["fsck_counts"].values()):
                problems.append(f"{at}: {view}: fsck {seen['fsck_consistent']} {seen['fsck_counts']} strays {seen['strays']}")
        if err is not None and rec["retry"] != clean:
            problems.append(f"{at}: run again without the fault gave {rec['retry']}, a fault-free run {clean}")
    if not any(r["faults"] == 0 and r["error"] is None for r in result["records"]):
        problems.append(f"{result['op']} {result['errno']}: no run past the last write point succeeded")
    return problems


def lost_acknowledged(result: dict) -> int:
    """Artifacts acknowledged before the sweep that any write point's store lost or changed (must be 0)."""
    return sum(
        1
        for rec in result["records"]
        for view in ("after_fault", "after_retry", "reopened")
        for i in result["pristine"]["artifacts"]
        if i not in rec[view]["artifacts"] or rec[view]["exact"].get(i) is not True
    )


# ---- the parent --------------------------------------------------------------------------------


def sweep(sweeps: list[tuple[str, str, int]], model_dir: str | os.PathLike, work: str | os.PathLike | None = None) -> list[dict]:
    """Run each (operation, errno name, every) sweep in one child with faultfs preloaded (the model loads
    once); returns their records. `every`: test every k-th write point and the last (1: all of them)."""
    work = Path(work or tempfile.mkdtemp(prefix="kvgraft-faults-"))
    work.mkdir(parents=True, exist_ok=True)
    shim = build_shim(work / "shim")
    child_work = Path(tempfile.mkdtemp(prefix="sweep-", dir=work))
    spec = {"sweeps": [list(x) for x in sweeps], "model_dir": str(model_dir), "work": str(child_work)}
    env = dict(os.environ, LD_PRELOAD=str(shim), PYTHONPATH=str(ROOT), KVGRAFT_THREADS="1")
    proc = subprocess.run(
        [sys.executable, "-m", "scripts.sweeps", "--child", json.dumps(spec)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=3600,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"fault sweep child failed ({proc.returncode}): {proc.stderr[-3000:]}")
    shutil.rmtree(child_work, ignore_errors=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--op", choices=OPS, default="deposit")
    p.add_argument("--errno", choices=("ENOSPC", "EIO", "EDQUOT", "EROFS"), default="ENOSPC")
    p.add_argument("--every", type=int, default=1)
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))), flush=True)
        return 0
    from graft_core import tiny

    work = Path(tempfile.mkdtemp(prefix="kvgraft-faults-"))
    model_dir = tiny.build("gemma3", work / "tiny-gemma3")
    results = sweep([(args.op, args.errno, args.every)], model_dir, work)
    print(json.dumps(results, indent=1))
    for problem in judge(results[0]):
        print(problem, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
