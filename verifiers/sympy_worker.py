"""The child process behind the sympy verifier: it imports sympy once, then compares expressions read one JSON line at a time.

It runs under its own address-space limit (RLIMIT_AS) and a per-check CPU limit (RLIMIT_CPU), and
imports nothing from kvgraft, so neither torch nor the store is ever loaded next to sympy. It only
receives text that verifiers/symbolic.py has already validated; it checks nothing else and trusts nobody:
the expressions are built with `parse_expr` in a namespace without builtins, never `sympify`.
Protocol: it writes `ready` once, then for each request line {"answer": [python, symbols],
"reference": [...], "cpu_s": n} one reply line {"equal": bool, "diff": text} or {"error": kind}.
"""

from __future__ import annotations

import json
import resource
import sys

DIFF_MAX_CHARS = 300


def _build(python: str, symbols: list[str]):
    """Only ever called on text that passed verifiers._validate_expression; the namespaces hold nothing else."""
    import sympy
    from sympy.parsing.sympy_parser import auto_number, parse_expr, rationalize

    allowed = {"sqrt": sympy.sqrt, "sin": sympy.sin, "cos": sympy.cos, "exp": sympy.exp, "log": sympy.log}
    allowed |= {"pi": sympy.pi, "E": sympy.E, "Rational": sympy.Rational}
    global_dict = {"__builtins__": {}, "Integer": sympy.Integer, "Float": sympy.Float, "Symbol": sympy.Symbol} | allowed
    local_dict = {name: sympy.Symbol(name) for name in symbols}
    return parse_expr(python, local_dict=local_dict, global_dict=global_dict, transformations=(auto_number, rationalize))


def compare(request: dict) -> dict:
    """One reply for one request; a sympy failure on odd but safe input (e.g. Rational(x)) is an error reply."""
    import sympy

    try:
        diff = sympy.simplify(_build(*request["answer"]) - _build(*request["reference"]))
    except MemoryError:
        raise
    except Exception as e:
        return {"error": type(e).__name__}
    return {"equal": bool(diff == 0), "diff": str(diff)[:DIFF_MAX_CHARS]}


def _cpu_used() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main(memory_bytes: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    # Paid once per worker, before `ready`: the import and the lazy imports of a first simplify
    # (~3x a warm check), so that no check's timeout pays them.
    compare({"answer": ["(x+1)**2", ["x"]], "reference": ["x**2+2*x+1", ["x"]]})
    out = sys.stdout
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:  # EOF (the parent closed the pipe or died) ends the worker
        request = json.loads(line)
        _, hard = resource.getrlimit(resource.RLIMIT_CPU)
        soft = int(_cpu_used()) + max(1, int(request["cpu_s"]))
        resource.setrlimit(resource.RLIMIT_CPU, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))
        try:
            reply = compare(request)
        except MemoryError:
            out.write(json.dumps({"error": "MemoryError"}) + "\n")
            out.flush()
            return  # the heap may be in a poor state: the parent starts a fresh worker next time
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    main(int(sys.argv[1]))
