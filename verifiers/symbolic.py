"""The sympy verifier: symbolic equality of two expressions that pass a strict allow-list, compared in a
separate worker process (`sympy_worker.py`) under memory and CPU limits. Neither string is ever given to
`sympify`; this module never imports sympy itself.
"""

from __future__ import annotations

import ast
import atexit
import contextlib
import json
import keyword
import math
import os
import re
import select
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from types import MappingProxyType

from errors import InvalidInput
from verifiers.verdict import Verdict, _q, _require_text

# --- sympy ------------------------------------------------------------------------------------

SYMPY_MAX_CHARS = 200
SYMPY_MAX_EXPONENT = 1_000  # largest |numeric exponent|
SYMPY_MAX_BITS = 8_192  # largest integer any eager evaluation may build (about 2,466 digits)
SYMPY_MAX_DEGREE = 100  # largest polynomial degree
SYMPY_MAX_NODES = 200
SYMPY_FUNCTIONS = MappingProxyType(
    {"sqrt": (1, 1), "sin": (1, 1), "cos": (1, 1), "exp": (1, 1), "log": (1, 2), "Rational": (1, 2)}
)
SYMPY_CONSTANTS = ("pi", "E")
_RESERVED = frozenset({"Integer", "Float", "Symbol"})  # names the parser's generated code calls
_ALLOWED_CHARS = re.compile(r"[A-Za-z0-9 .+\-*/^(),]*")
_TOKEN = re.compile(r"(?P<name>[A-Za-z][A-Za-z0-9]*)|(?P<num>\d+\.?\d*|\.\d+)|(?P<space> +)|(?P<op>\*\*|.)")
SYMPY_MEMORY_BYTES = 1 << 30  # address-space limit of the worker process (sympy itself needs ~150 MB)
SYMPY_START_TIMEOUT_S = 120.0  # importing sympy in a fresh worker, on a loaded machine


class _Unsafe(ValueError):
    """The text is not an expression this verifier will evaluate; the message says why."""


@dataclass(frozen=True)
class _Size:
    bits: int  # upper bound on the bit length of any number built eagerly
    degree: int  # upper bound on the polynomial degree
    value: Fraction | None  # exact value when the subtree is a rational constant


def _check_tokens(text: str) -> list[str]:
    """Character and token rules; returns the identifiers that are symbols."""
    if len(text) > SYMPY_MAX_CHARS:
        raise _Unsafe(f"it is longer than {SYMPY_MAX_CHARS} characters")
    if not _ALLOWED_CHARS.fullmatch(text):
        bad = next(c for c in text if not _ALLOWED_CHARS.fullmatch(c))
        raise _Unsafe(f"character {bad!r} is not allowed")
    symbols: list[str] = []
    previous = None
    for token in _TOKEN.finditer(text):
        if token["name"]:
            name = token["name"]
            if previous == "num":
                raise _Unsafe(f"a number runs into {name!r}; write 2*x, not 2x")
            if keyword.iskeyword(name) or name in _RESERVED or len(name) > 16:
                raise _Unsafe(f"name {name!r} is not allowed")
            if name not in SYMPY_FUNCTIONS and name not in SYMPY_CONSTANTS and name not in symbols:
                symbols.append(name)
        previous = token.lastgroup
    return symbols


