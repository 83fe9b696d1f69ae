"""Re-check an evaluation results file: every hash and every score, without the model; with
`rerun`, recompute every output with the model and compare token ids byte for byte.

Knows the results layout (eval/harness.py) and nothing about grafting. Without `rerun` no model
weights are loaded: token ids are decoded with the tokenizer files alone.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import verifiers
from eval import harness, rejudge
from graft_core import generate, templates


@dataclass
class RecheckReport:
    path: str
    outputs: int = 0
    checks: dict = field(default_factory=dict)  # name -> number of items checked
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    rejudged: list[str] = field(default_factory=list)  # records scored by another judge that the current one changes
    rejudged_summary: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems

    def fail(self, msg: str) -> None:
        self.problems.append(msg)

    def count(self, name: str, n: int = 1) -> None:
        self.checks[name] = self.checks.get(name, 0) + n

    def as_dict(self) -> dict:
        return {
            "path": self.path,
            "ok": self.ok,
            "outputs": self.outputs,
            "checks": self.checks,
            "problems": self.problems,
            "notes": self.notes,
            "rejudged": self.rejudged,
            "rejudged_summary": self.rejudged_summary,
        }


def _canon(x) -> str:
    return json.dumps(x, sort_keys=True)


def _tokenizer(results: dict, report: RecheckReport):
    """The tokenizer alone (no weights), or None with a note when its files are not on this machine."""
    from graft_core import model as model_mod
    from graft_core.fingerprints import tokenizer_sha256

    name = results["model"]["name"]
    tok = None
    if name == model_mod.DEFAULT_MODEL:
        folder = model_mod.model_cache_dir() / "gemma-3-270m-f32"
        if not (folder / "tokenizer_config.json").exists() and not (folder / "tokenizer.json").exists():
            tok = _packaged_tokenizer()  # where fma16 runs the model loads from its GGUF: no float32 folder
            if tok is None:
                report.notes.append(
                    f"tokenizer files not found in {folder} nor the packaged GGUF in the model cache: token ids not "
                    "decoded (stored text re-scored instead)"
                )
                return None
    elif name == model_mod.SMOLLM2 or str(name).endswith(".gguf"):
        folder = _gguf_tokenizer_dir(name, report)
        if folder is None:
            return None
    else:
        folder = Path(name)
        if not folder.exists():
            report.notes.append(f"model folder {name} not found: token ids not decoded (stored text re-scored instead)")
            return None
    if tok is None:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(folder)
    got = tokenizer_sha256(tok)
    if got != results["model"]["tokenizer_sha256"]:
        report.fail(f"tokenizer hash {got[:16]} differs from the recorded {results['model']['tokenizer_sha256'][:16]}")
    report.count("tokenizer_hash")
    return tok


def _packaged_tokenizer():
    """The packaged Gemma's tokenizer from its GGUF's vocabulary in the model cache (no weights read), or None."""
    from graft_core import model as model_mod
    from graft_core import packaged

    found = sorted((model_mod.model_cache_dir() / "gemma-3-270m-gguf").glob("*.gguf"))
    return packaged.tokenizer(found[0]) if found else None


def _gguf_tokenizer_dir(name: str, report: RecheckReport) -> Path | None:
    """Where the model load kept the tokenizer it read from a GGUF's metadata (graft_core.model), or None with a
    note: reading it from the file again takes minutes, and the offline check stands without it."""
    from graft_core import model as model_mod
    from graft_core import packaged

    try:
        path = packaged.smollm2_file() if name == model_mod.SMOLLM2 else Path(name).expanduser()
    except packaged.Mismatch as e:
        report.notes.append(f"{e}: token ids not decoded (stored text re-scored instead)")
        return None
    folder = model_mod.gguf_metadata_dir(path) if path.is_file() else None
    if folder is None:
        report.notes.append(
            f"the tokenizer of {name} has not been read from its GGUF on this machine (load the model once): "
            "token ids not decoded (stored text re-scored instead)"
        )
    return folder


def _template(results: dict, tok, report: RecheckReport) -> templates.Template:
    """The template the answers are cut under: the recorded one (the plain form where none is recorded), which the
    tokenizer's own, where it is here, must equal."""
    recorded = harness.recorded_template(results)
    if tok is not None:
        report.count("template")
        got = templates.of(tok)
        if got != recorded:
            report.fail(f"the tokenizer's template differs from the recorded one: the tokenizer's {got!r}, recorded {recorded!r}")
    return recorded


