"""Runs llama-cpp-python's OpenAI-compatible server (`llama_cpp.server`'s own `main`, its own arguments),
with one addition: `--no-extra-bufts` loads the weights without the CPU backend's extra buffer types (AMX,
repack), and `--smoke GGUF` evaluates 4 tokens of a GGUF under the same choice and exits (0 when it lived).
It knows nothing about kvgraft; it runs under the peer's Python (bench/llamacpp/build.sh makes one), not ours.

Why the flag: llama-cpp-python 0.3.36 crashed (SIGSEGV in ggml_backend_amx_mul_mat) loading weights into the
AMX extra buffer on an AMX-capable Xeon (Sapphire Rapids) whose container does not run AMX. On a CPU where
the default runs, leave the flag off; bench.api tries the default first and adds the flag only after a crash.

Usage: PEER_PYTHON bench/llamacpp/server.py [--no-extra-bufts] --model GGUF --host 127.0.0.1 --port P ...
       PEER_PYTHON bench/llamacpp/server.py [--no-extra-bufts] --smoke GGUF
"""

from __future__ import annotations

import sys

NO_EXTRA_BUFTS = "--no-extra-bufts"
SMOKE = "--smoke"


def split_args(argv: list[str]) -> tuple[bool, str | None, list[str]]:
    """(extra buffers off, the GGUF to smoke-test or None, the arguments left for llama_cpp.server)."""
    off, smoke, rest = False, None, []
    it = iter(argv)
    for a in it:
        if a == NO_EXTRA_BUFTS:
            off = True
        elif a == SMOKE:
            smoke = next(it, None)
            if smoke is None or smoke.startswith("--"):
                raise SystemExit(f"{SMOKE} needs the GGUF's path after it")
        elif a.startswith(SMOKE + "="):
            smoke = a.split("=", 1)[1]
        else:
            rest.append(a)
    if smoke is not None and rest:
        raise SystemExit(f"{SMOKE} takes no server arguments, got {' '.join(rest)}")
    return off, smoke, rest


def without_extra_bufts(bindings) -> None:
    """Make `bindings.llama_model_default_params()` (llama_cpp.llama_cpp, which `Llama.__init__` reads at
    call time) return its defaults with `use_extra_bufts = False`. Before any model loads."""
    defaults = bindings.llama_model_default_params

    def patched():
        p = defaults()
        p.use_extra_bufts = False
        return p

    bindings.llama_model_default_params = patched


def main(argv: list[str] | None = None) -> None:
    off, smoke, rest = split_args(sys.argv[1:] if argv is None else argv)
    if off:
        import llama_cpp.llama_cpp as bindings

        without_extra_bufts(bindings)
    if smoke is not None:
        from llama_cpp import Llama

        m = Llama(smoke, n_ctx=64, n_threads=1, verbose=False)
        m.eval(m.tokenize(b"Question: Who?"))
        print(f"smoke ok, extra buffer types {'off' if off else 'on'}", flush=True)
        return
    from llama_cpp.server.__main__ import main as server_main

    sys.argv = [sys.argv[0], *rest]
    server_main()


if __name__ == "__main__":
    main()