def _measure(node: ast.AST, source: str, counter: list[int]) -> _Size:
    """Walks the Python AST of the expression, allowing only arithmetic, and bounds its cost."""
    counter[0] += 1
    if counter[0] > SYMPY_MAX_NODES:
        raise _Unsafe(f"it has more than {SYMPY_MAX_NODES} parts")
    if isinstance(node, ast.Expression):
        return _measure(node.body, source, counter)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        value = Fraction(ast.get_source_segment(source, node) or "0")  # the literal as written, exactly
        return _Size(max(value.numerator.bit_length(), value.denominator.bit_length(), 1), 0, value)
    if isinstance(node, ast.Name):
        if node.id in SYMPY_FUNCTIONS:
            raise _Unsafe(f"{node.id!r} must be called, as in {node.id}(x)")
        return _Size(2, 0, None) if node.id in SYMPY_CONSTANTS else _Size(1, 1, None)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd | ast.USub):
        s = _measure(node.operand, source, counter)
        return _Size(s.bits, s.degree, None if s.value is None else (-s.value if isinstance(node.op, ast.USub) else s.value))
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Sub | ast.Mult | ast.Div | ast.Pow):
        left, right = _measure(node.left, source, counter), _measure(node.right, source, counter)
        both = left.value is not None and right.value is not None
        if isinstance(node.op, ast.Add | ast.Sub):
            value = (left.value + right.value if isinstance(node.op, ast.Add) else left.value - right.value) if both else None
            size = _Size(max(left.bits, right.bits) + 1, max(left.degree, right.degree), value)
        elif isinstance(node.op, ast.Mult):
            size = _Size(left.bits + right.bits, left.degree + right.degree, left.value * right.value if both else None)
        elif isinstance(node.op, ast.Div):
            value = left.value / right.value if both and right.value != 0 else None
            size = _Size(left.bits + right.bits, left.degree + right.degree, value)
        else:
            size = _measure_pow(left, right)
        if size.bits > SYMPY_MAX_BITS:
            raise _Unsafe(f"it builds numbers larger than {SYMPY_MAX_BITS} bits")
        if size.degree > SYMPY_MAX_DEGREE:
            raise _Unsafe(f"its degree exceeds {SYMPY_MAX_DEGREE}")
        return size
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in SYMPY_FUNCTIONS and not node.keywords:
        low, high = SYMPY_FUNCTIONS[node.func.id]
        if not low <= len(node.args) <= high:
            raise _Unsafe(f"{node.func.id} takes {low} to {high} arguments")
        args = [_measure(arg, source, counter) for arg in node.args]
        if node.func.id == "Rational":
            if any(a.value is None for a in args):
                raise _Unsafe("Rational takes numbers only")
            value = args[0].value if len(args) == 1 else (args[0].value / args[1].value if args[1].value else None)
            return _Size(sum(a.bits for a in args), 0, value)
        degree = max(a.degree for a in args)
        return _Size(max(a.bits for a in args), degree if node.func.id == "sqrt" else min(degree, 1), None)
    what = (
        f"calling {ast.unparse(node.func)!r}" if isinstance(node, ast.Call) else f"{type(node).__name__} ({ast.unparse(node)!r})"
    )
    raise _Unsafe(f"{what} is not allowed; use numbers, symbols, + - * / ^ and {', '.join(SYMPY_FUNCTIONS)}")


def _measure_pow(base: _Size, exponent: _Size) -> _Size:
    if exponent.value is None:  # symbolic or irrational exponent: nothing is computed, but keep its numbers small
        if exponent.bits > 10:
            raise _Unsafe("the numbers in a symbolic exponent are too large")
        factor = 2**exponent.bits
        return _Size(base.bits * factor, base.degree * factor, None)
    if abs(exponent.value) > SYMPY_MAX_EXPONENT:
        raise _Unsafe(f"exponent {exponent.value} is larger than {SYMPY_MAX_EXPONENT}")
    n = max(1, math.ceil(abs(exponent.value)))
    bits, degree = base.bits * n, base.degree * n
    if bits > SYMPY_MAX_BITS:
        raise _Unsafe(f"it builds numbers larger than {SYMPY_MAX_BITS} bits")
    value = base.value**exponent.value if base.value is not None and exponent.value.denominator == 1 and base.value != 0 else None
    return _Size(bits, degree, value)


