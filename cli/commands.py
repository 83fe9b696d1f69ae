"""kvgraft's command line: thin over `services`; each command calls one service and formats it.

Errors print one line on stderr and exit non-zero (2 for a kvgraft error, 1 for a failed check);
`--debug` shows the traceback. Command and JSON field names are stable: scripts rely on them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from services import LibraryDoor

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _emit(args, payload: dict, human: str) -> None:
    print(json.dumps(payload, indent=2, default=str) if args.json else human)


def _library(args) -> LibraryDoor:
    """The store the commands answer from, typed as the door they call (`services.LibraryDoor`)."""
    import services

    return services.Library(home=args.home, db_url=args.db_url, model_name=args.model)


def cmd_deposit(args) -> int:
    lib = _library(args)
    if args.question is not None:
        missing = [f for f in ("solution", "verifier", "reference") if getattr(args, f) is None]
        if missing:
            raise SystemExit(f"error: a verified deposit needs --{' --'.join(missing)}")
        d = lib.deposit_item(
            args.question,
            args.solution,
            args.answer,
            args.verifier,
            args.reference,
            parent=args.parent,
            title=args.title or "",
            admin=args.admin,
        )
    elif args.text_file is not None:
        text = sys.stdin.read() if args.text_file == "-" else Path(args.text_file).read_text(encoding="utf-8")
        d = lib.deposit_text(text, parent=args.parent, title=args.title or "", attested_by=args.attested_by, admin=args.admin)
    else:
        raise SystemExit("error: give --text-file F, or --question/--solution/--verifier/--reference [--answer]")
    _emit(
        args,
        d.to_json(),
        f"{'deposited' if d.created else 'already deposited'} {d.id} ({d.tokens} tokens at {d.start}, "
        f"{d.bytes:,} bytes, {d.kind}, {d.provenance}, prefill {d.prefill_s:.2f} s"
        + (f", gate {d.gate_s:.2f} s / {d.gate_tokens} tokens)" if d.gate_tokens else ")"),
    )
    return 0


class _Streamed:
    """`ask --stream`: prints each piece of the growing answer that later tokens cannot change, as it comes
    (graft_core.templates.settled), then what is left of the finished answer."""

    def __init__(self, out=None):
        self.out, self.shown = out or sys.stdout, ""

    def __call__(self, text: str) -> None:
        from graft_core.templates import settled

        now = settled(text)
        if now.startswith(self.shown) and len(now) > len(self.shown):
            self.out.write(now[len(self.shown) :])
            self.out.flush()
            self.shown = now

    def finish(self, answer: str) -> None:
        self.out.write((answer[len(self.shown) :] if answer.startswith(self.shown) else "\n" + answer) + "\n")
        self.out.flush()


def cmd_ask(args) -> int:
    from services import AnswerOptions

    if args.stream and args.json:
        raise SystemExit("error: --stream prints the answer as it comes and --json prints it whole: give one of them")
    lib = _library(args)
    # The artifact is known before the question: prove its chain while the process warms up, so the
    # answer carries the state proof (one BLAKE3) rather than the probe forward (same check, run first).
    proved_s = warmed_s = None
    if args.artifact and not args.no_graft and not args.relocated:
        proved_s = lib.prove_chain(args.artifact)
        warmed_s = lib.warm_answer(args.artifact)  # a throw-away answer: first read/restore/forward paid at load
    printer = _Streamed() if args.stream else None
    r = lib.answer(
        args.question,
        AnswerOptions(
            k=args.k,
            artifact=args.artifact,
            graft=not args.no_graft,
            max_new_tokens=args.max_new_tokens,
            raw=args.raw,
            check=args.check,
            compare=args.compare,
            relocated=args.relocated,
            compose=args.compose,
        ),
        on_token=printer,
    )
    if printer is not None:
        printer.finish(r.answer)
    payload = r.to_json() | ({"proved_at_load_s": proved_s, "warmed_at_load_s": warmed_s} if proved_s is not None else {})
    lines = [
        *([] if printer is not None else [r.answer]),
        "",
        f"tier {r.tier}; grafted {r.grafted_tokens}, computed {r.computed_tokens}, decoded {r.decode_tokens} tokens; "
        f"ttft {r.ttft_s * 1000:.0f} ms" + (f"; {r.scope}" if r.scope else ""),
    ]
    if r.note:
        lines.append(r.note)
    for h in r.retrieved:
        lines.append(f"  retrieved {h.id[:12]} {h.score:.3f} {h.title}")
    if r.check is not None:
        lines.append(
            f"check: {'EXACT (sha256 equal)' if r.check.exact else 'NOT EXACT'} fresh {r.check.fresh_sha256[:16]} "
            f"grafted {r.check.grafted_sha256[:16]} KL {r.check.kl:.3g}"
        )
    if r.proof is not None and r.proof.passed is not None:
        p = r.proof
        verdict = f"{p.kind.upper()} PROOF {'PASSED' if p.passed else 'FAILED'}"
        what = "probe logits sha256 deposit" if p.kind == "probe" else "state blake3 proved"
        lines.append(f"proof: {verdict} {what} {p.expected[:16]} served {p.observed[:16]} ({p.proof_s * 1000:.1f} ms)")
    if proved_s is not None:
        lines.append(
            f"the artifact's chain was probe-proved at load ({proved_s * 1000:.0f} ms, before the question), "
            f"and a throw-away answer warmed its path ({warmed_s * 1000:.0f} ms)"
        )
    _emit(args, payload, "\n".join(lines))
    failed_proof = r.proof is not None and r.proof.passed is False
    return 1 if (r.check is not None and r.check.tier == "exact" and not r.check.exact) or failed_proof else 0


def cmd_verify(args) -> int:
    lib = _library(args)
    if not lib.holds_own():  # a fresh store (or one of other models only): the README's re-check commands run as written
        from services.seed import bring_in

        n = bring_in(lib)
        print(f"no artifact of this model in the store: seeded the built-in library first ({n} artifacts)", file=sys.stderr)
    rep = lib.exactness_report(args.samples, relocate=args.relocate, seed=args.seed)
    payload = rep.to_json(every_field=args.rows)
    tier = f"relocated to offset {args.relocate} (approximate)" if args.relocate is not None else "own position (exact tier)"
    _emit(
        args,
        payload,
        f"{rep.byte_equal}/{rep.samples} byte-equal, {tier}; max KL {rep.max_kl:.3g}, "
        f"argmax agreement {rep.argmax_agreement:.4f}",
    )
    if args.relocate is None and rep.byte_equal != rep.samples:
        return 1
    return 0


def cmd_seed(args) -> int:
    from services import seed

    lib = _library(args)
    if args.write_bundle is not None:
        out = Path(args.write_bundle) if args.write_bundle else seed.recipe_path(lib.lm.info.name)
        rep = seed.write_bundle(lib, out)
        _emit(
            args,
            rep,
            f"built-in library written: {out} ({rep['artifacts']} artifacts, {rep['bytes']:,} bytes, sha256 {rep['sha256']})",
        )
        return 0
    n = seed.seed_library(lib) if args.through_gate else seed.bring_in(lib)
    _emit(
        args, {"created": n, "artifacts": lib.count()}, f"built-in library seeded: {n} new, {lib.count()} artifacts in the store"
    )
    return 0


def cmd_solve(args) -> int:
    """Exit 0 whether or not it was solved (the JSON says); 2 on a kvgraft error."""
    lib = _library(args)
    r = lib.solve(
        args.question,
        args.verifier,
        args.reference,
        budget=args.budget,
        attempts=args.attempts,
        seed=args.seed,
        temperature=args.temperature,
        admin=args.admin,
    )
    if r.solved:
        human = f"solved from the {r.source} ({r.id[:12]}): {r.answer}; {r.tokens_spent} tokens, {len(r.attempts)} attempt(s)"
    else:
        human = f"not solved within {r.budget} tokens: {r.tokens_spent} spent over {len(r.attempts)} attempt(s)"
    _emit(args, r.to_json(), human)
    return 0


def cmd_selftest(args) -> int:
    """Exit 0 when every golden hash matches on this machine, 1 otherwise (engine only: no store). With no model
    named (--model, KVGRAFT_MODEL) every packaged model is checked in turn under this build (KVGRAFT_ISA picks
    it), one line each; exit 0 only when each one checked matches, and at least one was."""
    import settings
    from graft_core import model, selftest

    if not (args.model or settings.get("KVGRAFT_MODEL")):
        checks = selftest.run_each(model.PACKAGED)
        ok = any(c.report is not None for c in checks) and all(c.match for c in checks if c.report is not None)
        payload = {"match": ok, "models": [c.to_json() for c in checks]}
        _emit(args, payload, "\n".join(c.line() for c in checks))
        return 0 if ok else 1
    rep = selftest.run(model.load(args.model))
    bad = [c.name for c in rep.cases if not c.match]
    human = f"selftest: all {len(rep.cases)} golden hashes match" if rep.match else f"selftest: MISMATCH in {', '.join(bad)}"
    _emit(args, rep.to_json(), human + f" (kernel path {rep.numerics}; sessions batch {rep.ran_on.get('batching')})")
    return 0 if rep.match else 1


def cmd_serve(args) -> int:
    """Ray Serve replicas over the shared store (serving/); runs until Ctrl-C, then drains."""
    from serving import ServeSettings, launch

    settings = ServeSettings.from_env(replicas=args.replicas, port=args.port, db_url=args.db_url, model=args.model)
    launch.serve_forever(settings, address=args.address, num_cpus=args.num_cpus)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cli.py", description="kvgraft: byte-exact KV-cache grafting")
    p.add_argument("--home", default=None, help="store folder (default $KVGRAFT_HOME or ~/.local/share/kvgraft)")
    p.add_argument("--db-url", default=None, help="catalog URL (default $KVGRAFT_DB_URL or SQLite in the home)")
    p.add_argument("--model", default=None, help="model folder or id (default $KVGRAFT_MODEL or the packaged Gemma 3 270M)")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("deposit", help="deposit free text or a verified item")
    d.add_argument("--text-file", help="UTF-8 text file to deposit ('-' for stdin)")
    d.add_argument("--question")
    d.add_argument("--solution")
    d.add_argument("--answer", help="optional cheap pre-check before the prefill (the gate judges the model's own answer)")
    d.add_argument("--verifier", choices=["exact", "numeric", "sympy", "attested"])
    d.add_argument("--reference")
    d.add_argument("--parent", help="artifact id to continue (chains compose exactly)")
    d.add_argument("--title")
    d.add_argument("--attested-by", help="name of the person who vouches for a free-text deposit (admin)")
    d.add_argument("--admin", action="store_true", help="act as admin (the CLI runs with the store owner's rights)")
    d.add_argument("--json", action="store_true")
    d.set_defaults(func=cmd_deposit)

    a = sub.add_parser("ask", help="answer a question, grafting retrieved artifacts")
    a.add_argument("question")
    g = a.add_mutually_exclusive_group()
    g.add_argument("--artifact", help="graft this artifact (and its chain) instead of retrieving")
    g.add_argument("--no-graft", action="store_true", help="plain baseline: nothing grafted")
    a.add_argument("--k", type=int, default=3, help="retrieval depth (1-16)")
    a.add_argument("--raw", action="store_true", help="append the text verbatim instead of the question template")
    a.add_argument("--max-new-tokens", type=int, default=32)
    a.add_argument("--check", action="store_true", help="check graft vs fresh recomputation byte for byte")
    a.add_argument("--compare", action="store_true", help="also run and time the no-graft baseline")
    a.add_argument("--compose", action="store_true", help="chain every retrieved item exactly (prefills each new link once)")
    a.add_argument("--relocated", action="store_true", help="compose several retrieved roots by re-rotation (approximate)")
    a.add_argument("--stream", action="store_true", help="print the answer's tokens as they come")
    a.add_argument("--json", action="store_true")
    a.set_defaults(func=cmd_ask)

    v = sub.add_parser("verify", help="N-sample exactness check (or the relocation experiment)")
    v.add_argument("--samples", type=int, default=10)
    v.add_argument("--relocate", type=int, default=None, metavar="OFFSET", help="graft roots at OFFSET (approximate tier)")
    v.add_argument("--seed", type=int, default=0)
    v.add_argument("--rows", action="store_true", help="include every field of every sample in --json")
    v.add_argument("--json", action="store_true")
    v.set_defaults(func=cmd_verify)

    so = sub.add_parser("solve", help="library first, else the model works (greedy, then sampled) and deposits what passes")
    so.add_argument("question")
    so.add_argument("--verifier", required=True, choices=["exact", "numeric", "sympy"])
    so.add_argument("--reference", required=True)
    so.add_argument("--budget", type=int, default=4096, help="tokens computed at most, prompt + decode, every attempt")
    so.add_argument("--attempts", type=int, default=None, help="attempts at most (default: until the budget is spent)")
    so.add_argument("--seed", type=int, default=0, help="seed of the first sampled attempt (then +1 per attempt)")
    so.add_argument("--temperature", type=float, default=0.8)
    so.add_argument("--admin", action="store_true", help="act as admin (the CLI runs with the store owner's rights)")
    so.add_argument("--json", action="store_true")
    so.set_defaults(func=cmd_solve)

    sd = sub.add_parser(
        "seed",
        help="bring in the built-in library (library_seed/): its bundle, each artifact recomputed here, or through the gate",
    )
    sd.add_argument("--json", action="store_true")
    sd.add_argument("--through-gate", action="store_true", help="deposit every item through the gate (its generations)")
    sd.add_argument(
        "--write-bundle",
        nargs="?",
        const="",
        default=None,
        metavar="PATH",
        help=(
            "seed this (empty) store through the gate and write the built-in library (default library_seed/library.json "
            "for the default model, library_seed/library-<model>.json for another)"
        ),
    )
    sd.set_defaults(func=cmd_seed)

    s = sub.add_parser("selftest", help="recompute the golden hashes and compare with the committed ones")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_selftest)

    sv = sub.add_parser("serve", help="serve the engine as Ray Serve replicas over one shared store (docs/SCALING.md)")
    sv.add_argument("--replicas", type=int, default=None, help="fixed replica count (default: autoscale, see docs/SCALING.md)")
    sv.add_argument("--address", default=None, help="an existing Ray cluster (default: start a local Ray instance)")
    sv.add_argument("--num-cpus", type=int, default=None, help="CPUs of the local Ray instance (default: all)")
    sv.add_argument("--port", type=int, default=None, help="HTTP port (default $KVGRAFT_SERVE_PORT or 8000)")
    sv.set_defaults(func=cmd_serve)

    from cli import evaluation as eval_cli
    from cli import judging as judge_cli
    from cli import upkeep as cli_upkeep

    cli_upkeep.register(sub)
    eval_cli.register(sub)
    judge_cli.register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        import retrieval  # noqa: F401  (faiss before torch)
        from errors import KvgraftError

        try:
            return args.func(args)
        except KvgraftError as exc:
            if args.debug:
                raise
            print(f"error: {exc}", file=sys.stderr)
            return 2
        except (OSError, UnicodeDecodeError) as exc:
            if args.debug:
                raise
            print(f"error: {exc}", file=sys.stderr)
            return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
