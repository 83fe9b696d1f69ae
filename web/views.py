"""What the web app shows: input checks, the evidence panel, the library/verify/dashboard tables and plots.

Pure formatting of values that `services` returns (HTML strings and matplotlib Figure objects,
no pyplot state); no Gradio, torch or SQL here, so it can be tested without a server.
"""

from __future__ import annotations

import html
import unicodedata
from typing import TYPE_CHECKING

import services

if TYPE_CHECKING:  # matplotlib (~1 s) loads with the first plot, not with the page
    from matplotlib.figure import Figure

# ---- input checks and formatting -----------------------------------------------------------


def input_problem(text: object) -> str | None:
    """A clear message for input the app refuses before it reaches the model, or None."""
    if not isinstance(text, str):
        return "Send the question as plain text."
    if not text.strip():
        return "The question is empty: type a question."
    if "\x00" in text:
        return "The question contains NUL bytes (binary data?): send plain text."
    junk = sum(1 for c in text if unicodedata.category(c) in ("Cc", "Cs", "Co", "Cn") and c not in "\n\r\t")
    if junk:
        return f"The question contains {junk} control or unassigned characters (binary data?): send plain text."
    return None


def shown(text: object, limit: int = 600) -> str:
    """User text as it is echoed in the chat: control characters made visible, long text cut."""
    s = text if isinstance(text, str) else repr(text)
    s = "".join(c if c in "\n\t" or unicodedata.category(c)[0] != "C" else "\ufffd" for c in s)
    return s if len(s) <= limit else s[:limit] + f" … ({len(s):,} characters)"


def esc(x: object) -> str:
    return html.escape(str(x))


def ms(s: float | None) -> str:
    return "–" if s is None else f"{s * 1000:.1f} ms"


def _verdict(r: services.AnswerResult) -> tuple[str, str]:
    """(css class, word): the full check when it ran, else the per-answer proof, else why neither."""
    if r.check is not None:
        return ("kv-pass", "EXACT") if r.check.exact else ("kv-fail", "NOT EXACT")
    if r.proof is not None and r.proof.passed is not None:
        word = f"{r.proof.kind.upper()} PROOF {'PASSED' if r.proof.passed else 'FAILED'}"
        return ("kv-pass" if r.proof.passed else "kv-fail"), word
    return "kv-nocheck", "NOT CHECKED"


def badge(r: services.AnswerResult) -> str:
    cls, text = _verdict(r)
    if cls == "kv-nocheck":
        why = "nothing grafted" if r.tier == "none" else (r.proof.note if r.proof is not None else "check off")
        return f'<span class="kv-nocheck">NOT CHECKED</span> <span class="kv-muted">({esc(why)})</span>'
    return f'<span class="kv-badge {cls}">{text}</span>'


def _proof_html(p) -> str:
    if p.kind == "probe":
        rows = [
            ("deposit-time probe logits SHA-256", p.expected),
            ("restored state's probe logits SHA-256", p.observed),
            ("served state BLAKE3 (= the probed state's)", p.state_digest),
            ("cost", f"{p.proof_s * 1000:.1f} ms (first use in this process: probe forward + state hashes)"),
        ]
        head = "Probe proof (first answer from this artifact in this process)"
    else:
        rows = [
            ("state BLAKE3 proved by the probe at first use", p.expected),
            ("served state BLAKE3", p.observed),
            ("deposit-time probe logits SHA-256 it reproduced", p.probe_sha256),
            ("cost", f"{p.proof_s * 1000:.1f} ms (one hash of the served keys and values)"),
        ]
        head = "State proof (answers after the artifact's first use in this process: its first answer or the start-up's warm-up)"
    return (
        f'<div class="kv-sub">{esc(head)}</div><table class="kv-table kv-hash">'
        + "".join(f"<tr><th>{esc(k)}</th><td><code>{esc(v)}</code></td></tr>" for k, v in rows)
        + f'</table><div class="kv-note">Proves: {esc(p.note)}. Does not prove: {esc(p.limits)}. '
        "The full check (tick “check exactness”, or `cli.py verify`) recomputes the prefix and compares "
        "every served logits row.</div>"
    )


