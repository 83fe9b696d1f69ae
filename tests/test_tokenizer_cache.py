"""The tokenizer of a kept metadata folder: built by transformers once and kept as tokenizers' own file, read back
from that file afterwards only where its record and bytes match; the same tokenizer either way."""

from __future__ import annotations

import json
import shutil

import pytest

from graft_core import fingerprints, tokenizer_cache


@pytest.fixture
def folder(tiny_dirs, tmp_path):
    out = tmp_path / "read"
    out.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
        if (tiny_dirs["gemma3"] / name).exists():
            shutil.copy2(tiny_dirs["gemma3"] / name, out / name)
    (out / "chat_template.jinja").write_text("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}")
    return out


def _built(folder, monkeypatch) -> list:
    """Count transformers' reads of the folder."""
    import transformers

    calls, real = [], transformers.AutoTokenizer.from_pretrained
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: calls.append(a) or real(*a, **k))
    return calls


def _same(a, b) -> None:
    assert a.backend_tokenizer.to_str() == b.backend_tokenizer.to_str()
    assert fingerprints.tokenizer_sha256(a) == fingerprints.tokenizer_sha256(b)
    assert (a.chat_template, a.special_tokens_map, type(a)) == (b.chat_template, b.special_tokens_map, type(b))


def test_the_tokenizer_is_kept_then_read_back_from_its_own_file(folder, monkeypatch):
    from transformers import AutoTokenizer

    want = AutoTokenizer.from_pretrained(folder)
    calls = _built(folder, monkeypatch)
    first, fp1 = tokenizer_cache.load(folder)
    assert len(calls) == 1 and (folder / tokenizer_cache.KEPT_FILE).is_file()
    again, fp2 = tokenizer_cache.load(folder)
    assert len(calls) == 1  # read from the kept file: transformers not asked
    assert fp1 == fp2 == fingerprints.tokenizer_sha256(want)
    _same(again, want)
    _same(first, want)


def test_a_changed_kept_byte_or_source_file_reads_the_folder_again(folder, monkeypatch):
    calls = _built(folder, monkeypatch)
    _, fp = tokenizer_cache.load(folder)
    kept = folder / tokenizer_cache.KEPT_FILE
    data = kept.read_bytes()
    kept.write_bytes(data.replace(b'"<eos>"', b'"<EOS>"', 1))  # one token renamed: not what the record hashed
    again, fp2 = tokenizer_cache.load(folder)
    assert len(calls) == 2 and fp2 == fp and "<EOS>" not in again.get_vocab()
    assert kept.read_bytes() == data  # kept afresh from what was built
    tokenizer_cache.load(folder)
    assert len(calls) == 2
    (folder / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")  # a source changed: built again
    third, _ = tokenizer_cache.load(folder)
    assert len(calls) == 3 and third.chat_template == "{{ messages[0]['content'] }}"
    record = json.loads((folder / tokenizer_cache.RECORD_FILE).read_text())
    assert record["chat_template"] == third.chat_template
