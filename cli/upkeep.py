"""Upkeep commands for cli.py: export, import, rebuild, fsck, replay, list, show, delete.

`register(subparsers)` adds them; each handler calls one function of `services` (or one `Library`
method: list, show, delete) and formats its report (`--json` prints the report's `to_json()`). Exit codes: 0
ok, 1 a check found a difference (rebuild, fsck, replay), 2 a kvgraft error (printed by cli.main).
"""

from __future__ import annotations

import json
import os
import sys

# Model loading draws a progress bar on stderr; these commands print one line there on error.
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def _progress_bar(what: str, stream=None):
    """(fraction, message) -> a bar redrawn in place on stderr when it is a terminal; silent otherwise."""
    stream = stream or sys.stderr
    if not stream.isatty():
        return None

    def draw(fraction: float, message: str) -> None:
        filled = int(30 * fraction)
        stream.write(f"\r{what} [{'#' * filled}{'.' * (30 - filled)}] {fraction:4.0%} {message}\x1b[K")
        stream.write("\n" if fraction >= 1 else "")
        stream.flush()

    return draw


def _emit(args, payload, human: str) -> None:
    print(json.dumps(payload, indent=2, default=str) if args.json else human)


def _library(args):
    import services

    return services.Library(home=args.home, db_url=args.db_url, model_name=args.model)


def cmd_export(args) -> int:
    import services

    r = services.export_bundle(_library(args), args.ids, args.out)
    _emit(args, r.to_json(), f"exported {len(r.artifacts)} artifact(s) to {r.path} ({r.bytes:,} bytes, sha256 {r.bundle_sha256})")
    return 0


def cmd_import(args) -> int:
    import services
    from db.bundles import Limits

    limits = Limits(max_member_bytes=args.max_member_bytes) if args.max_member_bytes else Limits()
    r = services.import_bundle(
        _library(args),
        args.bundle,
        limits=limits,
        check_model=not args.no_model_check,
        trust_verdicts=args.trust_verdicts,
        on_progress=_progress_bar("import"),
    )
    _emit(
        args,
        r.to_json(),
        f"imported {len(r.new)} new of {len(r.artifacts)} artifact(s) from {r.path}; {r.blobs_written} blob(s) written; "
        f"{r.replayed} verification(s) replayed, {r.not_reverified} imported, not re-verified; "
        f"{r.probes_checked} artifact(s) recomputed from their tokens, byte-identical; {r.embeddings_recomputed} embedding(s) recomputed"
        + (f"; {r.attested_dropped} attested verdict(s) left out (--trust-verdicts keeps them)" if r.attested_dropped else "")
        + (
            f"; {r.rebuilt} artifact(s) made under another numerical definition rebuilt here from their tokens (new ids, origin 'rebuilt')"
            if r.rebuilt
            else ""
        )
        + (
            ""
            if r.model_checked
            else " (nothing recomputed: every artifact is quarantined until `cli.py rebuild --compare ID` proves it)"
        ),
    )
    return 0


def cmd_rebuild(args) -> int:
    import services

    if args.verify:  # the flag's former name: it works, and says the name to type
        print(f"note: `rebuild --verify ID` is `rebuild --compare ID`: comparing {args.verify}", file=sys.stderr)
    r = services.rebuild_compare(_library(args), args.compare or args.verify)
    _emit(
        args,
        r.to_json(),
        f"{'EQUAL' if r.equal else 'DIFFERENT'}: stored {r.stored_sha256} (file {r.blob_sha256 or 'missing'}), "
        f"rebuilt {r.rebuilt_sha256}",
    )
    return 0 if r.equal else 1


def cmd_fsck(args) -> int:
    import services

    r = services.fsck(_library(args), repair=args.repair, deep=args.deep)
    d = r.to_json()
    c = d["counts"]
    lines = [
        f"{'consistent' if r.consistent else 'NOT consistent'}: {r.artifacts} artifact(s), {r.blobs} blob(s); "
        f"missing {c['missing']}, corrupt {c['corrupt']}, orphans {c['orphans']}, partials {c['partials']}, "
        f"index {r.index.status}"
    ]
    if args.repair:
        rep = r.repaired
        lines.append(
            f"repaired: removed {len(rep.orphans_removed)} orphan(s), {len(rep.partials_removed)} partial(s); "
            f"index {'rebuilt' if rep.index_rebuilt else 'untouched'}"
        )
    lines += [f"  missing {m.id} (blob {m.content_sha256})" for m in r.missing]
    lines += [f"  corrupt {m.id} (blob {m.content_sha256} hashes to {m.actual_sha256})" for m in r.corrupt]
    lines += [f"  quarantined {q.id}: {q.reason}" for q in r.quarantined]
    lines += list(r.advice)
    _emit(args, d, "\n".join(lines))
    return 0 if r.consistent else 1


