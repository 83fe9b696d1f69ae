"""The retrieval embedder's forward (a sentence-transformers BERT, mean pooled) on kvgraft's kernels.

It owns how a loaded all-MiniLM-L6-v2 computes a text's unit vector so that no MKL or oneDNN call runs
on a deposit or an answer: the linear layers through fma16 (float32 weights, the definition's order), attention
through `kv_attention` (bidirectional: every key the padding mask keeps), LayerNorm and the erf GELU
through `kv_layernorm` and `kv_gelu_erf`, and the mean pooling and the L2 normalisation as fma16 dot
products. It knows nothing about indexes, artifacts or the language model.

What is fixed: every reduction's order (fma16's 16 lanes, then the fixed tree) and every non-elementwise
function (exp and erf are kvgraft's own, in double, rounded once), so a text's vector is the same bytes
for every fma16 variant (avx512, avx2, portable), thread count and ATen vector width (the tests compare
each of them). What is not: the tokenizer (the `tokenizers` package's version) and ATen's elementwise
float32 adds and products, one correctly rounded operation each, the same bits on any IEEE-754 CPU. The
vectors are not MiniLM's reference numbers (they differ from torch's in the last bits: cosine > 0.99999),
which is why the embedder's id names this definition (`VERSION`).
"""

from __future__ import annotations

import numpy as np
import torch

from kernels import build, fma16, ops

VERSION = "kvgraft-enc-v1"  # the definition's name: change it when an order here or in its kernels changes
NAME = "kvgraft-encoder"  # the attention implementation's name in transformers' registries
# products below this many multiply-adds (about 2 ms of one core) run on the calling thread: a question's
# (10-20 tokens) all do, a 256-token text's are split; kv_attention splits at the same size
SOLO_MACS = 64 * 32768 * 16


def why_not(model) -> str:
    """ "" where a SentenceTransformer can compute under this definition (fma16 built, a BERT with the erf
    GELU, mean pooling), else why not."""
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    why = fma16.why_not()
    if why:
        return why
    modules = list(model)
    if len(modules) < 2 or not isinstance(modules[0], Transformer) or not isinstance(modules[1], Pooling):
        return "the model folder is not a Transformer followed by a Pooling module"
    mode = modules[1].get_config_dict().get("pooling_mode")
    if mode != "mean":
        return f"{VERSION} pools by the mean only, not {mode}"
    cfg = modules[0].auto_model.config
    if cfg.model_type != "bert" or cfg.hidden_act != "gelu" or cfg.is_decoder:
        return f"{VERSION} covers BERT encoders with the erf GELU, not {cfg.model_type} ({cfg.hidden_act})"
    return ""


def attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None, **kwargs):
    """transformers' attention contract for a bidirectional encoder without grouped heads: query, key and value
    [B, H, S, D], a boolean (True: attend) or additive mask [B or 1, 1, Sq, >= Sk] or None (every key, where
    graft_core.numerics.attention would read the language model's causal mask); returns ([B, Sq, H, D], None). One
    kv_attention call per head, the mask's rows made once per batch row."""
    if dropout:
        raise ValueError("kvgraft attention is for inference: dropout must be 0")
    if not (ops.ours(query) and key.dtype == value.dtype == torch.float32):
        raise TypeError(f"kvgraft attention takes float32 CPU tensors, got {query.dtype} on {query.device}")
    b_n, h_n, sq, d = query.shape
    sk = key.shape[2]
    if attention_mask is not None and attention_mask.shape[1] != 1:
        raise ValueError(f"{VERSION} takes one mask for every head, got {tuple(attention_mask.shape)}")
    scale = float(scaling if scaling is not None else d**-0.5)
    kernels = ops.lib(getattr(module, "kvgraft_isa", None))
    query = query if query.stride(-1) == 1 else query.contiguous()
    key = key if key.stride(-1) == 1 else key.contiguous()
    value = value if value.stride(-1) == 1 else value.contiguous()
    out = torch.empty((b_n, sq, h_n, d), dtype=torch.float32)
    # ops.attend's call, one per head, without its per-call checks and lookups (12 heads x 6 layers of a
    # question cost more in Python than in C): the strides are the checked tensors' own, offsets in bytes
    qs, ks, vs, outs = query.stride(), key.stride(), value.stride(), out.stride()
    qp, kp, vp, op = query.data_ptr(), key.data_ptr(), value.data_ptr(), out.data_ptr()
    threads = torch.get_num_threads()
    for b in range(b_n):
        keep, add = (None, None) if attention_mask is None else ops.mask_rows(attention_mask, b, 0, sq, sk)
        mask = keep if keep is not None else add
        keep_p, add_p = (keep.data_ptr() if keep is not None else None), (add.data_ptr() if add is not None else None)
        mask_stride = mask.stride(0) if mask is not None else 0
        for h in range(h_n):
            rc = kernels.kv_attention(
                qp + 4 * (b * qs[0] + h * qs[1]), 1, sq, d, qs[1], qs[2],
                kp + 4 * (b * ks[0] + h * ks[1]), ks[2], vp + 4 * (b * vs[0] + h * vs[1]), vs[2], sk,
                keep_p, add_p, mask_stride,
                scale, op + 4 * (b * outs[0] + h * outs[2]), outs[2], outs[1], threads, 0,
            )  # fmt: skip
            ops.check(rc, "attention")
    return out, None


