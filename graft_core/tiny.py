"""Tiny, randomly initialised models built from configs in code, for fast tests and demos.

`build(kind, folder)` writes an ordinary Hugging Face model folder (weights, config, a byte-level
tokenizer) that `model.load(folder)` loads through the same path as any other model. Kinds:
"gemma3" (sliding-window layers with a window of a few tokens plus full layers, two RoPE thetas),
"llama" (full attention only, GQA, untied embeddings), "qwen2" (q/k/v biases, tied embeddings) and "gemma2"
(with its logit soft-capping). Seeded: the same folder bytes on every run.
"""

from __future__ import annotations

from pathlib import Path

import torch

SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]


def _tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    byte_chars = pre_tokenizers.ByteLevel.alphabet()
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for ch in sorted(byte_chars):
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>"
    ), len(vocab)


def config(kind: str, vocab_size: int, window: int = 4, max_positions: int = 512):
    if kind == "gemma3":
        from transformers import Gemma3TextConfig

        return Gemma3TextConfig(
            vocab_size=vocab_size,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=4,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=32,
            sliding_window=window,
            layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
            max_position_embeddings=max_positions,
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
            },
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=0,
        )
    if kind == "llama":
        from transformers import LlamaConfig

        return LlamaConfig(
            vocab_size=vocab_size,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=max_positions,
            rope_parameters={"rope_type": "default", "rope_theta": 10_000.0},
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=0,
        )
    if kind == "qwen2":  # Qwen2's q/k/v biases, GQA, full attention only (no sliding window)
        from transformers import Qwen2Config

        return Qwen2Config(
            vocab_size=vocab_size,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=1,
            max_position_embeddings=max_positions,
            rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
            rms_norm_eps=1e-6,
            tie_word_embeddings=True,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=0,
        )
    if kind == "gemma2":  # with Gemma 2's attention and final logit soft-capping (its defaults)
        from transformers import Gemma2Config

        return Gemma2Config(
            vocab_size=vocab_size,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=32,
            sliding_window=window,
            max_position_embeddings=max_positions,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=0,
        )
    raise ValueError(f"unknown tiny model kind {kind!r}; use 'gemma3', 'llama', 'qwen2' or 'gemma2'")


def build(kind: str, folder: str | Path, window: int = 4, seed: int = 0, **overrides) -> Path:
    """Write a tiny random model of `kind` to `folder` (created) and return the folder; `overrides` set
    config entries (hidden_activation="gelu": a Gemma 3 outside the numerical definition; rope_parameters,
    tie_word_embeddings, attention_bias on a Llama)."""
    from transformers import AutoModelForCausalLM

    folder = Path(folder)
    tokenizer, vocab_size = _tokenizer()
    torch.manual_seed(seed)
    cfg = config(kind, vocab_size, window=window)
    for key, value in overrides.items():
        assert hasattr(cfg, key), f"the {kind} config has no {key}"
        setattr(cfg, key, value)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    if kind in ("llama", "qwen2"):  # initialised at 1 (norms) and 0 (biases): seeded values, so that a norm
        with torch.no_grad():  # computed with Gemma's + 1, or a bias left out, changes the bytes
            gen = torch.Generator().manual_seed(seed + 1)
            for name, p in model.named_parameters():
                if name.endswith("norm.weight") or name.endswith(".bias"):
                    p.copy_(p + 0.25 * torch.randn(p.shape, generator=gen))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