def cmd_replay(args) -> int:
    import services

    r = services.replay_ledger(_library(args), last=args.last)
    lines = [
        f"ledger {e.ledger_id}: {'OK' if e.ok else 'MISMATCH'} tier {e.tier}, output {'=' if e.output_equal else '!='}, "
        f"logits {'=' if e.logits_equal else '!='}{' ' + e.error if e.error else ''}"
        for e in r.entries
    ]
    lines.append(f"{r.matched}/{r.replayed} replayed byte-identical")
    _emit(args, r.to_json(), "\n".join(lines))
    return 0 if r.ok else 1


def cmd_list(args) -> int:
    entries = _library(args).entries(
        query=args.query or "", kind=args.kind, limit=args.limit, offset=args.offset, model=args.list_model
    )
    rows = [e.row for e in entries]
    human = "\n".join(f"{r.id}  {r.tokens:>6} tok @{r.start:<6} {r.kind:<8} {r.title}" for r in rows)
    _emit(args, {"artifacts": [e.to_json() for e in entries], "count": len(rows)}, human or "no artifacts")
    return 0


def cmd_show(args) -> int:
    r = _library(args).show(args.id)
    a = r.artifact
    lines = [
        f"{a.id}  {a.kind}  {a.tokens} tokens at {a.start}  {a.bytes:,} bytes  blob {a.content_sha256}"
        + ("" if r.blob_present else " (MISSING)"),
        f"title: {a.title}",
        f"chain: {' -> '.join(i[:12] for i in r.chain)}",
        f"children: {', '.join(i[:12] for i in r.children) or 'none'}",
    ]
    if a.quarantine:
        lines.append(f"QUARANTINED: {a.quarantine}")
    for v in r.verifications:
        lines.append(f"verification: {v.label} ({v.verifier}, reference {v.reference!r}) {v.detail}")
        if v.generated_token_ids:
            lines.append(
                f"  asked {len(v.question_token_ids)} tokens (sha256 {v.question_sha256}), generated {v.generated_answer!r} "
                f"in {len(v.generated_token_ids)} tokens (sha256 {v.generated_sha256})"
            )
    lines += ["", r.source.text]
    _emit(args, r.to_json(), "\n".join(lines))
    return 0


def cmd_delete(args) -> int:
    r = _library(args).delete(args.id)
    _emit(args, r.to_json(), f"deleted {r.id}" + ("; blob removed" if r.blob_removed else "; blob kept (still referenced)"))
    return 0


def register(sub) -> None:
    """Add the upkeep commands to cli.py's subparsers."""

    def add(name: str, help: str, func):
        p = sub.add_parser(name, help=help)
        p.add_argument("--json", action="store_true")
        p.set_defaults(func=func)
        return p

    p = add("export", "write artifacts (with their ancestors) and their catalog rows to a tar bundle", cmd_export)
    p.add_argument("ids", nargs="+", metavar="ID")
    p.add_argument("--out", required=True, help="bundle file to write (.tar)")

    p = add("import", "check and add a bundle made by export", cmd_import)
    p.add_argument("bundle")
    p.add_argument("--no-model-check", action="store_true", help="do not load the model (nothing is re-verified)")
    p.add_argument(
        "--trust-verdicts",
        action="store_true",
        help="admin: skip replaying verifications; rows are labelled 'imported, not re-verified'",
    )
    p.add_argument("--max-member-bytes", type=int, default=None, help="refuse members larger than this (default 2 GiB)")

    p = add("rebuild", "recompute an artifact from its source text and compare bytes", cmd_rebuild)
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--compare", metavar="ID", help="the artifact to recompute and compare")
    which.add_argument("--verify", metavar="ID", help="the former name of --compare (accepted, says so on stderr)")

    p = add("fsck", "check catalog, blobs and index against each other", cmd_fsck)
    p.add_argument("--repair", action="store_true", help="remove orphan blobs and partial files, rebuild the index")
    p.add_argument("--deep", action="store_true", help="also restore each artifact and check its probe hash (loads the model)")

    p = add("replay", "re-run ledger entries and compare output and logits hashes", cmd_replay)
    p.add_argument("--last", type=int, default=None, metavar="N")

    p = add("list", "list artifacts, newest first", cmd_list)
    p.add_argument("--query", default=None, help="match in title or source text")
    p.add_argument("--kind", default=None, choices=["verified", "text", "attested"])
    p.add_argument(
        "--model",
        dest="list_model",
        default=None,
        help="only the artifacts this model made (a name the store opened it under, or a fingerprint prefix)",
    )
    p.add_argument("--limit", type=int, default=100)
    p.add_argument("--offset", type=int, default=0)

    p = add("show", "one artifact: row, source text, verifications, chain", cmd_show)
    p.add_argument("id")

    p = add("delete", "remove an artifact (refused while others continue its chain)", cmd_delete)
    p.add_argument("id")
