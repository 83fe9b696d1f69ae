"""Plots and the README table for a results document. Pure formatting: reads the results dict,
writes PNGs (matplotlib, Agg) and docs/eval/own-set.md (the project's own set; docs/eval/README.md is the
benchmark's, eval/gsm_report.py); computes nothing that replay checks. A results file named
`results-<name>.json` (another model's run) gets its own page and plots, `own-set-<name>.md` and
`accuracy-<name>.png`, `decode_tokens-<name>.png`, beside the packaged Gemma's."""

from __future__ import annotations

import statistics
from pathlib import Path

from graft_core.model import DEFAULT_MODEL, SMOLLM2

RESULTS = "results.json"  # the packaged Gemma's results file (`make eval`); another name gets its own page
NAMES = {DEFAULT_MODEL: "Gemma 3 270M", SMOLLM2: "SmolLM2-135M-Instruct"}  # how a plot's title names a model

ROWS = (
    ("Facts, recurring question, no graft", "knowledge/no_graft"),
    ("Facts, recurring question, graft (retrieved)", "knowledge/graft_recurring"),
    ("Facts, paraphrased question, graft (retrieved)", "knowledge/graft_paraphrase"),
    ("Problems, recurring (deposited), no graft", "problems_deposited/no_graft"),
    ("Problems, recurring (deposited), graft (retrieved)", "problems_deposited/graft_recurring"),
)


def _fmt(x, digits=2) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def suffix(source: str) -> str:
    """What a page's and its plots' names carry after their stem: '' for results.json, '-smollm2' for
    results-smollm2.json."""
    return Path(source).stem.removeprefix("results")


def _chat(results: dict) -> bool:
    return bool((results.get("template") or {}).get("chat"))


def plots(results: dict, folder: Path, source: str = RESULTS) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    counts = results["counts"]
    labels = [
        "facts\nno graft",
        "facts\ngraft",
        "facts\nparaphrase",
        "problems\nno graft",
        "problems\ngraft",
    ]
    vals = [counts[k]["accuracy"] or 0.0 for _, k in ROWS]
    ns = [counts[k]["n"] for _, k in ROWS]
    colours = ["#999999", "#2a7ab0", "#5fa8d3", "#999999", "#2a7ab0"]
    fig, ax = plt.subplots(figsize=(9, 4))
    bars = ax.bar(labels, vals, color=colours)
    for b, v, n in zip(bars, vals, ns):
        ax.text(b.get_x() + b.get_width() / 2, v + 0.02, f"{v:.0%}\nn={n}", ha="center", fontsize=8)
    ax.set_ylim(0, 1.15)
    ax.set_ylabel("accuracy (dataset verifier on the cut answer)")
    name = NAMES.get(results["model"]["name"], results["model"]["name"])
    ax.set_title(f"{name}, accuracy per condition ({results['sample_note']})", fontsize=9)
    fig.tight_layout()
    acc = folder / f"accuracy{suffix(source)}.png"
    fig.savefig(acc, dpi=110)
    plt.close(fig)

    rec = [o for o in results["outputs"] if o["condition"] == "graft_recurring" and o.get("baseline")]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    ours = [o["computed_tokens"] + o["decode_tokens"] for o in rec]
    base = [o["baseline"]["prefill_tokens"] + o["baseline"]["decode_tokens"] for o in rec]
    axes[0].boxplot([ours, base], tick_labels=["graft\n(prompt + decode)", "no graft\n(prefix + prompt + decode)"])
    axes[0].set_ylabel("tokens computed per recurring answer")
    axes[0].set_title("Tokens computed (measured)", fontsize=9)
    dec = [o["decode_tokens"] for o in rec]
    bdec = [o["baseline"]["decode_tokens"] for o in rec]
    ng = [o["decode_tokens"] for o in results["outputs"] if o["condition"] == "no_graft" and o["set"] != "problems_heldout"]
    top = max(dec + bdec + ng + [1])
    bins = range(0, top + 2)
    axes[1].hist(
        [dec, bdec, ng],
        bins=bins,
        label=["graft", "no-graft baseline (prefix recomputed)", "no graft, no prefix"],
        color=["#2a7ab0", "#999999", "#e08a2a"],
    )
    axes[1].axvline(8.5, color="k", ls="--", lw=0.8)
    axes[1].set_xlabel(f"decode tokens (budget {results['config']['max_new_tokens']}, target <= 8)")
    axes[1].set_ylabel("answers")
    axes[1].legend(fontsize=7)
    axes[1].set_title("Decode tokens per recurring answer", fontsize=9)
    fig.tight_layout()
    tok = folder / f"decode_tokens{suffix(source)}.png"
    fig.savefig(tok, dpi=110)
    plt.close(fig)
    return [acc, tok]