def evidence_html(r: services.AnswerResult) -> str:
    """The evidence panel for one answer: retrieval, tier, token accounting, timing, exactness."""
    baseline_total = r.savings.baseline_total
    ours = r.savings.computed_total
    measured = r.baseline is not None
    parts = [
        f'<div class="kv-evidence"><div class="kv-head">{badge(r)} <span class="kv-tier kv-tier-{esc(r.tier)}">tier {esc(r.tier)}</span>'
        + (f' <span class="kv-model">model {esc(r.model)}</span>' if r.model else "")
        + (f' <span class="kv-scope">{esc(r.scope)}</span>' if r.scope else "")
        + "</div>"
    ]
    rows = [
        ("tokens grafted (restored, not computed)", f"{r.grafted_tokens:,}"),
        ("tokens computed (prompt)", f"{r.computed_tokens:,}"),
        ("tokens decoded", f"{r.decode_tokens:,}"),
        (
            "no-graft baseline" + (" (measured)" if measured else " (estimate: baseline not run)"),
            f"{baseline_total:,} tokens → {baseline_total / max(1, ours):.1f}× fewer with graft"
            if r.artifact_ids
            else "nothing relevant grafted: no savings claimed",
        ),
        ("time to first token", ms(r.ttft_s)),
    ]
    if measured:
        rows.append(
            (
                "baseline time to first token (measured)",
                f"{ms(r.baseline.ttft_s)} → {r.ttft_speedup:.2f}× speedup",
            )
        )
    rows += [("artifact read", ms(r.read_s)), ("total", ms(r.total_s))]
    parts.append(
        '<table class="kv-table">' + "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in rows) + "</table>"
    )
    if r.proof is not None and r.proof.passed is not None:
        parts.append(_proof_html(r.proof))
    if r.check is not None:
        c = r.check
        crow = [
            ("fresh logits SHA-256", c.fresh_sha256),
            ("grafted logits SHA-256", c.grafted_sha256),
            ("KL(fresh ‖ grafted)", f"{c.kl:.3g}"),
            ("argmax agreement", f"{c.argmax_agreement * 100:.2f}% over {c.rows} rows"),
            ("max |diff|", f"{c.max_abs_diff:.3g}"),
        ]
        if c.monolithic_max_abs_diff is not None:
            crow.append(
                (
                    "one-pass forward (another schedule, never 'exact')",
                    f"max |diff| {c.monolithic_max_abs_diff:.3g}, argmax {c.monolithic_argmax_agreement * 100:.2f}%",
                )
            )
        parts.append(
            '<div class="kv-sub">Full check (the served logits rows vs a fresh recomputation, same schedule)</div>'
            '<table class="kv-table kv-hash">'
            + "".join(f"<tr><th>{esc(k)}</th><td><code>{esc(v)}</code></td></tr>" for k, v in crow)
            + "</table>"
        )
    if r.retrieved:
        grafted = set(r.artifact_ids)
        trs = "".join(
            f"<tr><td>{'●' if h.id in grafted else '○'}</td><td>{esc(h.title)}</td><td>{h.score:.3f}</td><td>{h.tokens}</td>"
            f"<td>{esc(h.verifier)}: {esc(h.verdict)}</td>"
            f"<td>{('kept as a worked example' if h.use == 'example' else 'kept') if h.relevant else 'dropped'}: {esc(h.reason)}</td></tr>"
            for h in r.retrieved
        )
        parts.append(
            '<div class="kv-sub">Retrieved artifacts (● grafted; only hits the relevance stage keeps are grafted)</div>'
            '<table class="kv-table kv-hits">'
            "<tr><th></th><th>title</th><th>similarity</th><th>tokens</th><th>verifier</th><th>relevance</th></tr>"
            + trs
            + "</table>"
        )
    if r.note:
        parts.append(f'<div class="kv-note">{esc(r.note)}</div>')
    parts.append(
        f'<div class="kv-muted">output sha256 <code>{esc(r.output_sha256[:16])}…</code> · ledger #{esc(r.ledger_id)}</div></div>'
    )
    return "".join(parts)


