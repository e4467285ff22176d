#!/usr/bin/env python3
"""PyTorch autograd oracle for the trainer (llm.c style).

For one named configuration: random parameters and packed documents are written for
train_oracle_tool, which runs our forward/backward and ten AdamW steps. The same model is
written here with plain torch ops (attention as matmul + softmax, per document) in float64.
Checks: the loss, EVERY parameter gradient (max abs error <= 1e-4 x the tensor's max abs
gradient), and the loss after each of ten optimizer steps (relative 1e-4).

DPO cases (train_type "dpo"): micro-batches of preference pairs sharing a prompt, a reference
policy with its own random weights (so the log-ratios are not 0 at the first step), and the
loss written with torch ops from the papers' formulas (sigmoid DPO, conservative DPO with
label smoothing, IPO on mean log-probabilities); the rewards, margin and accuracy of every
step are checked too (absolute 1e-5 or relative 1e-4).

GRPO cases (train_type "grpo"): fixed rollouts (prompt + completion documents with group
advantages) trained on for ten updates, as --ppo-epochs does, so the policy ratio moves away
from 1 and clipping engages; behaviour log-probabilities are the starting policy's (from torch)
moved by random offsets, or absent (ratio 1 at the first update). Loss, every gradient, and the
KL, clip fraction and mean ratio of every update against the formula written with torch ops.

usage: oracle_train.py TOOL CONFIG_NAME [--before TOOL_OF_AN_EARLIER_BUILD]
"""
import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import safetensors_np as st  # noqa: E402