def reading(results: dict) -> list[str]:
    """Sentences computed from the numbers, so the prose cannot drift from the table."""
    s = results["scores"]

    def pct(x):
        return "n/a" if x is None else f"{x:.0%}"

    lines = [
        f"- Invented facts cannot be known without the graft: {pct(s['no_graft_accuracy_knowledge'])} without, "
        f"{pct(s['grafted_accuracy_recurring_knowledge'])} with the retrieved artifact grafted.",
        f"- Paraphrases are never deposited; retrieval put the fact's own artifact first for {pct(s['paraphrase_retrieval_top1'])} "
        f"of them and the grafted answer was right for {pct(s['grafted_accuracy_paraphrase'])}.",
        _problems_line(results, pct),
    ]
    lines.append(heldout_line(results))
    return lines


def _benchmark(results: dict) -> str:
    return "(README.md)" if results["model"]["name"] == DEFAULT_MODEL else "(README.md, for the model named there)"


def heldout_line(results: dict) -> str:
    """Held-out problems (a same-template problem with other numbers, the nearest deposited problem grafted by
    choice): a right answer whose reference is the grafted example's own repeats that example, not a transfer."""
    outs = results["outputs"]
    example = {d["artifact"]: d["item"] for d in results["deposits"]}
    reference = {o["item"]: o["reference"] for o in outs if o["set"] == "problems_deposited"}
    held = [o for o in outs if o["set"] == "problems_heldout" and o["condition"] == "graft_heldout"]
    right = [o for o in held if o["correct"]]
    copies = [o for o in right if o["artifact_ids"] and reference.get(example.get(o["artifact_ids"][-1])) == o["reference"]]
    where = f"Transfer to new instances is measured on the third-party benchmark {_benchmark(results)}."
    if right and len(copies) == len(right):
        n = {1: "one", 2: "two", 3: "three"}.get(len(right), str(len(right)))
        return (
            f"- Held-out problems of this set are not reported: their {n} grafted success{'es' if len(right) > 1 else ''} "
            f"repeated the grafted example's answer, not a transfer. {where}"
        )
    c = results["counts"]["problems_heldout/no_graft"]
    return (
        f"- Held-out problems of this set (other numbers, the nearest deposited problem grafted by choice: a worked "
        f"example, not a transfer measurement): {len(right)} / {len(held)} right with it ({len(copies)} of them the "
        f"grafted example's own answer), {c['correct']} / {c['n']} without. {where}"
    )


def _problems_line(results: dict, pct) -> str:
    """What the grafted problems show: the verified answer read back, or (where the gate deposited no problem)
    that there was none to read."""
    s = results["scores"]
    ids = set(results["sample"]["problems_deposited"])
    figures = f"{pct(s['no_graft_accuracy_problems'])} without, {pct(s['grafted_accuracy_recurring_problems'])} with the graft"
    if any(d["item"] in ids for d in results["deposits"]):
        return (
            f"- Recurring problems (the same problem was deposited with its verified worked solution): {figures}: "
            "the model reads the verified answer back, it does not solve the problem."
        )
    return (
        f"- Recurring problems (the same problem offered to the gate with its verified worked solution): {figures}: "
        f"the gate deposited none of the {len(ids)}, so none was in the store to read back."
    )


def _budget_reached(results: dict) -> str:
    """How many recurring answers reached the decode budget (an instruct model's answer is a sentence or more)."""
    budget = results["config"]["max_new_tokens"]
    rec = [o for o in results["outputs"] if o["condition"] == "graft_recurring"]
    full = sum(1 for o in rec if o["decode_tokens"] >= budget)
    return (
        f" ({full} of {len(rec)} grafted recurring answers reached the budget of {budget} decode tokens: an answer that "
        "reaches it stops there, its end of turn decoded or not)"
    )


def _split(results: dict) -> str:
    parts = []
    for set_name, label in (("knowledge", "facts"), ("problems_deposited", "problems")):
        d = sorted(o["decode_tokens"] for o in results["outputs"] if o["set"] == set_name and o["condition"] == "graft_recurring")
        if d:
            p95 = d[min(len(d) - 1, int(round(0.95 * (len(d) - 1))))]
            parts.append(f"{label}: median {statistics.median(d):g}, p95 {p95}, max {d[-1]}")
    if _chat(results):
        return "; ".join(parts) + _budget_reached(results)
    return "; ".join(parts) + " (problem answers are long decimals or fractions, one token per digit)"