def check_offline(results: dict, report: RecheckReport) -> None:
    """Data hashes, output token hashes, decoded text, verdicts and every aggregate."""
    if results.get("format") != harness.FORMAT:
        report.fail(f"format {results.get('format')!r} is not {harness.FORMAT}")
        return
    for path, sha in results["data"].items():
        p = harness.resolve(path)
        if not p.exists():
            report.fail(f"data file {path} is missing")
            continue
        got = harness.file_sha256(p)
        report.count("data_sha256")
        if got != sha:
            report.fail(f"data file {path}: sha256 {got} differs from the recorded {sha}")
    roles = results["data_roles"]
    rows = {}
    for role in ("knowledge", "problems"):
        p = harness.resolve(roles[role])
        if p.exists():
            rows.update({r["id"]: r for r in harness.read_jsonl(p)})
    tok = _tokenizer(results, report)
    template = _template(results, tok, report)
    outputs = results["outputs"]
    report.outputs = len(outputs)
    for i, o in enumerate(outputs):
        where = f"output {i} ({o['item']} {o['condition']})"
        if generate.tokens_sha256(o["token_ids"]) != o["output_sha256"]:
            report.fail(
                f"{where}: token ids hash to {generate.tokens_sha256(o['token_ids'])[:16]}, recorded {o['output_sha256'][:16]}"
            )
        report.count("output_sha256")
        completion = o["completion"]
        if tok is not None:
            decoded = tok.decode(o["token_ids"], skip_special_tokens=True)
            if decoded != completion:
                report.fail(f"{where}: token ids decode to {decoded!r}, recorded {completion!r}")
            completion = decoded
            report.count("decoded_text")
        answer = harness.answer_of(completion, template)
        if answer != o["answer"]:
            report.fail(f"{where}: answer cut from the completion is {answer!r}, recorded {o['answer']!r}")
        row = rows.get(o["item"])
        if row is None:
            report.fail(f"{where}: item {o['item']} is not in the data files")
            continue
        reference = row["answer"] if o["set"] == "knowledge" else row["reference"]
        if (reference, row["verifier"]) != (o["reference"], o["verifier"]):
            report.fail(f"{where}: the data file's reference/verifier differ from the recorded ones")
        ok = verifiers.judge(answer, row["verifier"], reference, o["query"]).ok
        report.count("verdict")
        if ok != o["correct"] and rejudge.current(o):  # another judge's verdicts are reported below, not failed
            report.fail(f"{where}: re-scored {'correct' if ok else 'wrong'}, recorded {'correct' if o['correct'] else 'wrong'}")
    if "recurring" in results:
        from eval import recurring

        bad, n = recurring.check_case(results["recurring"], rows)
        report.problems.extend(bad)
        report.count("recurring_case", n)
    report.rejudged, report.rejudged_summary = rejudge.notes(results, rows)
    gate = results.get("gate")
    accepted = {d["item"] for d in results["deposits"]} if gate is not None else None
    if gate is not None:
        report.count("gate")
        refused = {r["item"] for r in gate["refused"]}
        if len(accepted) != gate["accepted"] or len(accepted) + len(refused) != gate["offered"] or accepted & refused:
            report.fail(
                f"gate: {len(accepted)} deposits and {len(refused)} refusals do not make the recorded "
                f"{gate['accepted']} accepted of {gate['offered']} offered"
            )
        if gate["acceptance_rate"] != gate["accepted"] / max(1, gate["offered"]):
            report.fail("gate: the acceptance rate is not accepted / offered")
    scores, counts, cost = harness.summarise(outputs, accepted)
    for name, got, want in (
        ("scores", scores, results["scores"]),
        ("counts", counts, results["counts"]),
        ("cost", cost, results["cost"]),
    ):
        report.count("aggregates")
        if _canon(got) != _canon(want):
            diff = [k for k in set(got) | set(want) if _canon(got.get(k)) != _canon(want.get(k))]
            report.fail(f"{name} recomputed from the outputs differ from the recorded ones in: {', '.join(sorted(diff))}")


def rerun(results: dict, report: RecheckReport, lm=None, embedder=None) -> None:
    """Recompute every output with the model in a fresh store; token ids must be equal."""
    import services
    from retrieval.embedder import HashEmbedder

    cfg = harness.EvalConfig(**(results["config"] | {"compare": False}))
    eid = results["embedder"]
    if embedder is None and eid.startswith("hash-"):
        embedder = HashEmbedder(int(eid.split("-")[1].split("@")[0]))
    roles = results["data_roles"]
    with tempfile.TemporaryDirectory(prefix="kvgraft-replay-") as home:
        name = None if lm is not None else results["model"]["name"]
        lib = services.Library(home=home, model_name=name, embedder=embedder, lm=lm)
        if lib.lm.fingerprint != results["model"]["fingerprint"]:
            report.fail(
                f"model fingerprint {lib.lm.fingerprint[:16]} differs from the recorded {results['model']['fingerprint'][:16]} (other weights or configuration)"
            )
        if lib.embedder.embedder_id != eid:
            report.fail(f"embedder {lib.embedder.embedder_id} differs from the recorded {eid}")
        new = harness.evaluate(
            lib,
            cfg,
            harness.resolve(roles["knowledge"]),
            harness.resolve(roles["problems"]),
            sample_ids=results["sample"],
            log=lambda m: None,
        )
        lib.close()
    report.notes.append("rerun without the baseline runs (compare off): baseline timings are not re-measured")

    def key(o):
        return (o["set"], o["condition"], o["item"], o["paraphrase"])

    old = {key(o): o for o in results["outputs"]}
    fresh = {key(o): o for o in new["outputs"]}
    if set(old) != set(fresh):
        report.fail(f"rerun produced {len(fresh)} outputs for {len(old)} recorded ones")
    for k, o in old.items():
        n = fresh.get(k)
        if n is None:
            continue
        report.count("rerun_token_ids")
        if n["token_ids"] != o["token_ids"]:
            report.fail(f"rerun {k}: token ids {n['token_ids']} differ from the recorded {o['token_ids']}")
        if n["artifact_ids"] != o["artifact_ids"]:
            report.fail(f"rerun {k}: grafted {n['artifact_ids']} instead of the recorded {o['artifact_ids']}")


def recheck(path: str | Path, rerun_model: bool = False, lm=None, embedder=None) -> RecheckReport:
    report = RecheckReport(path=str(path))
    try:
        results = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        report.fail(f"cannot read {path}: {e}")
        return report
    try:
        check_offline(results, report)
    except (KeyError, TypeError) as e:
        report.fail(f"results file is missing a field: {e!r}")
        return report
    if rerun_model:
        rerun(results, report, lm=lm, embedder=embedder)
    return report