CONFIGS = {
    # Llama, tied embeddings, GQA 4:2, half-rotation RoPE, label smoothing.
    "llama_tied": dict(
        config=dict(model_type="llama", vocab_size=61, hidden_size=32, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, intermediate_size=48,
                    rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=True),
        label_smoothing=0.1, docs=[[13, 9, 7], [11, 4], [17]]),
    # Qwen2: q/k/v bias, untied head, MHA, two micro-batches (gradient accumulation), clipping.
    "qwen2_bias": dict(
        config=dict(model_type="qwen2", vocab_size=53, hidden_size=24, num_hidden_layers=2,
                    num_attention_heads=3, num_key_value_heads=3, intermediate_size=40,
                    rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=False),
        label_smoothing=0.0, docs=[[9, 12], [7, 10, 5]], micro=2, max_grad_norm=0.5),
    # Reference AstrAI model: adjacent RoPE pairing, qk-norm after RoPE, sigmoid output gate,
    # explicit head_dim != hidden/heads, GQA 4:1.
    "arlm_qknorm_gate": dict(
        config=dict(model_type="autoregressive_lm", use_qk_norm=True, vocab_size=67, hidden_size=32, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=1, head_dim=12, intermediate_size=56,
                    rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=True,
                    use_gated_attention=True),
        label_smoothing=0.05, docs=[[14, 6, 9], [12]]),
    # Mistral with adjacent (interleaved) RoPE pairing and llama3 rope scaling, llama attention_bias (o bias).
    "mistral_adjacent_llama3": dict(
        config=dict(model_type="mistral", vocab_size=59, hidden_size=32, num_hidden_layers=3,
                    num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                    rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False,
                    rope_pairing="adjacent", attention_bias=True, max_position_embeddings=64,
                    rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                      high_freq_factor=4.0, original_max_position_embeddings=16)),
        label_smoothing=0.0, docs=[[21, 8], [15, 11, 6]]),
    # YaRN RoPE scaling (Qwen's recipe: factor 4, default betas): frequencies blended per pair and
    # cos/sin times the attention factor, forward and backward.
    "qwen2_yarn": dict(
        config=dict(model_type="qwen2", vocab_size=53, hidden_size=32, num_hidden_layers=2,
                    num_attention_heads=2, num_key_value_heads=1, intermediate_size=40,
                    rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=True,
                    max_position_embeddings=64,
                    rope_scaling=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=16)),
        label_smoothing=0.0, docs=[[9, 12, 3], [7, 10, 5, 2]]),
    # SFT (masked CE: prompt tokens excluded), linear scaling, activation recomputation.
    "sft_linear_recompute": dict(
        config=dict(model_type="qwen3", vocab_size=71, hidden_size=32, num_hidden_layers=2,
                    num_attention_heads=2, num_key_value_heads=2, head_dim=16, intermediate_size=48,
                    rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False,
                    max_position_embeddings=64,
                    rope_scaling=dict(rope_type="linear", factor=4.0)),
        label_smoothing=0.0, docs=[[12, 7], [16, 9, 5]], train_type="sft", recompute=True),
    # Reference model with multi-head latent attention, no GQA (4 q heads, 4 kv heads),
    # qk = nope 6 + rope 4, v_head_dim 5 (!= qk), untied head, o_proj bias (attention_bias).
    "arlm_mla_untied": dict(
        config=dict(model_type="autoregressive_lm", vocab_size=59, hidden_size=32, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=4, intermediate_size=40,
                    kv_lora_rank=8, qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5,
                    rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False, attention_bias=True),
        label_smoothing=0.1, docs=[[13, 9, 7], [11, 4]]),
    # MLA with GQA 4:2, half pairing, sigmoid gate, tied head, mlp_bias, dynamic RoPE scaling
    # (documents longer and shorter than max_position_embeddings), recomputation.
    "arlm_mla_gate_tied": dict(
        config=dict(model_type="autoregressive_lm", vocab_size=53, hidden_size=24, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, intermediate_size=32,
                    kv_lora_rank=6, qk_nope_head_dim=4, qk_rope_head_dim=6, v_head_dim=8,
                    rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True,
                    use_gated_attention=True, rope_pairing="half", mlp_bias=True,
                    max_position_embeddings=16, rope_scaling=dict(type="dynamic", factor=2.0)),
        label_smoothing=0.0, docs=[[23, 9], [12, 19]], micro=2, recompute=True),
    # Llama with mlp_bias and dynamic NTK scaling: max_position_embeddings 32, two documents
    # longer (each with its own base) and one shorter (unscaled).
    "llama_mlp_bias_dynamic": dict(
        config=dict(model_type="llama", vocab_size=61, hidden_size=32, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, intermediate_size=48,
                    rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False,
                    mlp_bias=True, max_position_embeddings=32,
                    rope_scaling=dict(type="dynamic", factor=2.0)),
        label_smoothing=0.0, docs=[[40, 12, 57]]),
    # DPO, sigmoid loss, on the Llama configuration: 3 pairs in one micro-batch.
    "dpo_sigmoid_llama": dict(
        config=dict(model_type="llama", vocab_size=61, hidden_size=32, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, intermediate_size=48,
                    rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=True),
        label_smoothing=0.0, train_type="dpo", dpo=dict(beta=0.5, loss="sigmoid", label_smoothing=0.0),
        pairs=[(3, 4, 2), (2, 1, 5), (4, 3, 3)]),
    # IPO on Qwen2 (biases, untied head), two micro-batches of 2 pairs, clipping.
    "dpo_ipo_qwen2": dict(
        config=dict(model_type="qwen2", vocab_size=53, hidden_size=24, num_hidden_layers=2,
                    num_attention_heads=3, num_key_value_heads=3, intermediate_size=40,
                    rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=False),
        label_smoothing=0.0, train_type="dpo", dpo=dict(beta=0.3, loss="ipo", label_smoothing=0.0),
        pairs=[(2, 3, 4), (3, 2, 2)], micro=2, max_grad_norm=0.5),
    # Conservative DPO (label smoothing 0.2) on the reference model with qk-norm and the gate,
    # activation recomputation.
    "dpo_smoothing_arlm": dict(
        config=dict(model_type="autoregressive_lm", use_qk_norm=True, vocab_size=67, hidden_size=32, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=1, head_dim=12, intermediate_size=56,
                    rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=True,
                    use_gated_attention=True),
        label_smoothing=0.0, train_type="dpo", dpo=dict(beta=1.0, loss="sigmoid", label_smoothing=0.2),
        pairs=[(5, 2, 3), (1, 4, 1)], recompute=True),
    # GRPO on Llama: behaviour log-probs moved off the policy's (ratios outside the clip range
    # from the first update), KL weight 0.05, two groups of three completions.
    "grpo_llama_clip": dict(
        config=dict(model_type="llama", vocab_size=61, hidden_size=32, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, intermediate_size=48,
                    rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=True),
        label_smoothing=0.0, train_type="grpo", grpo=dict(clip_eps=0.2, kl_coef=0.05, behaviour=True),
        groups=[(3, [2, 4, 3]), (2, [5, 1, 2])]),
    # Qwen2, two micro-batches, no behaviour log-probs (the batch is on-policy: ratio 1 at the
    # first update), strong KL, clipping of the global norm.
    "grpo_qwen2_onpolicy": dict(
        config=dict(model_type="qwen2", vocab_size=53, hidden_size=24, num_hidden_layers=2,
                    num_attention_heads=3, num_key_value_heads=3, intermediate_size=40,
                    rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=False),
        label_smoothing=0.0, train_type="grpo", grpo=dict(clip_eps=0.1, kl_coef=0.2, behaviour=False),
        groups=[(4, [3, 2])], micro=2, max_grad_norm=0.5),
    # Multi-head latent attention, no KL term, recomputation.
    "grpo_mla_nokl": dict(
        config=dict(model_type="autoregressive_lm", vocab_size=59, hidden_size=32, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=4, intermediate_size=40,
                    kv_lora_rank=8, qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5,
                    rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False, attention_bias=True),
        label_smoothing=0.0, train_type="grpo", grpo=dict(clip_eps=0.3, kl_coef=0.0, behaviour=True),
        groups=[(2, [3, 3, 2, 4])], recompute=True),
    # LoRA: rank 4 on all seven projections of the tied Llama, label
    # smoothing; only the factors train, the base stays.
    "lora_llama_all": dict(
        config=dict(model_type="llama", vocab_size=61, hidden_size=32, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, intermediate_size=48,
                    rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=True),
        label_smoothing=0.1, docs=[[13, 9, 7], [11, 4], [17]],
        lora=dict(rank=4, alpha=8.0, targets=["q", "k", "v", "o", "gate", "up", "down"])),
    # LoRA rank 3 on q and v of Qwen2 (biases stay frozen), SFT masking, two micro-batches, clipping.
    "lora_qwen2_qv_sft": dict(
        config=dict(model_type="qwen2", vocab_size=53, hidden_size=24, num_hidden_layers=2,
                    num_attention_heads=3, num_key_value_heads=3, intermediate_size=40,
                    rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=False),
        label_smoothing=0.0, docs=[[9, 12], [7, 10, 5]], micro=2, max_grad_norm=0.5, train_type="sft",
        lora=dict(rank=3, alpha=6.0, targets=["q", "v"])),
    # LoRA with dropout 0.25 on every adapter's input (the masks of backend/dropout_mask.h,
    # redrawn in the backward under recomputation), untied Llama, two micro-batches.
    "lora_llama_dropout": dict(
        config=dict(model_type="llama", vocab_size=47, hidden_size=24, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, intermediate_size=40,
                    rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False),
        label_smoothing=0.0, docs=[[10, 6], [12]], micro=2, recompute=True,
        lora=dict(rank=4, alpha=8.0, dropout=0.25, targets=["q", "k", "v", "o", "gate", "up", "down"])),
}

