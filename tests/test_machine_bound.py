"""Outside the numerical definition, say so: a model kvgraft-f32-v2 does not cover is refused at load with one
line naming what it lacks, unless KVGRAFT_MACHINE_BOUND opts into the machine-bound path; then every answer
says "exact on this machine class only" (the services' result, the CLI's ask, the web evidence panel), and
sessions decode together only where a pass measured here gives each session's own bytes."""

from __future__ import annotations

import json

import pytest

import cli
import retrieval.embedder
import services
from errors import KvgraftError
from graft_core import batch, model, tiny
from retrieval import HashEmbedder
from services import AnswerOptions
from web.views import evidence_html, evidence_summary

LABEL = "exact on this machine class only"


def refusal(path, lack: str) -> str:
    return (
        f"KVGRAFT_MODEL {path}: {lack} is outside the numerical definition kvgraft-f32-v2 "
        "(covers gemma3 (tanh GELU) and llama, mistral and qwen2 (SiLU) without sliding window or soft-capping, RoPE "
        "default, linear or llama3); set KVGRAFT_MACHINE_BOUND=1 to run it on this machine class only"
    )


def test_a_model_outside_is_refused_by_default_with_one_line(tiny_dirs, monkeypatch):
    monkeypatch.delenv("KVGRAFT_MACHINE_BOUND", raising=False)
    path = str(tiny_dirs["outside"])
    with pytest.raises(KvgraftError) as e:
        model.load(path)
    assert str(e.value) == refusal(path, "activation 'gelu'")
    monkeypatch.setenv("KVGRAFT_MACHINE_BOUND", "0")
    with pytest.raises(KvgraftError):
        model.load(path)


def test_the_cli_refuses_it_in_one_line(tiny_dirs, kvgraft_home, capsys, monkeypatch):
    monkeypatch.delenv("KVGRAFT_MACHINE_BOUND", raising=False)
    monkeypatch.setattr(retrieval.embedder, "SentenceEmbedder", HashEmbedder)
    path = str(tiny_dirs["outside"])
    code = cli.main(["--home", str(kvgraft_home), "--model", path, "ask", "who?", "--json"])
    err = capsys.readouterr().err
    assert code == 2 and err == "error: " + refusal(path, "activation 'gelu'") + "\n", err


def test_gemma2_is_refused_and_its_softcap_never_silently_dropped(tmp_path, monkeypatch):
    """transformers refuses SDPA for Gemma 2 (it has attention soft-capping, which SDPA cannot take): refused
    by default for what the definition lacks; opted in, refused for what torch's attention lacks."""
    path = str(tiny.build("gemma2", tmp_path / "gemma2"))
    monkeypatch.delenv("KVGRAFT_MACHINE_BOUND", raising=False)
    with pytest.raises(KvgraftError) as e:
        model.load(path)
    assert str(e.value) == refusal(path, "architecture 'gemma2'")
    with pytest.raises(KvgraftError) as e:
        model.load(path, machine_bound=True)
    assert str(e.value).startswith(f"KVGRAFT_MODEL {path}: transformers cannot run it on sdpa attention (")
    assert "\n" not in str(e.value)


def test_opted_in_its_answers_say_machine_class_only(tiny_outside, tiny_gemma, kvgraft_home, tmp_path):
    assert tiny_outside.machine_bound and not tiny_gemma.machine_bound
    assert "numerics" not in dict(tiny_outside.config.numerics) and "cpu_vendor" in dict(tiny_outside.config.numerics)
    lib = services.Library(home=kvgraft_home, embedder=HashEmbedder(), lm=tiny_outside)
    art = lib.deposit_text("Zorblat is the capital of Quendia.", title="root")
    r = lib.answer("What is the capital of Quendia?", AnswerOptions(artifact=art.id, max_new_tokens=3))
    assert r.machine_bound and r.scope == LABEL
    assert r.to_json()["scope"] == LABEL and r.to_json()["machine_bound"] is True
    back = services.AnswerResult.from_json(json.loads(json.dumps(r.to_json())))
    assert back.scope == LABEL
    assert f'<span class="kv-scope">{LABEL}</span>' in evidence_html(r)
    assert evidence_summary(r)[0].endswith(f" · {LABEL}")
    # the label follows the record, not the architecture: the tiny Gemma under the definition has none
    ours = services.Library(home=tmp_path / "g", embedder=HashEmbedder(), lm=tiny_gemma)
    g = ours.answer("What is the capital of Quendia?", AnswerOptions(graft=False, max_new_tokens=2))
    assert not g.machine_bound and g.scope == "" and LABEL not in evidence_html(g) and LABEL not in evidence_summary(g)[0]