def register() -> None:
    """Make NAME an attention implementation (with transformers' boolean mask) models can be switched to."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, attention)
    AttentionMaskInterface.register(NAME, ops.full_mask)


class LayerNorm:
    """The forward of a float32 `nn.LayerNorm` over the last dimension with kv_layernorm's order."""

    def __init__(self, module: torch.nn.LayerNorm, isa: str):
        self.module, self.plain, self.isa = module, module.forward, isa

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        m = self.module
        if not ops.ours(x) or m.weight is None or m.bias is None:
            return self.plain(x)
        n = x.shape[-1]
        flat = x.reshape(-1, n).contiguous()
        y = torch.empty_like(flat)
        w, b = m.weight.detach().contiguous(), m.bias.detach().contiguous()
        rc = ops.lib(self.isa).kv_layernorm(
            flat.data_ptr(), flat.shape[0], n, w.data_ptr(), b.data_ptr(), float(m.eps), y.data_ptr(), torch.get_num_threads()
        )
        ops.check(rc, "LayerNorm")
        return y.view(x.shape)


class Gelu:
    """The forward of transformers' erf GELU with kv_gelu_erf."""

    def __init__(self, module, isa: str):
        self.module, self.plain, self.isa = module, module.forward, isa

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not ops.ours(x):
            return self.plain(x)
        flat = x.contiguous()
        y = torch.empty_like(flat)
        ops.check(ops.lib(self.isa).kv_gelu_erf(flat.data_ptr(), flat.numel(), y.data_ptr(), torch.get_num_threads()), "GELU")
        return y


def take_over(model, isa: str | None = None) -> str:
    """Route a loaded SentenceTransformer's BERT through this definition on fma16's build `isa` (default
    `build.variant()`); raises ValueError where `why_not` says it cannot. Returns a line for the log."""
    from transformers.activations import GELUActivation
    from transformers.models.bert.modeling_bert import BertSelfAttention

    why = why_not(model)
    if why:
        raise ValueError(why)
    isa = build.variant(isa)
    bert = model[0].auto_model
    register()
    bert.set_attn_implementation(NAME)
    bert.kvgraft_isa = isa  # the build `embed` pools on
    taken = fma16.take_over(bert, isa=isa)
    for m in bert.modules():
        if (op := fma16.product_of(m)) is not None:
            op.solo_below = SOLO_MACS
    counts = {"norms": 0, "gelu": 0, "attention": 0}
    for m in bert.modules():
        if isinstance(m, torch.nn.LayerNorm):
            m.forward, counts["norms"] = LayerNorm(m, isa), counts["norms"] + 1
        elif isinstance(m, GELUActivation):
            m.forward, counts["gelu"] = Gelu(m, isa), counts["gelu"] + 1
        elif isinstance(m, BertSelfAttention):  # `attention` reads the build from its module
            m.kvgraft_isa, counts["attention"] = isa, counts["attention"] + 1
    return f"{VERSION}: {taken.line()}, " + ", ".join(f"{v} {k}" for k, v in counts.items())


def mean_unit(tokens: torch.Tensor, isa: str | None = None) -> torch.Tensor:
    """The L2-normalised mean of token vectors [S, D] -> [D]: the sum over tokens and the squared norm as
    fma16 dot products (ones . column, v . v), then one division by S, one square root, one division."""
    s, d = tokens.shape
    columns = tokens.t().contiguous()  # [D, S]: row j is the j-th value of every token
    f32 = fma16.FORMATS["F32"]
    total = fma16.linear(torch.ones((1, s), dtype=torch.float32), columns, f32, d, isa=isa, threads=1)[0]
    mean = (total / float(s)).contiguous()
    norm = torch.sqrt(fma16.linear(mean.view(1, d), mean.view(1, d), f32, 1, isa=isa, threads=1)[0])
    return mean / torch.clamp(norm, min=1e-12)


def embed(model, text: str) -> np.ndarray:
    """A text's unit vector [D] float32 by this definition, from a model `take_over` routed: the model's own
    tokenizer (truncating to its max_seq_length), its BERT, `mean_unit` over the tokens."""
    features = model.preprocess([text])
    with torch.inference_mode():
        tokens = model[0](features)["token_embeddings"][0]
        kept = features["attention_mask"][0].bool()  # one text: no padding, every token
        vector = mean_unit(tokens[kept].contiguous(), isa=model[0].auto_model.kvgraft_isa)
    return vector.numpy().astype(np.float32, copy=True)