def recurring_lines(case: dict | None, source: str = RESULTS) -> list[str]:
    """The recurring case of this set: withdrawn (its records stay in results.json, the labelled set's source)."""
    if case:
        return [
            "## The recurring case of this set: withdrawn",
            "",
            f"`{source}` keeps this set's recurring-case records (the judge's labelled set was drawn from them), "
            "but its ratio is not a measurement: its baseline attempts were scored by the verifier's whole-answer "
            "check and its recalls by the claim reader, and re-judged by the one judge the 'never solved' problems "
            f"have passing attempts (`python cli.py replay-eval docs/eval/{source}` lists them). The recurring "
            "case is measured on the benchmark (README.md).",
            "",
        ]
    return []


def gate_lines(results: dict, source: str = RESULTS) -> list[str]:
    """The deposit gate's acceptance (not the grafted accuracy on the accepted items: that restates it)."""
    gate, c = results.get("gate"), results["counts"]
    if not gate or "recurring/graft_recurring/accepted" not in c:
        return ["Deposits in this run did not pass through the verification gate (no acceptance rate recorded).", ""]
    lines = [
        f"**Deposit gate:** {gate['accepted']} / {gate['offered']} sampled items accepted (acceptance rate "
        f"{_fmt(gate['acceptance_rate'])}): an item is deposited only when the model, with its artifact grafted, answers "
        "its question and the verifier accepts that answer. A refused item is not deposited, so its questions above are "
        "answered without its artifact (counted wrong unless the model knows). The grafted accuracy on the accepted "
        "items alone is not reported: the gate accepted an item because its grafted answer passed, so that figure "
        "restates the acceptance.",
    ]
    reasons = "; ".join(f"{r['item']}: {r['reason'][:90]}" for r in gate["refused"][:3])
    return [*lines, "", f"Refused (first 3 of {len(gate['refused'])}, all in `{source}` under `gate`): {reasons}", ""]


def command(results: dict, source: str = RESULTS) -> str:
    """The command that writes `source` (and this page) again."""
    if source == RESULTS and results["model"]["name"] == DEFAULT_MODEL:
        return "make eval"
    rest = "" if "recurring" in results else " --no-recurring"
    return f"python -m eval.run --model {results['model']['name']} --out docs/eval/{source}{rest}"


def _asked(results: dict) -> list[str]:
    """How the model was asked, where it was through its chat template (the plain form is the page's default)."""
    if not _chat(results):
        return []
    return [
        "Asked through the model's own chat template (`graft_core/templates.py`): each deposit is a system turn of "
        "its own, the question the user turn and the generation prompt after it; an answer is the assistant's turn, "
        "to the model's end of turn (or the budget), judged whole.",
    ]