def test_the_cli_ask_says_it_too(tiny_dirs, kvgraft_home, capsys, monkeypatch):
    monkeypatch.setenv("KVGRAFT_MACHINE_BOUND", "1")
    monkeypatch.setattr(retrieval.embedder, "SentenceEmbedder", HashEmbedder)
    path = str(tiny_dirs["outside"])
    base = ["--home", str(kvgraft_home), "--model", path, "ask", "who?", "--no-graft", "--max-new-tokens", "2"]
    assert cli.main([*base, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["scope"] == LABEL and out["machine_bound"] is True
    assert cli.main(base) == 0
    text = capsys.readouterr().out
    assert f"; {LABEL}" in text.splitlines()[2], text


def test_torch_products_are_machine_bound_too(tiny_gemma_torch):
    """KVGRAFT_LINEAR=torch on a Gemma 3: its record is the kernel path, so its answers carry the label."""
    assert tiny_gemma_torch.machine_bound and "cpu_vendor" in dict(tiny_gemma_torch.config.numerics)


def test_off_the_definition_sessions_decode_together_only_where_a_measured_pass_agrees(tmp_path, monkeypatch):
    """A Gemma 3 with the exact GELU: fma16's products, torch's attention, norms and activation. Its Batcher
    measures whole passes at build and decodes together byte-equal to alone; a norm whose bytes depend on
    how many rows it takes (which no product check sees) drops every width."""
    from tests.test_batch import _decode_both_ways

    path = str(tiny.build("gemma3", tmp_path / "gelu", hidden_activation="gelu"))
    monkeypatch.delenv("KVGRAFT_MACHINE_BOUND", raising=False)
    with pytest.raises(KvgraftError) as e:
        model.load(path)
    assert str(e.value) == refusal(path, "activation 'gelu'")
    lm = model.load(path, machine_bound=True)
    assert lm.machine_bound and dict(lm.config.numerics).get("linear", "").startswith("fma16")
    b = batch.Batcher(lm.model)
    assert not b.defined and b.fma16 and b.widths in ((), (4,), (8,), (4, 8)), b.why
    assert batch.lean(lm.model) is None  # alone, a step is the model's own forward, not a pass of Batcher's
    equal, passes = _decode_both_ways(lm, b, [4, 6, 3, 9, 5], steps=2)
    assert equal and passes == (2 if b.widths else 0), (b.widths, b.why)
    # the verdict is the measurement's: passes forced at both widths agree with alone exactly where it kept them
    forced = batch.Batcher(lm.model)
    forced.widths = (4, 8)
    agree, _ = _decode_both_ways(lm, forced, [4, 6, 3, 9, 5], steps=2)
    assert agree == bool(b.widths), (agree, b.widths, b.why)

    norm = type(lm.model.model.norm)
    plain = norm.forward

    def row_count_dependent(self, x):
        y = plain(self, x)
        if x.reshape(-1, x.shape[-1]).shape[0] > 1:
            y = y.contiguous().clone()
            y.view(-1)[0] = y.view(-1)[0] + 1.0
        return y

    monkeypatch.setattr(norm, "forward", row_count_dependent)
    b = batch.Batcher(lm.model)
    assert (
        b.widths == ()
        and b.most == 1
        and b.stack_sizes == frozenset()
        and "pass differed from stepping alone on this machine" in b.why
    )


def test_a_llama_outside_steps_one_by_one_and_one_inside_batches(tiny_outside, tiny_llama):
    b = batch.Batcher(tiny_outside.model)
    assert b.widths == () and b.most == 1 and batch.lean(tiny_outside.model) is None
    assert not tiny_llama.machine_bound and batch.Batcher(tiny_llama.model).most == 8 and batch.lean(tiny_llama.model)