def evidence_summary(r: services.AnswerResult) -> tuple[str, str]:
    """(title, markdown) of the collapsible evidence note under an answer in the chat."""
    verdict = _verdict(r)[1].lower() if _verdict(r)[0] == "kv-nocheck" else _verdict(r)[1]
    title = f"Evidence · {verdict} · tier {r.tier} · {r.grafted_tokens} grafted / {r.computed_tokens} computed / {r.decode_tokens} decoded"
    title += f" · {r.scope}" if r.scope else ""
    lines = [
        f"- {h.title} (similarity {h.score:.3f}, {h.tokens} tokens, {h.verifier}: {h.verdict}"
        + (", a worked example of the question's shape)" if h.use == "example" and h.relevant else ")")
        for h in r.retrieved
    ]
    if r.proof is not None and r.proof.passed is not None:
        lines.append(f"- {r.proof.kind} proof: expected `{r.proof.expected[:16]}…` vs served `{r.proof.observed[:16]}…`")
    if r.check is not None:
        lines.append(f"- fresh `{r.check.fresh_sha256[:16]}…` vs served `{r.check.grafted_sha256[:16]}…`, KL {r.check.kl:.3g}")
    lines.append(
        f"- time to first token {ms(r.ttft_s)}"
        + (f", baseline {ms(r.baseline.ttft_s)} (measured)" if r.baseline is not None else "")
    )
    if r.note:
        lines.append(f"- {r.note}")
    return title, "\n".join(lines)


LIBRARY_HEADERS = ["id", "title", "kind", "tokens", "start", "verifier", "verdict", "created"]


def library_table(entries: list[services.LibraryEntry]) -> list[list]:
    """The Library tab's rows (LIBRARY_HEADERS order)."""
    return [
        [
            e.row.id[:16],
            e.row.title,
            e.row.kind,
            e.row.tokens,
            e.row.start,
            e.verifier,
            e.verdict,
            e.row.created_at.strftime("%Y-%m-%d %H:%M"),
        ]
        for e in entries
    ]


def verify_summary(rep: services.ExactnessReport) -> tuple[str, list[list]]:
    """The Verify tab's summary line (HTML) and table rows for one report."""
    relocate = rep.relocate
    tier = f"relocated to offset {relocate} (approximate tier)" if relocate is not None else "own position (exact tier)"
    ok = rep.byte_equal == rep.samples
    badge = f'<span class="kv-badge {"kv-pass" if ok else "kv-fail"}">{"EXACT" if ok else "NOT EXACT"}</span>'
    summary = (
        f'<div class="kv-evidence">{badge} <b>{rep.byte_equal}/{rep.samples}</b> byte-equal, {esc(tier)}; '
        f"max KL {rep.max_kl:.3g}, argmax agreement {rep.argmax_agreement * 100:.2f}%</div>"
    )
    rows = [
        [
            r.artifact[:12],
            r.query,
            "yes" if r.check.exact else "no",
            f"{r.check.kl:.3g}",
            f"{r.check.max_abs_diff:.3g}",
            f"{r.check.argmax_agreement * 100:.1f}%",
            r.check.fresh_sha256[:16],
            r.check.grafted_sha256[:16],
        ]
        for r in rep.rows
    ]
    return summary, rows


def stats_html(s: services.StoreStats) -> str:
    """The dashboard's figures: ledger sums and the store against the context window."""
    t = s.totals
    checks = t.checks_passed + t.checks_failed
    md = (
        f'<div class="kv-stats">'
        f'<div class="kv-stat"><b>{t.tokens_saved:,}</b><span>tokens saved (cumulative)</span></div>'
        f'<div class="kv-stat"><b>{t.answers:,}</b><span>answers</span></div>'
        f'<div class="kv-stat"><b>{t.grafted_tokens:,}</b><span>tokens grafted</span></div>'
        f'<div class="kv-stat"><b>{s.flops_ratio:.1f}×</b><span>fewer FLOPs (estimate)</span></div>'
        f'<div class="kv-stat"><b>{s.store_tokens:,}</b><span>tokens in store ({s.artifacts} artifacts) / window {s.window:,}</span></div>'
        f'<div class="kv-stat"><b class="{"kv-ok" if not t.checks_failed else "kv-bad"}">{t.checks_passed}/{checks}</b>'
        f"<span>exactness checks passed ({t.checks_failed} failed)</span></div></div>"
    )
    if s.model:
        held = ", ".join(esc(name) for name in s.models) or "none yet"
        md += f'<div class="kv-muted">model <b>{esc(s.model)}</b> · models in this store: {held}</div>'
    return md