LORA_ORDER = ["q", "k", "v", "o", "gate", "up", "down"]  # train/model.h's kLoraProjections
LORA_MODULES = dict(q="self_attn.q_proj", k="self_attn.k_proj", v="self_attn.v_proj", o="self_attn.o_proj",
                    gate="mlp.gate_proj", up="mlp.up_proj", down="mlp.down_proj")

GRPO_METRICS = ["kl", "clip_fraction", "ratio"]

DPO_METRICS = ["rewards_chosen", "rewards_rejected", "rewards_margin", "rewards_accuracy"]


def write_safetensors(path, tensors):
    st.write_safetensors(path, [st.f32_entry(n, t.detach().to(torch.float32).numpy()) for n, t in tensors.items()])


def read_safetensors(path):
    return {n: torch.from_numpy(a) for n, a in st.read_safetensors_f32(path).items()}


def mla_dims(c):
    """(nope, rope, v) widths of one head for MLA configs, None otherwise."""
    if c["model_type"] != "autoregressive_lm" or not c.get("kv_lora_rank"):
        return None
    return c["qk_nope_head_dim"], c["qk_rope_head_dim"], c.get("v_head_dim", c["qk_nope_head_dim"])


def param_shapes(c):
    D, I, V = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    H, KV = c["num_attention_heads"], c.get("num_key_value_heads", c["num_attention_heads"])
    hd = c.get("head_dim", D // H)
    mla = mla_dims(c)
    vd = mla[2] if mla else hd
    qkv_bias = c["model_type"] == "qwen2" or c.get("attention_bias", False)
    o_bias = c.get("attention_bias", False) and c["model_type"] != "qwen2"
    qk_norm = c["model_type"] == "qwen3" or c.get("use_qk_norm", False)
    s = {"model.embed_tokens.weight": (V, D)}
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        s[p + "input_layernorm.weight"] = (D,)
        if mla:
            nope, rope_d, vd = mla
            R = c["kv_lora_rank"]
            s[p + "self_attn.q_proj.weight"] = (H * (nope + rope_d), D)
            s[p + "self_attn.kv_a_proj.weight"] = (R, D)
            s[p + "self_attn.kv_norm.weight"] = (R,)
            s[p + "self_attn.kv_b_proj.weight"] = (KV * (nope + rope_d + vd), R)
        else:
            for n, out in (("q", H * hd), ("k", KV * hd), ("v", KV * hd)):
                s[p + f"self_attn.{n}_proj.weight"] = (out, D)
                if qkv_bias:
                    s[p + f"self_attn.{n}_proj.bias"] = (out,)
            if qk_norm:
                s[p + "self_attn.q_norm.weight"] = (hd,)
                s[p + "self_attn.k_norm.weight"] = (hd,)
        if c.get("use_gated_attention"):
            s[p + "self_attn.gate.weight"] = (H * vd, D)
        s[p + "self_attn.o_proj.weight"] = (D, H * vd)
        if o_bias:
            s[p + "self_attn.o_proj.bias"] = (D,)
        s[p + "post_attention_layernorm.weight"] = (D,)
        for n, shape in (("gate", (I, D)), ("up", (I, D)), ("down", (D, I))):
            s[p + f"mlp.{n}_proj.weight"] = shape
            if c.get("mlp_bias", False):
                s[p + f"mlp.{n}_proj.bias"] = (shape[0],)
    s["model.norm.weight"] = (D,)
    if not c.get("tie_word_embeddings", False):
        s["lm_head.weight"] = (V, D)
    return s


def inv_freq_and_scale(c, dim, seq_len):
    """Hugging Face _compute_*_rope_parameters, in float64 then rounded to float32; the
    reference autoregressive_lm keeps float64. seq_len: the longest position of the sequence
    + 1 (dynamic NTK scaling, HF _compute_dynamic_ntk_parameters)."""
    base = c.get("rope_theta", 10000.0)
    rs = c.get("rope_scaling")
    if rs and rs.get("rope_type", rs.get("type")) == "dynamic":
        orig = rs.get("original_max_position_embeddings", c.get("max_position_embeddings", 2048))
        if seq_len > orig:  # HF only grows the base past the original context
            f = rs["factor"]
            base = base * ((f * seq_len / orig) - (f - 1)) ** (dim / (dim - 2))
    inv = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32).astype(np.float64) / dim))
    if c["model_type"] != "autoregressive_lm":
        inv = inv.astype(np.float32).astype(np.float64)
    scale = 1.0
    if rs:
        kind, factor = rs.get("rope_type", rs.get("type")), rs["factor"]
        if kind == "linear":
            inv = inv / factor
        elif kind == "llama3":
            old = rs["original_max_position_embeddings"]
            lo, hi = rs["low_freq_factor"], rs["high_freq_factor"]
            wl = 2 * math.pi / inv
            llama = np.where(wl > old / lo, inv / factor, inv)
            smooth = (old / wl - lo) / (hi - lo)
            smoothed = (1 - smooth) * llama / factor + smooth * llama
            medium = ~(wl < old / hi) & ~(wl > old / lo)
            inv = np.where(medium, smoothed, llama)
        elif kind == "yarn":
            old = rs["original_max_position_embeddings"]
            bf, bs = rs.get("beta_fast", 32), rs.get("beta_slow", 1)
            cd = lambda r: (dim * math.log(old / (r * 2 * math.pi))) / (2 * math.log(base))
            low, high = max(math.floor(cd(bf)), 0), min(math.ceil(cd(bs)), dim - 1)
            if low == high:
                high += 0.001
            ramp = np.clip((np.arange(dim // 2) - low) / (high - low), 0, 1)
            extrap_factor = 1 - ramp
            pos = 1.0 / inv
            inv = (1.0 / (factor * pos)) * (1 - extrap_factor) + (1.0 / pos) * extrap_factor
            scale = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
    if c["model_type"] == "autoregressive_lm":
        return inv, scale
    return inv.astype(np.float32), scale


def rope(x, cos, sin, interleaved):
    # x: [L, heads, d]; cos/sin: [L, d/2]
    c, s = cos[:, None, :], sin[:, None, :]
    if interleaved:
        xe, xo = x[..., 0::2], x[..., 1::2]
        return torch.stack([xe * c - xo * s, xo * c + xe * s], dim=-1).flatten(-2)
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


def rms(x, w, eps):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


M64 = (1 << 64) - 1


def splitmix64(z):
    z = (z + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def dropout_keep(seed, begin, end, p):
    """backend/dropout_mask.h's mask for elements [begin, end) of a dropout of `seed`."""
    with np.errstate(over="ignore"):
        z = np.uint64(seed) + np.arange(begin, end, dtype=np.uint64)
        z = z + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(40)).astype(np.float64) / 16777216.0 >= float(np.float32(p))


def lora_delta(P, lora, seed, offset, l, short, inp):
    """The unmerged adapter's output s·(dropout(inp)·Aᵀ)·Bᵀ for one document at token `offset`
    of its micro-batch (the mask indexes the packed [T, in] input), or 0."""
    m = f"model.layers.{l}.{LORA_MODULES[short]}"
    if m + ".lora_A.weight" not in P:
        return 0
    A, B = P[m + ".lora_A.weight"], P[m + ".lora_B.weight"]
    p = lora.get("dropout", 0.0)
    if p > 0:
        sd = splitmix64(seed ^ (l * 8 + LORA_ORDER.index(short)))
        L, n = inp.shape
        keep = torch.from_numpy(dropout_keep(sd, offset * n, (offset + L) * n, p).reshape(L, n))
        scale = float(np.float32(1.0) / (np.float32(1.0) - np.float32(p)))
        inp = inp * keep * scale
    return lora["alpha"] / lora["rank"] * ((inp @ A.T) @ B.T)


def forward_logits(c, P, ids, adapter=None):
    """adapter(l, short_name, input) -> what a LoRA adapter adds to that projection (or 0)."""
    ad = adapter or (lambda l, n, inp: 0)
    D, H = c["hidden_size"], c["num_attention_heads"]
    KV = c.get("num_key_value_heads", H)
    hd = c.get("head_dim", D // H)
    eps = c.get("rms_norm_eps", 1e-6)
    L = len(ids)
    mla = mla_dims(c)
    own = c["model_type"] == "autoregressive_lm"
    rot = mla[1] if mla else hd
    inv, scale = inv_freq_and_scale(c, rot, L)
    if own:  # reference: float64 angles
        ang = np.arange(L, dtype=np.float64)[:, None] * inv[None, :]
    else:
        ang = np.arange(L, dtype=np.float32)[:, None] * inv[None, :]
    cos = torch.from_numpy((np.cos(ang) * scale).astype(np.float32)).double()
    sin = torch.from_numpy((np.sin(ang) * scale).astype(np.float32)).double()
    interleaved = c.get("rope_pairing", "adjacent" if own else "half") == "adjacent"
    x = P["model.embed_tokens.weight"][torch.tensor(ids)]
    mask = torch.triu(torch.ones(L, L, dtype=torch.bool), 1)
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        g = lambda n: P.get(p + n)
        h = rms(x, g("input_layernorm.weight"), eps)
        def proj(n):
            y = h @ g(f"self_attn.{n}_proj.weight").T + ad(l, n, h)
            b = g(f"self_attn.{n}_proj.bias")
            return y + b if b is not None else y
        if mla:
            # Multi-head latent attention (reference AstrAI): q from q_proj; a low-rank latent
            # (kv_a_proj, RMSNorm kv_norm) expanded by kv_b_proj into [k_nope | k_rope | v] per kv
            # head; RoPE only on the rope parts of q and k.
            nope, rd, vd = mla
            qkd = nope + rd
            q = (h @ g("self_attn.q_proj.weight").T).view(L, H, qkd)
            lat = rms(h @ g("self_attn.kv_a_proj.weight").T, g("self_attn.kv_norm.weight"), eps)
            kvb = (lat @ g("self_attn.kv_b_proj.weight").T).view(L, KV, qkd + vd)
            k_nope, k_rope, v = kvb.split([nope, rd, vd], dim=-1)
            q_nope, q_rope = q.split([nope, rd], dim=-1)
            q = torch.cat([q_nope, rope(q_rope, cos, sin, interleaved)], -1)
            k = torch.cat([k_nope, rope(k_rope, cos, sin, interleaved)], -1)
        else:
            qkd = vd = hd
            q, k, v = proj("q").view(L, H, hd), proj("k").view(L, KV, hd), proj("v").view(L, KV, hd)
            qn = g("self_attn.q_norm.weight") is not None
            if qn and own:  # the reference normalises after RoPE
                q, k = rope(q, cos, sin, interleaved), rope(k, cos, sin, interleaved)
            if qn:
                q, k = rms(q, g("self_attn.q_norm.weight"), eps), rms(k, g("self_attn.k_norm.weight"), eps)
            if not (qn and own):
                q, k = rope(q, cos, sin, interleaved), rope(k, cos, sin, interleaved)
        k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)
        scores = torch.einsum("ihd,jhd->hij", q, k) / math.sqrt(qkd)
        probs = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
        a = torch.einsum("hij,jhd->ihd", probs, v).reshape(L, H * vd)
        if g("self_attn.gate.weight") is not None:
            a = a * torch.sigmoid(h @ g("self_attn.gate.weight").T)
        o = a @ g("self_attn.o_proj.weight").T + ad(l, "o", a)
        if g("self_attn.o_proj.bias") is not None:
            o = o + g("self_attn.o_proj.bias")
        x = x + o
        h = rms(x, g("post_attention_layernorm.weight"), eps)
        def mlp(n, inp):
            y = inp @ g(f"mlp.{n}_proj.weight").T + ad(l, n, inp)
            b = g(f"mlp.{n}_proj.bias")
            return y + b if b is not None else y
        x = x + mlp("down", F.silu(mlp("gate", h)) * mlp("up", h))
    head = P.get("lm_head.weight", P["model.embed_tokens.weight"])
    return rms(x, P["model.norm.weight"], eps) @ head.T


def micro_loss(c, P, mb, ls, lora=None, seed=0):
    """lora: P holds the factors and the adapters run unmerged, with dropout from `seed`."""
    logits, targets = [], []
    offset = 0
    for d, ids in enumerate(mb["docs"]):
        adapter = None
        if lora:
            adapter = lambda l, n, inp, o=offset: lora_delta(P, lora, seed, o, l, n, inp)  # noqa: E731
        logits.append(forward_logits(c, P, ids[:-1], adapter))
        offset += len(ids) - 1
        t = list(ids[1:])
        if "masks" in mb:
            t = [tok if mb["masks"][d][i + 1] else -100 for i, tok in enumerate(t)]
        targets += t
    return F.cross_entropy(torch.cat(logits), torch.tensor(targets), ignore_index=-100, label_smoothing=ls)


def seq_logps(c, P, side, mask, mean):
    """Σ (mean when `mean`) of log p over the response tokens of one side of a pair."""
    lp = torch.log_softmax(forward_logits(c, P, side[:-1]), dim=-1)
    tok = lp[torch.arange(len(side) - 1), torch.tensor(side[1:])]
    keep = torch.tensor([bool(m) for m in mask[1:]])
    s = tok[keep].sum()
    return s / keep.sum() if mean else s


def dpo_micro(c, P, Pref, mb, o):
    """Mean DPO/IPO loss over the micro-batch's pairs, and the sums of the four metrics."""
    ipo = o["loss"] == "ipo"
    losses, met = [], np.zeros(4)
    for p in mb["pairs"]:
        pc = seq_logps(c, P, p["chosen"], p["chosen_mask"], ipo)
        pr = seq_logps(c, P, p["rejected"], p["rejected_mask"], ipo)
        with torch.no_grad():
            rc = seq_logps(c, Pref, p["chosen"], p["chosen_mask"], ipo)
            rr = seq_logps(c, Pref, p["rejected"], p["rejected_mask"], ipo)
        h = (pc - rc) - (pr - rr)
        b, eps = o["beta"], o["label_smoothing"]
        if ipo:
            losses.append((h - 1 / (2 * b)) ** 2)
        else:
            losses.append(-(1 - eps) * F.logsigmoid(b * h) - eps * F.logsigmoid(-b * h))
        ch, rj = b * (pc - rc).item(), b * (pr - rr).item()
        met += [ch, rj, ch - rj, float(ch > rj)]
    return torch.stack(losses).mean(), met


def lora_factors(P32, lora):
    """{weight name: (A [r, in], B [out, r])} for every targeted projection, both non-zero (so
    both gradients are)."""
    out = {}
    for n, t in P32.items():
        if any(n.endswith("." + LORA_MODULES[x] + ".weight") for x in lora["targets"]):
            out[n] = (0.3 * torch.randn(lora["rank"], t.shape[1]), 0.3 * torch.randn(t.shape[0], lora["rank"]))
    return out


def write_adapter(d, lora, factors):
    os.makedirs(d)
    json.dump(dict(r=lora["rank"], lora_alpha=lora["alpha"], target_modules=lora["targets"], bias="none"),
              open(os.path.join(d, "adapter_config.json"), "w"))
    entries = []
    for n, (A, B) in factors.items():
        m = "base_model.model." + n[: -len(".weight")]
        entries += [st.f32_entry(m + ".lora_A.weight", A.numpy()), st.f32_entry(m + ".lora_B.weight", B.numpy())]
    st.write_safetensors(os.path.join(d, "adapter_model.safetensors"), entries)


def token_logps(c, P, ids):
    lp = torch.log_softmax(forward_logits(c, P, ids[:-1]), dim=-1)
    return lp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]


def grpo_micro(c, P, Pref, mb, o):
    """GRPO loss of a micro-batch (mean over completions of per-token means) and metric sums."""
    losses, met = [], np.zeros(3)
    row = 0
    for comp in mb["completions"]:
        ids, mask, adv = comp["ids"], comp["mask"], comp["advantage"]
        lp = token_logps(c, P, ids)
        with torch.no_grad():
            q = token_logps(c, Pref, ids)
        keep = torch.tensor([bool(m) for m in mask[1:]])
        n = len(ids) - 1
        if "behaviour_logp" in mb:
            beh = torch.tensor(mb["behaviour_logp"][row:row + n], dtype=torch.float64)
        else:
            beh = lp.detach()
        row += n
        ratio = torch.exp(lp - beh)
        clipped = torch.clamp(ratio, 1 - o["clip_eps"], 1 + o["clip_eps"])
        kl = torch.exp(q - lp) - (q - lp) - 1
        per_tok = -torch.minimum(ratio * adv, clipped * adv) + o["kl_coef"] * kl
        losses.append(per_tok[keep].mean())
        is_clip = ((adv > 0) & (ratio > 1 + o["clip_eps"])) | ((adv < 0) & (ratio < 1 - o["clip_eps"]))
        met += [kl[keep].mean().item(), is_clip[keep].double().mean().item(), ratio[keep].mean().item()]
    return torch.stack(losses).mean(), met


def make_completions(rng, V, groups):
    """Rollouts: per group a prompt and completions of the given lengths, advantages normalised
    per group from random rewards (sample std, as the trainer)."""
    out = []
    for n_prompt, lengths in groups:
        prompt = rng.integers(0, V, size=n_prompt).tolist()
        rewards = rng.normal(size=len(lengths))
        adv = (rewards - rewards.mean()) / (rewards.std(ddof=1) + 1e-4)
        for n, a in zip(lengths, adv):
            out.append(dict(ids=prompt + rng.integers(0, V, size=n).tolist(), mask=[0] * n_prompt + [1] * n,
                            advantage=float(a)))
    return out


def make_pairs(rng, V, shapes):
    """Pairs sharing a prompt: (prompt, chosen response, rejected response) lengths."""
    pairs = []
    for n_prompt, n_chosen, n_rejected in shapes:
        prompt = rng.integers(0, V, size=n_prompt).tolist()
        ch, rj = rng.integers(0, V, size=n_chosen).tolist(), rng.integers(0, V, size=n_rejected).tolist()
        pairs.append(dict(chosen=prompt + ch, chosen_mask=[0] * n_prompt + [1] * n_chosen,
                          rejected=prompt + rj, rejected_mask=[0] * n_prompt + [1] * n_rejected))
    return pairs


def same_as_before(before_tool, d):
    """Runs a build from before a change on the same case: gradients, losses and updated
    weights must be the same bytes ("training bit-identical to before")."""
    grads = open(os.path.join(d, "grads.safetensors"), "rb").read()
    ours = json.load(open(os.path.join(d, "result.json")))
    subprocess.run([before_tool, d], check=True)
    theirs = json.load(open(os.path.join(d, "result.json")))
    same = open(os.path.join(d, "grads.safetensors"), "rb").read() == grads and all(
        ours[k] == theirs[k] for k in ("losses", "grad_norms"))
    print(("ok   " if same else "FAIL ") + "gradients and losses identical to the build before")
    return 0 if same else 1


def main():
    tool, name = sys.argv[1], sys.argv[2]
    case = CONFIGS[name]
    c = case["config"]
    rng = np.random.default_rng(sum(map(ord, name)))
    torch.manual_seed(1234)
    shapes = param_shapes(c)
    P32 = {}
    for n, s in shapes.items():
        if n.endswith("norm.weight"):
            P32[n] = 1.0 + 0.1 * torch.randn(s)
        elif n.endswith(".bias"):
            P32[n] = 0.1 * torch.randn(s)
        else:
            P32[n] = 0.3 * torch.randn(s) if "embed" in n else torch.randn(s) / math.sqrt(s[1])
    V = c["vocab_size"]
    nmicro = case.get("micro", 1)
    micro = []
    dpo, grpo = case.get("dpo"), case.get("grpo")
    for m in range(nmicro):
        if grpo:
            micro.append({"completions": make_completions(rng, V, case["groups"])})
            continue
        if dpo:
            micro.append({"pairs": make_pairs(rng, V, case["pairs"])})
            continue
        mb = {"docs": [rng.integers(0, V, size=n + 1).tolist() for n in case["docs"][m % len(case["docs"])]]}
        if case.get("train_type") == "sft":
            # Prompt = first third of each document: its targets are excluded from the loss.
            mb["masks"] = [[0 if i <= len(d) // 3 else 1 for i in range(len(d))] for d in mb["docs"]]
        micro.append(mb)
    steps = 10
    lrs = [1e-2 * (0.5 + 0.5 * math.cos(math.pi * s / steps)) for s in range(steps)]
    cfg = dict(micro_batches=micro, label_smoothing=case["label_smoothing"], lrs=lrs, beta1=0.9,
               beta2=0.95, eps=1e-8, weight_decay=0.1, max_grad_norm=case.get("max_grad_norm", 0.0),
               train_type=case.get("train_type", "seq"), recompute=case.get("recompute", False))
    if dpo:
        cfg.update(dpo_beta=dpo["beta"], dpo_loss=dpo["loss"], dpo_label_smoothing=dpo["label_smoothing"])
    if grpo:
        cfg.update(clip_eps=grpo["clip_eps"], kl_coef=grpo["kl_coef"])
    lora = case.get("lora")
    if lora:
        cfg["lora"] = lora
        factors = lora_factors(P32, lora)
    if dpo or grpo:
        # The reference policy: the same shapes, weights moved off the policy's.
        Pref32 = {n: t + 0.05 * torch.randn(t.shape) for n, t in P32.items()}
    if grpo and grpo["behaviour"]:
        # Behaviour log-probs: the starting policy's (f32 weights, in float64) moved by up to ±0.4.
        P0 = {n: t.double() for n, t in P32.items()}
        for mb in micro:
            beh = []
            for comp in mb["completions"]:
                with torch.no_grad():
                    lp = token_logps(c, P0, comp["ids"]).numpy()
                beh += (lp + rng.uniform(-0.4, 0.4, size=lp.shape)).tolist()
            mb["behaviour_logp"] = beh

    with tempfile.TemporaryDirectory() as d:
        json.dump(c, open(os.path.join(d, "config.json"), "w"))
        json.dump(cfg, open(os.path.join(d, "case.json"), "w"))
        write_safetensors(os.path.join(d, "params.safetensors"), P32)
        if dpo or grpo:
            write_safetensors(os.path.join(d, "ref_params.safetensors"), Pref32)
        if lora:
            write_adapter(os.path.join(d, "adapter"), lora, factors)
        subprocess.run([tool, d], check=True)
        if len(sys.argv) == 5 and sys.argv[3] == "--before":
            return same_as_before(sys.argv[4], d)
        ours_grads = read_safetensors(os.path.join(d, "grads.safetensors"))
        ours = json.load(open(os.path.join(d, "result.json")))

    if lora:
        # Trainable: the factors, run unmerged beside the frozen base (as PEFT does).
        base = {n: t.double() for n, t in P32.items()}
        P = {}
        for n, (A, B) in factors.items():
            P[n[: -len(".weight")] + ".lora_A.weight"] = A.double().clone().requires_grad_(True)
            P[n[: -len(".weight")] + ".lora_B.weight"] = B.double().clone().requires_grad_(True)
        effective = lambda: {**base, **P}  # noqa: E731
    else:
        P = {n: t.double().clone().requires_grad_(True) for n, t in P32.items()}
        effective = lambda: P  # noqa: E731
    decay = [P[n] for n in P if P[n].dim() == 2 and "embed" not in n]
    no_decay = [P[n] for n in P if not (P[n].dim() == 2 and "embed" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=lrs[0], betas=(0.9, 0.95), eps=1e-8)
    ok = True
    ref_losses = []
    if dpo or grpo:
        Pref = {n: t.double() for n, t in Pref32.items()}
    for step in range(steps):
        opt.zero_grad()
        if dpo or grpo:
            if dpo:
                terms = [dpo_micro(c, P, Pref, mb, dpo) for mb in micro]
                units, names = sum(len(mb["pairs"]) for mb in micro), DPO_METRICS
            else:
                terms = [grpo_micro(c, P, Pref, mb, grpo) for mb in micro]
                units, names = sum(len(mb["completions"]) for mb in micro), GRPO_METRICS
            loss = sum(t[0] for t in terms) / nmicro
            met = sum(t[1] for t in terms) / units
            for k, (a, b) in enumerate(zip(ours["metrics"][step], met)):
                if abs(a - b) > max(1e-5, 1e-4 * abs(b)):
                    ok = False
                    print(f"FAIL step {step} {names[k]}: ours {a:.7f} torch {b:.7f}")
            if step in (0, steps - 1):
                print(f"step {step}: " + ", ".join(f"{n} {v:.5f}" for n, v in zip(names, met)))
        else:
            Pe = effective()
            # Dropout seeds: train_oracle_tool's set_dropout_seed(1000 · step + micro-batch).
            loss = sum(micro_loss(c, Pe, mb, case["label_smoothing"], lora, 1000 * step + m)
                       for m, mb in enumerate(micro)) / nmicro
        loss.backward()
        ref_losses.append(loss.item())
        if step == 0:
            assert set(ours_grads) == set(P), f"parameter sets differ: {set(ours_grads) ^ set(P)}"
            worst = 0.0
            for n, p in P.items():
                ref = p.grad.detach()
                err = (ours_grads[n].double() - ref).abs().max().item()
                rel = err / max(ref.abs().max().item(), 1e-12)
                worst = max(worst, rel)
                if rel > 1e-4:
                    ok = False
                    print(f"FAIL grad {n}: max abs err {err:.3e}, relative {rel:.3e}")
            print(f"{name}: {len(P)} gradients, worst relative error {worst:.2e}")
        if cfg["max_grad_norm"] > 0:
            torch.nn.utils.clip_grad_norm_(list(P.values()), cfg["max_grad_norm"])
        for gidx in opt.param_groups:
            gidx["lr"] = lrs[step]
        opt.step()
    for s, (a, b) in enumerate(zip(ours["losses"], ref_losses)):
        rel = abs(a - b) / abs(b)
        flag = "ok" if rel <= 1e-4 else "FAIL"
        if rel > 1e-4:
            ok = False
        print(f"step {s}: ours {a:.7f} torch {b:.7f} rel {rel:.1e} {flag}")
    if ok:
        print("PASS")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    sys.exit(main())
