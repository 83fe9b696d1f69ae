"""Security finding: a sympy check that times out is killed with its worker process, so the
server's memory does not grow, no thread keeps running and later checks are not refused as busy."""

import os
import threading
import time

from verifiers import SympyVerifier, Verdict, symbolic
from verifiers.verdict import _q

BOMB = "(a+b+c+d+e+f+g+h+i+j+k+l+m+n+o+p)**100"  # the issue's: grew the server 263 MB -> 1.6 GB in 25 s


def _rss_bytes(pid: int | str = "self") -> int:
    with open(f"/proc/{pid}/status") as f:
        kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return kb * 1024


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_the_bomb_is_killed_and_the_server_does_not_grow():
    verifier = SympyVerifier(timeout_s=2.0)
    patient = SympyVerifier(timeout_s=60.0)  # normal checks: the claim is "not refused", not speed on a loaded machine
    assert patient.compare("x+1", "1+x").ok  # the parent's first use of the pipes, outside the measured part
    threads_before = threading.active_count()
    rss_before = _rss_bytes()
    for _ in range(3):  # a worker thread (not a process) would refuse every check as busy after two of these
        assert patient.compare("x+1", "1+x").ok  # a fresh worker after each kill
        worker = symbolic._WORKER.pid()
        start = time.perf_counter()
        verdict = verifier.compare(BOMB, "0")
        took = time.perf_counter() - start
        assert verdict == Verdict(
            False, "sympy", f"answer {_q(BOMB)} vs reference '0': simplify did not finish within 2.0 s (sympy)"
        )
        assert took < 2.0 + 3.0, f"the timed-out check took {took:.2f} s"
        assert worker is not None and not _alive(worker), "the timed-out worker process is still running"
        assert symbolic._WORKER.pid() is None
    grew = _rss_bytes() - rss_before
    assert grew < 20 << 20, f"the parent grew by {grew / 2**20:.1f} MiB"
    assert threading.active_count() == threads_before, "a check left a thread behind"
    assert patient.compare("(x+1)^2", "x^2+2*x+1") == Verdict(
        True, "sympy", "answer '(x+1)^2' equals reference 'x^2+2*x+1' (sympy, simplify(answer - reference) == 0)"
    )


def test_the_worker_runs_under_memory_and_cpu_limits():
    assert SympyVerifier(timeout_s=60.0).compare("x", "x").ok
    pid = symbolic._WORKER.pid()
    with open(f"/proc/{pid}/limits") as f:
        limits = {line[:26].strip(): line[26:].split() for line in f if line[:26].strip()}
    assert limits["Max address space"][:2] == [str(symbolic.SYMPY_MEMORY_BYTES)] * 2
    assert limits["Max cpu time"][0] != "unlimited", "the per-check CPU limit is set before each check"
    assert _rss_bytes(pid) < symbolic.SYMPY_MEMORY_BYTES


def test_a_worker_that_runs_out_of_memory_is_replaced(monkeypatch):
    monkeypatch.setattr(symbolic, "SYMPY_MEMORY_BYTES", 400 << 20)
    symbolic._WORKER.stop()
    try:
        verdict = SympyVerifier(timeout_s=60.0).compare(BOMB, "0")
        assert not verdict.ok
        assert verdict.detail.endswith(("(MemoryError) (sympy)", "(WorkerExited) (sympy)")), verdict.detail
        assert symbolic._WORKER.pid() is None
    finally:
        symbolic._WORKER.stop()
    monkeypatch.undo()
    assert SympyVerifier(timeout_s=60.0).compare("2*x", "x+x").ok


def test_concurrent_checks_share_the_worker_and_all_get_verdicts():
    verdicts: list[Verdict] = []
    threads = [
        threading.Thread(target=lambda n=n: verdicts.append(SympyVerifier(timeout_s=60.0).compare(f"x*{n}", f"{n}*x")))
        for n in range(6)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(verdicts) == 6 and all(v.ok for v in verdicts)


def test_the_worker_loads_neither_torch_nor_kvgraft():
    assert SympyVerifier(timeout_s=60.0).compare("x", "x").ok
    with open(f"/proc/{symbolic._WORKER.pid()}/maps") as f:
        maps = f.read()
    assert "libtorch" not in maps
    assert os.path.basename(symbolic._WORKER_SCRIPT) == "sympy_worker.py"


def test_a_forked_child_neither_kills_nor_shares_the_parents_worker():
    """A server that forks (or a test that forks from a warm process) must not lose its worker when a child exits."""
    assert SympyVerifier(timeout_s=60.0).compare("x", "x").ok
    worker = symbolic._WORKER.pid()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        code = 1
        try:
            inherited_none = symbolic._WORKER.pid() is None
            symbolic._WORKER.stop()  # what atexit does at the child's exit
            own = SympyVerifier(timeout_s=60.0).compare("2*y", "y+y").ok and symbolic._WORKER.pid() not in (None, worker)
            symbolic._WORKER.stop()
            code = 0 if inherited_none and own else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child could not run its own worker"
    assert _alive(worker) and symbolic._WORKER.pid() == worker
    assert SympyVerifier(timeout_s=60.0).compare("x*x", "x^2").ok