def warn(message: str) -> dict:
    return {"role": "assistant", "content": f"⚠️ {message}"}


# ---- plots (matplotlib Figure objects, no pyplot state) ------------------------------------


def figure(w: float = 6.4, h: float = 3.2) -> tuple[Figure, object]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w, h), dpi=100, layout="constrained")
    return fig, fig.add_subplot()


def tokens_plot(entries) -> Figure:
    fig, ax = figure()
    if not entries:
        ax.text(0.5, 0.5, "no answers yet: ask something in the Chat tab", ha="center", va="center")
        ax.set_axis_off()
        return fig
    xs = list(range(len(entries)))
    ours = [e.computed_tokens + e.decode_tokens for e in entries]
    base = [e.baseline_tokens for e in entries]
    ax.bar([x - 0.2 for x in xs], base, width=0.4, label="no-graft baseline", color="#c9ced6")
    ax.bar([x + 0.2 for x in xs], ours, width=0.4, label="computed with graft", color="#2f6fde")
    est = [x for x, e in zip(xs, entries) if not e.baseline_measured]
    if est:
        ax.scatter(est, [base[x] for x in est], marker="x", color="#6b7280", s=14, label="baseline estimated", zorder=3)
    ax.set_xlim(-0.6, max(len(xs), 6) - 0.4)
    step = max(1, len(xs) // 12)
    ax.set_xticks(xs[::step], [f"#{e.id}" for e in entries][::step], fontsize=8)
    ax.set_xlabel("answer (ledger id, oldest → newest)")
    ax.set_ylabel("tokens")
    ax.set_title(f"Tokens per answer: computed vs baseline (last {len(entries)} answers)")
    ax.legend(fontsize=8, loc="upper right")
    return fig


def speedup_plot(entries) -> Figure:
    fig, ax = figure()
    speedups = [e.baseline_ttft_s / max(e.ttft_s, 1e-9) for e in entries if e.baseline_ttft_s is not None]
    if not speedups:
        ax.text(0.5, 0.5, "no measured baseline yet:\ntick 'compare with no graft' in the Chat tab", ha="center", va="center")
        ax.set_axis_off()
        return fig
    top = max(max(speedups) * 1.15, 2.0)
    ax.hist(speedups, bins=[top * i / 24 for i in range(25)], color="#16a34a", edgecolor="white")
    ax.axvline(1.0, color="#6b7280", linestyle="--", linewidth=1, label="no speedup")
    ax.set_xlim(0, top)
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.legend(fontsize=8, loc="upper right")
    ax.set_xlabel("time-to-first-token speedup (baseline / graft, measured)")
    ax.set_ylabel("answers")
    ax.set_title(f"TTFT speedup over {len(speedups)} measured of the last {len(entries)} answers")
    return fig


def store_plot(store_tokens: int, window: int) -> Figure:
    fig, ax = figure(6.4, 1.8)
    ax.barh(["store"], [store_tokens], color="#7c3aed")
    ax.axvline(window, color="#dc2626", linestyle="--", label=f"context window {window:,}")
    ax.set_xlim(0, max(store_tokens, window) * 1.1)
    ax.set_xlabel("tokens")
    ax.set_title(f"Store: {store_tokens:,} tokens = {store_tokens / max(1, window):.2f}× the context window")
    ax.legend(fontsize=8, loc="lower right")
    return fig


def verify_plot(rows: tuple[services.ExactnessSample, ...], relocate: int | None) -> Figure:
    fig, ax = figure()
    if not rows:
        ax.set_axis_off()
        return fig
    xs = list(range(1, len(rows) + 1))
    if relocate is None:
        ax.bar(xs, [1 if r.check.exact else 0 for r in rows], color=["#16a34a" if r.check.exact else "#dc2626" for r in rows])
        ax.set_ylim(0, 1.2)
        ax.set_ylabel("byte-equal (1 = SHA-256 equal)")
        ax.set_title("Own position: graft vs fresh, per sample")
    else:
        ax.bar(xs, [max(r.check.max_abs_diff, 1e-12) for r in rows], color="#f59e0b", label="max |diff|")
        ax.set_yscale("log")
        ax.set_ylabel("max |logit diff| (log)")
        ax2 = ax.twinx()
        ax2.plot(xs, [r.check.argmax_agreement * 100 for r in rows], "o-", color="#2f6fde", label="argmax agreement %")
        ax2.set_ylim(0, 105)
        ax2.set_ylabel("argmax agreement %")
        ax.set_title(f"Relocated to offset {relocate} (approximate tier)")
    ax.set_xlabel("sample")
    return fig


# ---- solve and learn (the flywheel) ---------------------------------------------------------


def solve_summary(r: services.Solved) -> tuple[str, list[list]]:
    """One line saying what `solve` found and what it cost, and the attempts table."""
    if r.solved and r.source == "library":
        head = f"**Recalled from the library** (`{r.id[:16]}…`): {r.answer!r} for {r.tokens_spent:,} tokens computed; nothing deposited."
    elif r.solved:
        head = (
            f"**Solved by the model and deposited** (`{r.id[:16]}…`): {r.answer!r} after {len(r.attempts)} attempt(s), "
            f"{r.tokens_spent:,} tokens of a {r.budget:,}-token budget. The next time it is recalled for a handful."
        )
    else:
        head = f"**Not solved** within the budget: {r.tokens_spent:,} of {r.budget:,} tokens spent over {len(r.attempts)} attempt(s)."
    rows = [
        [
            i + 1,
            a.mode,
            a.temperature,
            "" if a.seed is None else a.seed,
            a.answer,
            "pass" if a.passed else "fail",
            a.tokens,
            a.detail,
        ]
        for i, a in enumerate(r.attempts)
    ]
    return head, rows


def flywheel_plot(f: services.Flywheel) -> Figure:
    """Library size over time, discovery vs recall tokens per solved item, cumulative tokens saved."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12.8, 3.2), dpi=100, layout="constrained")
    a1, a2, a3 = fig.subplots(1, 3)
    if f.growth:
        t0 = f.growth[0][0]
        a1.step([(t - t0) / 60 for t, _ in f.growth], [n for _, n in f.growth], where="post", color="#7c3aed")
    a1.set_xlabel(f"minutes since the first of the last {len(f.growth)} deposits")
    a1.set_ylabel("artifacts")
    a1.set_title("Library size over time")
    if f.items:
        xs = list(range(len(f.items)))
        a2.bar([x - 0.2 for x in xs], [d for _, d, _, _ in f.items], width=0.4, label="discover (solve)", color="#c9ced6")
        a2.bar([x + 0.2 for x in xs], [r or 0 for _, _, r, _ in f.items], width=0.4, label="recall (mean)", color="#2f6fde")
        a2.set_xticks(xs, [i[:6] for i, _, _, _ in f.items], fontsize=8)
        a2.set_yscale("log")
        a2.legend(fontsize=8)
    else:
        a2.text(0.5, 0.5, "nothing solved yet:\nuse the Solve and learn tab", ha="center", va="center")
    a2.set_ylabel("tokens computed")
    a2.set_title(f"Per item: discovery vs recall (last {len(f.items)} found)")
    if f.cumulative_saved:
        t0 = f.cumulative_saved[0][0]
        a3.step([(t - t0) / 60 for t, _ in f.cumulative_saved], [s for _, s in f.cumulative_saved], where="post", color="#16a34a")
    a3.set_xlabel(f"minutes since the first of the last {len(f.cumulative_saved)} recalls")
    a3.set_ylabel("tokens")
    a3.set_title("Tokens saved by recalls (vs discovering again)")
    return fig
