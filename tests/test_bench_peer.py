"""bench/peer.py: skipped with a message (exit 0, nothing written) without the llama.cpp peer; its kvgraft
side measures the served path on a store (tiny Gemma-3 here) and reports byte-equality from the data."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench import peer
from tests.test_maintenance import make_lib

ROOT = Path(__file__).resolve().parents[1]


def test_without_the_peer_the_bench_says_how_to_get_it_and_writes_nothing(tmp_path):
    out = tmp_path / "peer.json"
    r = subprocess.run(
        [sys.executable, "-m", "bench.peer", "--peer-python", str(tmp_path / "nope"), "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0 and "bench.peer skipped" in r.stdout and "bench/llamacpp/build.sh" in r.stdout
    assert not out.exists()


def test_the_prefix_texts_and_the_peer_script_travel_with_the_repo():
    for name in ("llama_restore.py", "prefix_2048.txt", "prefix_4096.txt", "build.sh"):
        assert (peer.PEER / name).stat().st_size > 0, name


def test_kvgraft_side_serves_byte_equal_with_the_probe_proof(kvgraft_home, tiny_gemma):
    lib = make_lib(kvgraft_home, tiny_gemma)
    text = (peer.PEER / "prefix_2048.txt").read_text(encoding="utf-8")[:300]
    row = peer.run_kvgraft(lib, text, repeats=2)
    assert row["logits_byte_equal"] is True and row["state_proof_passed"] is True
    assert row["prefix_tokens"] == len(tiny_gemma.tokenizer(text.rstrip("\n") + "\n")["input_ids"])
    assert row["state_bytes"] == lib.store.blobs.path(lib.store.catalog.get(row["artifact_id"]).content_sha256).stat().st_size
    assert 0 < row["ttft_grafted_warm_s"] and 0 < row["ttft_fresh_s"]


def test_answers_at_once_are_the_answer_alone(kvgraft_home, tiny_gemma, monkeypatch):
    """The whole-answer measurements: each of the S answers decoded together (batched passes) is, token for
    token, the answer decoded alone, and the rates are what the seconds say."""
    monkeypatch.setattr(peer, "LENGTHS", (3, 9))
    monkeypatch.setattr(peer, "PARALLEL", (1, 3))
    lib = make_lib(kvgraft_home, tiny_gemma)
    text = (peer.PEER / "prefix_2048.txt").read_text(encoding="utf-8")[:300]
    row = peer.run_kvgraft(lib, text, repeats=1, fresh_ttft=False, whole_answers=True)
    assert peer.run_kvgraft(lib, text, repeats=1, fresh_ttft=False)["answers"] is None  # only where asked
    for n in (3, 9):
        alone = row["answers"][str(n)]
        assert len(alone["token_ids"]) == 1 and len(alone["token_ids"][0]) == n
        for s in (1, 3):
            together = row["parallel"][f"{s}x{n}"]
            assert together["same_tokens_every_sequence"] and together["token_ids"] == alone["token_ids"][0]
            assert together["aggregate_decode_tokens_per_s"] == s * (n - 1) / together["decode_s"]
    assert "decode" in peer.answer_table([{"llama_cpp": {"prefix_tokens": 1}, "kvgraft": [row]}])


def test_with_a_model_both_engines_get_the_same_text_in_the_models_own_tokens(tiny_gemma, tiny_llama, tmp_path):
    """--model: the prefix is cut to at most N of that model's tokens as kvgraft deposits it, and the peer's
    formats are the model's chat turns (none in the plain form), so the peer's rendering is what kvgraft reads."""
    import copy

    from graft_core import templates
    from tests.test_templates import CHATML

    text = (ROOT / "bench" / "llamacpp" / "prefix_2048.txt").read_text(encoding="utf-8")
    assert peer.formats(tiny_gemma.tokenizer) == []
    chat = copy.deepcopy(tiny_llama.tokenizer)
    chat.chat_template = CHATML
    for tok in (tiny_gemma.tokenizer, chat):
        cut = peer.prepare_prefix(tok, text, 300, tmp_path / "p.txt").read_text(encoding="utf-8")
        ids = templates.deposit_ids(tok, cut, root=True)
        assert 290 <= len(ids) <= 300 and text.startswith(cut.strip()[:200])
    fmt = peer.formats(chat)
    assert fmt[0] == "--prefix-format" and fmt[2] == "--question-format"
    rendered = fmt[1].replace("{}", cut.strip())
    assert chat(rendered, add_special_tokens=False)["input_ids"] == templates.deposit_ids(chat, cut, root=True)
    asked = fmt[3].replace("{}", peer.QUESTION)
    assert chat(asked, add_special_tokens=False)["input_ids"] == templates.prompt_ids(chat, peer.QUESTION)


def test_rounds_give_each_rounds_ratio_and_the_medians():
    """--rounds: each round's decode rates alone become its ratio (kvgraft's over llama.cpp's), and the table
    shows every round's ratio and the medians, read from the rates (a round without kvgraft's answers is left out)."""
    peer_json = {"decode_32_tokens_per_s": 50.0, "decode_128_tokens_per_s": 40.0}
    ours = {"answers": {"32": {"decode_tokens_per_s": 60.0}, "128": {"decode_tokens_per_s": 30.0}}}
    first = peer.round_rates(peer_json, ours)
    assert first["32"] == {"llama_cpp": 50.0, "kvgraft": 60.0, "ratio": 1.2}
    assert first["128"]["ratio"] == 0.75
    second = peer.round_rates({"decode_32_tokens_per_s": 40.0}, {"answers": {"32": {"decode_tokens_per_s": 60.0}}})
    assert set(second) == {"32"}
    third = peer.round_rates({"decode_32_tokens_per_s": 60.0}, {"answers": {"32": {"decode_tokens_per_s": 48.0}}})
    table = peer.rounds_table([{"llama_cpp": {"prefix_tokens": 2048}, "rounds": [first, second, third]}])
    rows = table.splitlines()[2:]
    assert rows[0] == "| 2,048 | 32 tokens alone | 3 | 50.0 | 60.0 | 1.20x, 1.50x, 0.80x | 1.20x |", rows
    assert rows[1] == "| 2,048 | 128 tokens alone | 1 | 40.0 | 30.0 | 0.75x | 0.75x |", rows