def _validate_expression(text: str) -> tuple[str, list[str]]:
    """Raises _Unsafe unless text is a small arithmetic expression; returns (python text, symbol names)."""
    symbols = _check_tokens(text)
    python = text.replace("^", "**").strip()
    try:
        tree = ast.parse(python, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise _Unsafe("it is not a well-formed expression") from None
    _measure(tree, python, [0])
    return python, symbols


class _SympyWorker:
    """One persistent child process (sympy_worker.py) that compares validated expressions, one at a time.

    Plain JSON lines cross the pipe, never pickle. A check that outlives its timeout gets the child
    killed (SIGKILL) and reaped, so nothing keeps running; the next check starts a fresh child. The
    child's start-up (importing sympy) is paid once and is not part of any check's timeout.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._pending = b""
        os.register_at_fork(after_in_child=self._forget_after_fork)

    def _forget_after_fork(self) -> None:
        """In a forked child the worker is the parent's: drop our copies of its pipes, never kill or wait for it."""
        proc, self._proc = self._proc, None
        self._lock, self._pending = threading.Lock(), b""
        if proc is not None:
            proc.returncode = -1  # not this process's child: Popen must not wait for it either
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    with contextlib.suppress(OSError):
                        pipe.close()  # only this process's copy of the descriptor

    def _read_line(self, deadline: float) -> bytes | None:
        """The next line from the child, or None if none came before the deadline or the child exited."""
        proc = self._proc
        assert proc is not None and proc.stdout is not None, "read from a started worker only"
        fd = proc.stdout.fileno()
        while b"\n" not in self._pending:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self._pending += chunk
        line, _, self._pending = self._pending.partition(b"\n")
        return line

    def _start(self) -> None:
        self._pending = b""
        self._proc = subprocess.Popen(
            [sys.executable, str(_WORKER_SCRIPT), str(SYMPY_MEMORY_BYTES)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=_WORKER_SCRIPT.parent,
        )
        if self._read_line(time.monotonic() + SYMPY_START_TIMEOUT_S) != b"ready":
            self.stop()
            raise OSError("the sympy worker did not start")

    def stop(self) -> None:
        """Kill and reap the child (no-op when none runs)."""
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.kill()
            proc.wait()
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    pipe.close()

    def warm(self) -> None:
        """Start the child now if none runs, so that the next check does not pay the sympy import."""
        with self._lock:
            if self._proc is None:
                self._start()

    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def ask(self, answer: tuple[str, list[str]], reference: tuple[str, list[str]], timeout_s: float) -> dict | None:
        """The child's reply ({"equal", "diff"} or {"error"}), or None when it did not answer within timeout_s."""
        request = {"answer": answer, "reference": reference, "cpu_s": math.ceil(timeout_s) + 1}
        with self._lock:
            if self._proc is None:
                try:
                    self._start()
                except OSError:
                    return {"error": "WorkerDidNotStart"}
            assert self._proc is not None and self._proc.stdin is not None, "a started worker has pipes"
            try:
                self._proc.stdin.write(json.dumps(request).encode() + b"\n")
                self._proc.stdin.flush()
            except BrokenPipeError:
                self.stop()
                return {"error": "WorkerExited"}
            line = self._read_line(time.monotonic() + timeout_s)
            if line is None:
                exited = self._proc.poll() is not None
                self.stop()
                return {"error": "WorkerExited"} if exited else None
            try:
                reply = json.loads(line)
            except ValueError:  # a reply cut short by a dying worker
                self.stop()
                return {"error": "WorkerExited"}
            if reply.get("error") == "MemoryError":
                self.stop()
            return reply


_WORKER_SCRIPT = Path(__file__).resolve().with_name("sympy_worker.py")
_WORKER = _SympyWorker()
atexit.register(_WORKER.stop)


class SympyVerifier:
    """Symbolic equality, simplify(answer - reference) == 0, on expressions that pass a strict gate.

    Neither string is ever given to `sympify`. Each must match an allow-list of characters, parse (as
    Python syntax, never run) into numbers, symbols, + - * / ** and calls of SYMPY_FUNCTIONS only, and
    stay within bounds on size, exponents, integer bits and degree; only then is it built with
    `parse_expr` in a namespace without builtins, in a separate worker process with memory and
    CPU limits (sympy_worker.py). A check that exceeds `timeout_s` is refused and its worker killed.
    """

    name = "sympy"

    def __init__(self, timeout_s: float = 2.0):
        self.timeout_s = timeout_s

    def compare(self, answer: str, reference: str) -> Verdict:
        _require_text("answer", answer)
        try:
            ref = _validate_expression(_require_text("reference", reference))
        except _Unsafe as e:
            raise InvalidInput(
                f"reference {_q(reference)} is not a safe expression: {e}; use numbers, letters as symbols, "
                f"+ - * / ^ **, parentheses and {', '.join(SYMPY_FUNCTIONS)}, {', '.join(SYMPY_CONSTANTS)}"
            ) from None
        try:
            ans = _validate_expression(answer)
        except _Unsafe as e:
            return Verdict(False, self.name, f"answer {_q(answer)} is not a safe expression: {e} (sympy)")
        reply = _WORKER.ask(ans, ref, self.timeout_s)
        if reply is None:
            return Verdict(
                False,
                self.name,
                f"answer {_q(answer)} vs reference {_q(reference)}: simplify did not finish within {self.timeout_s} s (sympy)",
            )
        if "error" in reply:
            return Verdict(
                False,
                self.name,
                f"answer {_q(answer)} vs reference {_q(reference)}: sympy could not compare them ({reply['error']}) (sympy)",
            )
        if reply["equal"]:
            return Verdict(
                True,
                self.name,
                f"answer {_q(answer)} equals reference {_q(reference)} (sympy, simplify(answer - reference) == 0)",
            )
        return Verdict(
            False,
            self.name,
            f"answer {_q(answer)} does not equal reference {_q(reference)} (sympy, simplify(answer - reference) = {_q(reply['diff'])})",
        )
