"""Mutation check: each bug that would make a core claim false, applied to a temporary copy of the
repository, must fail the fast tests named beside it (the table of core-claim bugs, kept true).

A mutation is an exact string replacement in one file; the string must occur exactly once, so a
refactor that removes or duplicates the site fails loudly here instead of passing silently. The
unmutated copy runs the same tests first and must pass them (a caught mutant means something only
then). `python -m scripts.mutants [--list] [NAME ...]`; exit 1 when a mutant survives. A mutation whose line never
runs on this machine (measured, `runs_here`) is reported as not run, not as caught.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]
    runs_here: str = ""  # Python printing why the mutated line never runs on this machine ("" if it runs)


# MKL's padded column products and stacked prompts are used only at the widths whose bytes a load-time check
# finds equal to the 1-row products; where no width passes (measured on an Intel Xeon), sessions step alone
# and these lines never run, so no test can see them changed. Measured in the copy, on the tiny model.
_MKL_BATCHING = (
    "import tempfile, pathlib; from graft_core import tiny, model; from graft_core.batch import Batcher; "
    "d = pathlib.Path(tempfile.mkdtemp()) / 'g'; tiny.build('gemma3', d); "
    "b = Batcher(model.load(str(d), linear='torch').model); "
    "print('' if b.widths else 'MKL batching is off on this CPU: ' + b.why)"
)


# A build's own kernels run only where the CPU has its instructions (measured in the copy).
_BUILD = "from kernels import build; print('' if '{isa}' in build.runnable() else 'no {isa} on this CPU')"
_ATTENTION = "tests/test_numerics.py::test_attention_is_its_written_definition_in_every_build"
_PROOF = "tests/test_proof.py::"
_WRONG_CACHE = _PROOF + "test_an_answer_served_from_a_wrong_cache_fails_the_proof_and_the_full_check"
_SERVED = _PROOF + "test_a_grafted_answer_carries_a_passing_probe_proof_and_its_served_rows_are_exact"
MUTATIONS = (
    Mutation(
        "exact from the tier label (exactness.check)",
        "graft_core/exactness.py",
        "exact=(f_sha == g_sha and torch.equal(f_rows, g_rows)),",
        'exact=(tier == "exact"),',
        (
            _PROOF + "test_the_exactness_check_is_decided_by_bytes_not_by_the_tier",
            "tests/test_engine.py::test_relocation_stays_under_its_measured_bound_and_is_never_called_exact",
        ),
    ),
    Mutation(
        "exact taken without comparing the served rows (proof.full_check)",
        "graft_core/proof.py",
        "exact=f_sha == s_sha,",
        "exact=True,",
        (_WRONG_CACHE,),
    ),
    Mutation(
        "served answer from an empty cache while the check still runs",
        "graft_core/generate.py",
        'cache, start, tier = restore(lm, chain), chain[-1].end, "exact"',
        'cache, start, tier = new_cache(lm.model), chain[-1].end, "exact"',
        (_SERVED + "[gemma]",),
    ),
    Mutation(
        "relocation without re-rotating the keys",
        "graft_core/graft.py",
        "keys.append((k * cos + _rotate_half(k) * sin).to(k.dtype).contiguous())",
        "keys.append(k.contiguous())",
        ("tests/test_engine.py::test_relocation_stays_under_its_measured_bound_and_is_never_called_exact",),
    ),
    Mutation(
        "a sliding layer's cumulative_length restored one short",
        "graft_core/layers.py",
        "layer.cumulative_length = state.seen",
        "layer.cumulative_length = state.seen - 1",
        ("tests/test_engine.py::test_artifacts_around_the_window_are_byte_equal",),
    ),
    Mutation(
        "a sliding layer's cumulative_length restored one long",
        "graft_core/layers.py",
        "layer.cumulative_length = state.seen",
        "layer.cumulative_length = state.seen + 1",
        ("tests/test_engine.py::test_artifacts_around_the_window_are_byte_equal",),
    ),
    Mutation(
        "the blob SHA-256 check skipped on read",
        "db/blobs.py",
        "if actual != content_hash:",
        "if False:",
        ("tests/test_engine.py::test_tampered_blob_raises_integrity_error",),
    ),
    Mutation(
        "verifiers always pass",
        "verifiers/judges.py",
        "return validate(item).compare(item.answer, item.reference)",
        'return Verdict(True, item.verifier, "mutant")',
        ("tests/test_verifiers.py",),
    ),
    Mutation(
        "the claim reader ignores a denial of the reference (verifiers/claims.read_exact)",
        "verifiers/claims.py",
        "        why = problem(toks, m)\n        if why:",
        '        why = problem(toks, m)\n        if why and not why.startswith("denies"):',
        ("tests/test_gate_claims.py::test_the_judge_reads_what_the_answer_asserts",),
    ),
    Mutation(
        "a nominal negation reaches the whole clause ('no emblem and is saffron' denies saffron)",
        "verifiers/sentences.py",
        '        if not (t.kind == "num" or (t.kind == "word" and (t.low not in FUNCTION or t.low in _DETERMINERS))):',
        "        if False:",
        ("tests/test_gate_claims.py::test_the_judge_reads_what_the_answer_asserts",),
    ),
    Mutation(
        "the judge reads the first 'The answer is' sentence, not the last (kvgraft-judge/4 rule 4b)",
        "verifiers/judging.py",
        "said = found[-1] if found else None",
        "said = found[0] if found else None",
        ("tests/test_judge.py::test_the_last_answer_sentence_decides", "tests/test_labels.py"),
    ),
    Mutation(
        "an equation chain's members are not checked against its result (verifiers/quantities)",
        "verifiers/quantities.py",
        "if v is not None and value is not None and abs(v - value) > t + tol:",
        "if False:",
        ("tests/test_gate_claims.py::test_the_judge_reads_what_the_answer_asserts",),
    ),
    Mutation(
        "the first-use probe proof skipped (always passes)",
        "graft_core/proof.py",
        "passed = probe_row == leaf.probe_sha256 and probed_state == observed_state",
        "passed = True",
        (_WRONG_CACHE,),
    ),
    Mutation(
        "the per-answer state proof skipped (always passes)",
        "graft_core/proof.py",
        "passed = observed_state == known.digest and known.probe_sha256 == leaf.probe_sha256",
        "passed = True",
        (_PROOF + "test_a_later_answer_proves_its_served_state_by_hash_and_fails_on_one_changed_value",),
    ),
    Mutation(
        "weights left wherever the loader put them (determinism.place_weights)",
        "graft_core/determinism.py",
        "        p.data = copy_at(p.data, rem, mod)\n",
        "",
        ("tests/test_engine.py::test_weights_sit_where_their_bits_depend_only_on_their_values",),
    ),
    Mutation(
        "split vocabulary product taken without its byte check (products.split_vocabulary)",
        "graft_core/products.py",
        "same = torch.equal(split.plain(probe), split.split(probe))",
        "same = True",
        ("tests/test_products.py::test_split_is_refused_when_its_bytes_differ",),
    ),
    Mutation(
        "transposed row counts taken without their byte check (products.transposed_rows)",
        "graft_core/products.py",
        "if torch.equal(F.linear(xs, weight), transposed_product(weight, xs)):",
        "if True:",
        ("tests/test_products.py::test_row_counts_whose_transposed_bytes_differ_are_left_plain",),
    ),
    # A wrong product in a torch pass is found by the whole-pass measurement at build, which then steps
    # sessions alone (the served bytes stay right): the bug that would break the claim is skipping it.
    Mutation(
        "sessions batched without measuring a whole pass against stepping alone (batch.Batcher)",
        "graft_core/batch.py",
        "steps_differ = self._steps_differ()",
        'steps_differ = ""',
        ("tests/test_batch.py::test_a_pass_whose_rows_differ_from_alone_is_not_used",),
    ),
    Mutation(
        "prompts stacked without measuring a stacked pass against each prompt alone (batch.Batcher)",
        "graft_core/batch.py",
        "prompts_differ = self._prompts_differ()",
        'prompts_differ = ""',
        ("tests/test_batch.py::test_stacked_prompts_whose_rows_differ_run_alone_and_steps_still_batch",),
    ),
    Mutation(
        "prompts stacked whatever their length (batch.Batcher.prefill)",
        "graft_core/batch.py",
        "if not together or len(ids) not in self.stack_sizes:",
        "if not together:",
        ("tests/test_batch.py::test_tiny_prompts_stacked_in_one_pass_match_each_alone",),
        _MKL_BATCHING,
    ),
    Mutation(
        "a pass's decode steps taken as multi-row products beside prompts (batch.Batcher._mixed)",
        "graft_core/batch.py",
        "return torch.cat([self._columns(weight, x[:n]), self._stacked(weight, x[n:].clone())])",
        "return torch.cat([F.linear(x[:n], weight), self._stacked(weight, x[n:].clone())])",
        (
            "tests/test_batch.py::test_tiny_steps_and_prompts_in_one_pass_match_each_alone",
            "tests/test_batch.py::test_tiny_steps_beside_first_prompts_into_empty_caches_match_each_alone",
        ),
    ),
    Mutation(
        "prompts joined to decode passes whatever their length (batch.Batcher.run)",
        "graft_core/batch.py",
        "stackable = [i for i, p in enumerate(prompts) if len(p[1]) in self.stack_sizes]",
        "stackable = list(range(len(prompts)))",
        ("tests/test_batch.py::test_tiny_steps_and_prompts_in_one_pass_match_each_alone",),
        _MKL_BATCHING,
    ),
    Mutation(
        "GGUF blocks used without checking they expand to the float32 weight (fma16.take_over)",
        "kernels/fma16.py",
        "if not torch.equal(dequantize(rows, fmt, n, k, isa=isa).view(torch.int32), p.detach().contiguous().view(torch.int32)):",
        "if False:",
        ("tests/test_fma16.py::test_take_over_uses_blocks_only_where_they_expand_to_the_weight",),
    ),
    Mutation(
        "fma16 taken over without checking it against its C definition (fma16.take_over)",
        "kernels/fma16.py",
        'checked[key] = "" if digest in known else check_shape(op)',
        'checked[key] = ""',
        ("tests/test_fma16.py::test_a_kernel_that_differs_from_its_definition_is_refused",),
    ),
    Mutation(
        "the Llama family's RMSNorm with Gemma's + 1 (kernels/c/rows.c kv_rmsnorm_mul)",
        "kernels/c/rows.c",
        "return rmsnorm_rows(x, rows, n, w, eps, y, threads, 0);",
        "return rmsnorm_rows(x, rows, n, w, eps, y, threads, 1);",
        ("tests/test_llama.py::test_silu_is_rounded_once_and_the_norm_has_no_plus_one",),
    ),
    Mutation(
        "the lean step leaves out the projections' biases (kernels/c/step.c layer_linear)",
        "kernels/c/step.c",
        "    if (b)\n",
        "    if (b && 0)\n",
        ("tests/test_llama.py::test_lean_steps_and_prompts_are_the_rows_of_forward_chunk",),
    ),
    Mutation(
        "SiLU divided in float32, not double: rounded twice (kernels/c/scalar.c silu_one)",
        "kernels/c/scalar.c",
        "return v != v ? xf : (float)(v / (1.0 + e));",
        "return v != v ? xf : (float)v / (float)(1.0 + e);",
        ("tests/test_llama.py::test_the_vectorised_silu_gives_the_bytes_of_its_plain_form_under_every_build",),
    ),
    Mutation(
        "a Llama GGUF's q/k rows left in llama.cpp's interleaved order (graft_core/packaged.py fill)",
        "graft_core/packaged.py",
        "rows = rows[_unpermute(n, heads)].contiguous()",
        "rows = rows.contiguous()",
        ("tests/test_llama.py::test_a_llama_gguf_is_read_in_hugging_faces_row_order",),
    ),
    Mutation(
        "Q8_0's second 16 values read from the first 16's bytes (kernels/c/linear.c x32_q8_0, the 8-row fused product)",
        "kernels/c/linear.c",
        "*lo = v_mul(d, q_i8(b + 2)), *hi = v_mul(d, q_i8(b + 18));",
        "*lo = v_mul(d, q_i8(b + 2)), *hi = v_mul(d, q_i8(b + 2));",
        ("tests/test_fma16.py::test_kernel_equals_the_c_definition",),
    ),
    Mutation(
        "Q4_1's block values picked by the high nibbles for the first 16 and the low for the last (kernels/c/linear.c "
        "x32_q4_1, the 4-bit formats' q_lut)",
        "kernels/c/linear.c",
        "*lo = q_lut(t, b + 4, 0), *hi = q_lut(t, b + 4, 1);",
        "*lo = q_lut(t, b + 4, 1), *hi = q_lut(t, b + 4, 0);",
        ("tests/test_fma16.py::test_kernel_equals_the_c_definition",),
    ),
    Mutation(
        "AVX2's Q5_0 high bits of lanes 8-15 taken one bit early: other weights (kernels/c/arch/avx2.h q_q5)",
        "kernels/c/arch/avx2.h",
        "bit16x8((bits >> 8) & 0xFF)",
        "bit16x8((bits >> 7) & 0xFF)",
        ("tests/test_fma16.py::test_kernel_equals_the_c_definition",),
    ),
    Mutation(
        "AVX2's ragged tail reads one value of x past K (kernels/c/arch/avx2.h v_load_first)",
        "kernels/c/arch/avx2.h",
        "count = _mm256_set1_epi32((int)n);",
        "count = _mm256_set1_epi32((int)n + 1);",
        ("tests/test_fma16.py::test_a_ragged_row_reads_none_of_the_values_after_it",),
    ),
    Mutation(
        "attention's P.V tree pairs neighbouring lanes instead of lanes 8 apart (kernels/c/attention.c PV, every build)",
        "kernels/c/attention.c",
        "x[L] = vp_add(x[L], x[L + 8]);",
        "x[L] = vp_add(x[2 * L], x[2 * L + 1]);",
        (_ATTENTION,),
    ),
    Mutation(
        "AVX2's ragged tail takes the other half of x's last values (kernels/c/arch/avx2.h v_part)",
        "kernels/c/arch/avx2.h",
        "static inline vp v_part(v16 a, int h) { return h ? a.hi : a.lo; }",
        "static inline vp v_part(v16 a, int h) { return h ? a.lo : a.hi; }",
        ("tests/test_fma16.py::test_kernel_equals_the_c_definition",),
        _BUILD.format(isa="avx2"),
    ),
    Mutation(
        "the softmax's max taken over left-out keys too (kernels/c/reference.c softmax_range)",
        "kernels/c/reference.c",
        "for (int L = 0; L < 16; L++) m16[L] = keep[jm + L] && t[jm + L] > m16[L] ? t[jm + L] : m16[L];",
        "for (int L = 0; L < 16; L++) m16[L] = t[jm + L] > m16[L] ? t[jm + L] : m16[L];",
        (_ATTENTION,),
    ),
    Mutation(
        "a batched pass's rows through torch's product under fma16 (batch.Batcher._columns)",
        "graft_core/batch.py",
        "        if self.fma16:\n            return self.fma16[id(weight)].product(x)\n        return column_product",
        "        if self.fma16:\n            return F.linear(x, weight)\n        return column_product",
        ("tests/test_batch.py::test_tiny_first_prompts_into_empty_caches_match_each_alone",),
    ),
    Mutation(
        "gate that skips the graft (services/gate.graft_run)",
        "services/gate.py",
        'return _run(lm, chain, "graft", (question, solution, verifier, reference), prefill=0, steps=steps)',
        'return _run(lm, [], "graft", (question, solution, verifier, reference), prefill=0, steps=steps)',
        ("tests/test_gate.py::test_the_gate_record_replays_token_for_token",),
    ),
    Mutation(
        "import that stores the bundle's KV without recomputing it from its tokens",
        "services/vetting.py",
        '_recompute(lib, a["id"], chain, _blob(blobs, a["content_sha256"]))',
        "pass",
        ("tests/test_gate.py::test_import_refuses_a_kv_state_that_does_not_come_from_its_tokens",),
    ),
    Mutation(
        "import that skips re-tokenising (services/vetting)",
        "services/vetting.py",
        '_retokenise(lib, a["id"], srcs[a["id"]]["text"], chain[-1])',
        "pass",
        ("tests/test_gate.py::test_import_refuses_source_text_that_does_not_tokenise_to_the_artifact",),
    ),
    Mutation(
        "a deposit whose transaction failed leaves the blob it wrote (an orphan after a full disk)",
        "services/deposit.py",
        "                self._store.discard_blobs(made)",
        "                pass",
        ("tests/test_faults.py::test_a_write_failing_anywhere_in_an_operation_leaves_the_store_whole[deposit-ENOSPC]",),
    ),
    Mutation(
        "SQLite's disk errors reach the caller as raw driver errors",
        "db/connection.py",
        "        err = _translated(engine, exc)",
        "        err = None",
        ("tests/test_faults.py::test_a_write_failing_anywhere_in_an_operation_leaves_the_store_whole[deposit-EIO]",),
    ),
    Mutation(
        "an index cut between its two files called corrupt (fsck: NOT consistent)",
        "services/integrity.py",
        'return IndexStatus("half-saved", str(e), version)',
        'return IndexStatus("corrupt", str(e), version)',
        ("tests/test_faults.py::test_an_index_save_cut_between_its_two_files_is_a_cache_state_not_damage",),
    ),
    Mutation(
        "an upload without the admin's token or session is let through (anonymous bytes reach the disk)",
        "access/uploads.py",
        "        return 403, ANONYMOUS",
        "        return None",
        ("tests/test_uploads.py::test_anonymous_uploads_are_refused_on_every_route_and_write_nothing",),
    ),
    Mutation(
        "an upload session cookie is believed without its signature",
        "access/uploads.py",
        "        if not hmac.compare_digest(parts[3].encode(), self._sign(body).encode()):",
        "        if False:",
        ("tests/test_uploads.py::test_a_forged_or_expired_session_cookie_and_a_wrong_token_are_refused",),
    ),
    Mutation(
        "an upload's bytes are not counted as they stream (a body that declares nothing passes every budget)",
        "access/uploads.py",
        '                    budget.add(ticket, len(message.get("body", b"")))',
        "                    pass",
        ("tests/test_uploads.py::test_the_per_caller_budget_refuses_with_its_message_declared_or_streamed",),
    ),
    Mutation(
        "an upload cut off past its budget leaves its partial file (Gradio's parser cleans up only its own exception)",
        "access/uploads.py",
        "class OverBudget(MultiPartException):",
        "class OverBudget(Exception):",
        ("tests/test_uploads.py::test_the_per_caller_budget_refuses_with_its_message_declared_or_streamed",),
    ),
    Mutation(
        "the API counts the computed tokens as cached (cached_tokens must be the grafted ones)",
        "serving/openai_shapes.py",
        '"prompt_tokens_details": {"cached_tokens": result.grafted_tokens},',
        '"prompt_tokens_details": {"cached_tokens": result.computed_tokens},',
        ("tests/test_openai_api.py::test_chat_carries_the_proof_and_the_grafted_tokens_as_cached",),
    ),
    Mutation(
        "an API request is not admitted at arrival (one address past its depth still queues)",
        "serving/openai_api.py",
        "            ticket = self._reserve(self.guard.client(caller))",
        "            ticket = -1",
        ("tests/test_openai_api.py::test_an_address_over_its_depth_is_refused_at_arrival",),
    ),
    Mutation(
        "a stream sends the start of a stop string it later takes back (streamed text not the answer's)",
        "graft_core/templates.py",
        "    return text[: len(text) - held] if raw else text[: len(text) - held].rstrip()",
        "    return text if raw else text.rstrip()",
        ("tests/test_answer_sampling.py::test_settled_holds_back_what_later_tokens_may_change",),
    ),
    Mutation(
        "a sampled answer ignores its seed (the same request draws other tokens; replay cannot match)",
        "services/answer.py",
        "    seed = secrets.randbelow(MAX_SEED + 1) if o.seed is None else int(o.seed)",
        "    seed = secrets.randbelow(MAX_SEED + 1)",
        ("tests/test_answer_sampling.py::test_a_seed_draws_the_same_tokens_and_seeds_differ",),
    ),
    Mutation(
        "Q6_K's block products scale each chunk of 16 by its neighbour's scale (kernels/c/linear.c chunk256_q6_k)",
        "kernels/c/linear.c",
        "    return v_mul(v_set1(st->ds[c]), q_i8((const uint8_t *)st->q + 16 * c));",
        "    return v_mul(v_set1(st->ds[c ^ 1]), q_i8((const uint8_t *)st->q + 16 * c));",
        ("tests/test_fma16.py::test_kernel_equals_the_c_definition",),
    ),
    Mutation(
        "a stand-in forwards a call without the door's defaults (the library sees fewer arguments than declared)",
        "services/forwarding.py",
        "        bound.apply_defaults()",
        "        pass",
        ("tests/test_door.py::test_the_stand_ins_write_out_no_member_and_forward_each_call_exactly",),
    ),
    Mutation(
        "a body nested past the bound or holding a lone surrogate reaches the API's handlers (a 500 from the body)",
        "access/bodies.py",
        "    problem = json_problem(value, max_depth)\n    if problem is not None:\n        raise problem\n",
        "",
        ("tests/test_api_inputs.py::test_a_lone_surrogate_is_a_400_naming_its_field_before_the_tokenizer",),
    ),
)


def check_sites(root: Path = ROOT) -> list[str]:
    """Problems with the mutation sites in `root` (each `old` must occur exactly once); empty when all hold."""
    problems = []
    for m in MUTATIONS:
        n = (root / m.path).read_text(encoding="utf-8").count(m.old)
        if n != 1:
            problems.append(f"{m.name}: {m.path} holds the site {m.old!r} {n} times, not once; update scripts/mutants.py")
    return problems


def _copy(dest: Path) -> None:
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    for raw in files:
        rel = raw.decode()
        if not rel or not (ROOT / rel).is_file() or rel.startswith(".venv"):
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, dest / rel)


def _pytest(copy: Path, tests: tuple[str, ...]) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-m", "not integration and not browser"]
    return subprocess.run([*cmd, *tests], cwd=copy, capture_output=True, text=True)


def _imports_from(copy: Path) -> str:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import graft_core, db, kernels, verifiers; print(*(m.__file__ for m in (graft_core, db, kernels, verifiers)))",
        ],
        cwd=copy,
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout


def run(names: list[str] | None = None) -> int:
    problems = check_sites()
    if problems:
        print("\n".join(problems))
        return 1
    chosen = [m for m in MUTATIONS if not names or m.name in names]
    with tempfile.TemporaryDirectory(prefix="kvgraft-mutants-") as tmp:
        copy = Path(tmp) / "repo"
        _copy(copy)
        where = _imports_from(copy)
        assert all(p.startswith(str(copy)) for p in where.split()), f"the copy imports the product from elsewhere: {where}"
        tests = tuple(dict.fromkeys(t for m in chosen for t in m.tests))
        t0 = time.perf_counter()
        control = _pytest(copy, tests)
        print(f"control (unmutated): rc {control.returncode} in {time.perf_counter() - t0:.0f}s", flush=True)
        if control.returncode != 0:
            print(control.stdout[-3000:], control.stderr[-2000:])
            return 1
        survived, unreachable = [], []
        for m in chosen:
            why = _why_it_never_runs(copy, m)
            if why:
                unreachable.append(m.name)
                print(f"NOT RUN  {m.name} ({m.path}): {why}", flush=True)
                continue
            target = copy / m.path
            original = target.read_text(encoding="utf-8")
            target.write_text(original.replace(m.old, m.new), encoding="utf-8")
            t0 = time.perf_counter()
            res = _pytest(copy, m.tests)
            target.write_text(original, encoding="utf-8")
            failed = [ln for ln in res.stdout.splitlines() if ln.startswith(("FAILED", "ERROR"))]
            caught = res.returncode == 1 and bool(failed)  # tests ran and failed (not a collection or usage error)
            print(
                f"{'CAUGHT  ' if caught else 'SURVIVED'} {m.name} ({m.path}) in {time.perf_counter() - t0:.0f}s: "
                + (failed[0] if failed else f"rc {res.returncode}"),
                flush=True,
            )
            if not caught:
                survived.append(m.name)
                print(res.stdout[-2000:], res.stderr[-1000:])
    tried = len(chosen) - len(unreachable)
    print(
        f"{tried - len(survived)}/{tried} mutations caught"
        + (f"; {len(unreachable)} never run on this machine" if unreachable else "")
    )
    return 1 if survived else 0


def _why_it_never_runs(copy: Path, m: Mutation) -> str:
    if not m.runs_here:
        return ""
    out = subprocess.run([sys.executable, "-c", m.runs_here], cwd=copy, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{m.name}: its reachability check failed: {out.stderr[-1000:]}")
    return out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("names", nargs="*", help="run only these mutations (by name)")
    p.add_argument("--list", action="store_true", help="list the mutations and the tests that must catch them")
    args = p.parse_args()
    if args.list:
        for m in MUTATIONS:
            print(f"{m.name}: {m.path} -> {', '.join(m.tests)}")
        return
    sys.exit(run(args.names or None))


if __name__ == "__main__":
    main()