def markdown(results: dict, source: str = RESULTS) -> str:
    c, s, cost = results["counts"], results["scores"], results["cost"]
    sfx = suffix(source)
    ending = "the end of turn that ends the answer" if _chat(results) else "the newline that ends the answer"
    lines = [
        "# The project's own set: invented facts and synthetic problems, with and without a graft",
        "",
        f"Generated by `{command(results, source)}` (`eval/run.py`) from `docs/eval/{source}`; do not edit by hand. The data is the "
        "project's own (`scripts/make_datasets.py` writes `datasets/`): invented facts no model can know, a test of "
        "knowledge the graft carries, not a benchmark. The headline benchmark is GSM8K through GSM-Symbolic "
        "(README.md, `gsm-results.json`).",
        "",
        f"Model `{results['model']['name']}` (fingerprint `{results['model']['fingerprint'][:16]}...`), "
        f"{results['determinism']['dtype']} on {results['determinism']['device']}, greedy, "
        f"torch {results['determinism']['torch_version']}, transformers {results['determinism']['transformers_version']}; "
        f"embedder `{results['embedder']}`; retrieval k={results['config']['k']}.",
        *_asked(results),
        f"Sample: {results['sample_note']}: {len(results['sample']['knowledge'])} facts "
        f"(each asked as deposited and as {results['config']['paraphrases']} paraphrase(s)), "
        f"{len(results['sample']['problems_deposited'])} deposited problems, {len(results['sample']['problems_heldout'])} held-out problems. "
        f"Budget: max_new_tokens={results['config']['max_new_tokens']} for every run, grafted and baseline alike. "
        f"Run wall time {results['wall_s'] / 60:.1f} min.",
        "",
        "| condition | correct / n | accuracy |",
        "|---|---|---|",
    ]
    for label, key in ROWS:
        lines.append(f"| {label} | {c[key]['correct']} / {c[key]['n']} | {_fmt(c[key]['accuracy'])} |")
    lines += [
        f"| **Recurring (facts + problems), no graft** | {c['recurring/no_graft']['correct']} / {c['recurring/no_graft']['n']} | {_fmt(s['no_graft_accuracy_recurring'])} |",
        f"| **Recurring (facts + problems), graft** (`grafted_accuracy_recurring`) | {c['recurring/graft_recurring']['correct']} / {c['recurring/graft_recurring']['n']} | {_fmt(s['grafted_accuracy_recurring'])} |",
        "",
        *gate_lines(results, source),
        f"Retrieval: a paraphrase's top hit is its own fact's artifact in {_fmt(s['paraphrase_retrieval_top1'])} of cases.",
        "",
        "## Cost of a recurring answer (measured in the same run)",
        "",
        "| quantity | graft | no-graft baseline | ratio (baseline / graft) |",
        "|---|---|---|---|",
        f"| decode tokens, median (p95) | {_fmt(cost['decode_tokens_median'])} ({_fmt(cost['decode_tokens_p95'])}) | {_fmt(cost['baseline_decode_tokens_median'])} | |",
        f"| prompt tokens computed, median | {_fmt(cost['prompt_tokens_computed_median'])} | {_fmt(cost['baseline_prefill_tokens_median'])} (prefix + prompt) | |",
        f"| tokens computed, all recurring answers | {cost['tokens_computed_total']:,} | {cost['baseline_tokens_total']:,} | {_fmt(cost['token_ratio'])} |",
        f"| FLOPs (**estimate**), all recurring answers | {cost['flops_estimate_total']:.3g} | {cost['baseline_flops_estimate_total']:.3g} | {_fmt(cost['flops_ratio_estimate'])} |",
        f"| time to first token, sum (s) | {_fmt(cost['ttft_s_total'])} | {_fmt(cost['baseline_ttft_s_total'])} | {_fmt(cost['ttft_ratio'])} |",
        f"| total time, sum (s) | {_fmt(cost['total_s_total'])} | {_fmt(cost['baseline_total_s_total'])} | {_fmt(cost['total_ratio'])} |",
        "",
        f"{_fmt(cost['decode_tokens_within_target'])} of recurring answers used <= 8 decode tokens (the count includes {ending}); "
        f"{_split(results)}. "
        f"The baseline recomputes the deposited prefix plus the prompt in one prefill and decodes to the same budget; "
        f"its output equalled the grafted output in {_fmt(cost['baseline_same_output'])} of cases. "
        "Graft time includes reading and hash-checking the artifact. Wall-clock figures were measured on 2 CPU cores shared with other jobs: "
        "they are noisy; the token counts are exact and the FLOPs are estimates (accounting.py).",
        "",
        *recurring_lines(results.get("recurring"), source),
        "## Honest reading",
        "",
        *reading(results),
        "",
        "## Plots",
        "",
        f"![accuracy](accuracy{sfx}.png)",
        "",
        f"![decode tokens](decode_tokens{sfx}.png)",
        "",
        "## Commands",
        "",
        "```",
        *_commands(results, source),
        "```",
        "",
        "Replay without the model re-hashes the data files, re-hashes every output's token ids against its "
        "stored sha256, decodes the ids with the tokenizer files alone (no weights) and compares with the stored text, "
        "re-scores every answer with the dataset's verifier and recomputes every aggregate. Any mismatch exits non-zero.",
        "",
        "## Data",
        "",
    ]
    for path, sha in results["data"].items():
        lines.append(f"- `{path}` sha256 `{sha}`")
    return "\n".join(lines) + "\n"


def _commands(results: dict, source: str) -> list[str]:
    if command(results, source) == "make eval":
        return [
            "make eval                                                     # bounded sample (this file)",
            ".venv/bin/python -m eval.run --full                            # every item (hours on 2 cores)",
            "python cli.py replay-eval docs/eval/results.json              # re-check hashes and scores, no model",
            "python cli.py replay-eval docs/eval/results.json --rerun      # recompute with the model, token ids byte for byte",
        ]
    return [
        f"{command(results, source)}  # bounded sample (this file)",
        f"python cli.py replay-eval docs/eval/{source}  # re-check hashes and scores, no model",
        f"python cli.py replay-eval docs/eval/{source} --rerun  # recompute with the model, token ids byte for byte",
    ]


def page(source: str = RESULTS) -> str:
    """The page written from `source`: own-set.md for results.json, own-set-<name>.md for results-<name>.json."""
    return f"own-set{suffix(source)}.md"


def write(results: dict, folder: Path, source: str = RESULTS) -> list[Path]:
    paths = plots(results, folder, source)
    readme = folder / page(source)
    readme.write_text(markdown(results, source), encoding="utf-8")
    return [*paths, readme]
