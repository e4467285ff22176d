#!/usr/bin/python3
"""Oracle test of the forward pass against PyTorch (torch 1.13, CPU).

Builds random-weight models of every supported architecture, saves them in the Hugging Face
layout (config.json + safetensors: single file, sharded, f32/bf16/f16), runs
`astrai score --dump-logits` and compares with a PyTorch implementation of the same
semantics (Hugging Face modeling code for llama/mistral/qwen2/qwen3, the reference AstrAI's
module.py for autoregressive_lm), written out here with matmul + softmax.

Checks, per model:
  * logits of one sequence: max|ours - torch| / max|torch| < 1e-4;
  * several sequences packed in one ragged batch: each equals torch on that sequence alone,
    and is bit-identical to scoring that sequence alone;
  * prefill through the paged KV cache in chunks: bit-identical to the single forward;
  * --json log-probs agree with torch's log_softmax.
Then bad inputs: each must fail with a clear message and no crash.

Usage: oracle_forward.py [--keep DIR] [--only NAME]   (ASTRAI_BIN names the binary)
"""
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import safetensors_np as st  # noqa: E402

TOL = 1e-4
ASTRAI = os.environ.get("ASTRAI_BIN", "astrai")
torch.manual_seed(0)
np.random.seed(0)

# ----------------------------------------------------------------------------- safetensors


def st_bytes(t: torch.Tensor, dtype: str) -> bytes:
    t = t.detach().contiguous()
    if dtype == "F32":
        return t.to(torch.float32).numpy().tobytes()
    if dtype == "F16":
        return t.to(torch.float16).numpy().tobytes()
    if dtype == "BF16":
        return t.to(torch.bfloat16).view(torch.int16).numpy().tobytes()
    raise ValueError(dtype)


def write_safetensors(path, tensors, dtype="F32", raw_overrides=None):
    """tensors: list of (name, torch tensor). raw_overrides: name -> (dtype, shape, bytes)."""
    entries = [(name,) + tuple(raw_overrides[name]) if raw_overrides and name in raw_overrides
               else (name, dtype, list(t.shape), st_bytes(t, dtype)) for name, t in tensors]
    st.write_safetensors(path, entries, {"format": "pt"})


def save_model(d, cfg, tensors, dtype="F32", shards=1):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    if shards == 1:
        write_safetensors(os.path.join(d, "model.safetensors"), tensors, dtype)
        return
    per = (len(tensors) + shards - 1) // shards
    weight_map = {}
    for s in range(shards):
        part = tensors[s * per:(s + 1) * per]
        fname = "model-%05d-of-%05d.safetensors" % (s + 1, shards)
        write_safetensors(os.path.join(d, fname), part, dtype)
        for name, _ in part:
            weight_map[name] = fname
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f)


def rounded(t, dtype):
    """The f32 values a tensor has after being stored in `dtype`."""
    if dtype == "BF16":
        return t.to(torch.bfloat16).to(torch.float32)
    if dtype == "F16":
        return t.to(torch.float16).to(torch.float32)
    return t.clone()

# ----------------------------------------------------------------------------- the model


class Cfg:
    def __init__(self, j):
        self.j = j
        self.type = j["model_type"]
        self.own = self.type in ("autoregressive_lm", "transformer")
        self.vocab = j["vocab_size"]
        self.h = j["hidden_size"]
        self.ffn = j["intermediate_size"]
        self.layers = j["num_hidden_layers"]
        self.nh = j["num_attention_heads"]
        self.nkv = j.get("num_key_value_heads", self.nh)
        self.hd = j.get("head_dim") or self.h // self.nh
        self.eps = j.get("rms_norm_eps", 1e-6)
        self.theta = j.get("rope_theta", 10000.0)
        self.max_pos = j.get("max_position_embeddings", 2048)
        self.tied = j.get("tie_word_embeddings", False)
        self.qkv_bias = self.type == "qwen2" or j.get("attention_bias", False)
        self.o_bias = self.type != "qwen2" and j.get("attention_bias", False)
        self.mlp_bias = j.get("mlp_bias", False)
        self.qk_norm = self.type == "qwen3" or (self.own and j.get("use_qk_norm", False))
        self.gated = self.own and j.get("use_gated_attention", False)
        self.rank = j.get("kv_lora_rank", 0) if self.own else 0
        self.mla = self.rank > 0
        if self.mla:
            self.nope = j["qk_nope_head_dim"]
            self.rope = j["qk_rope_head_dim"]
            self.vd = j.get("v_head_dim", self.nope)
            self.hd = self.nope + self.rope
        else:
            self.nope, self.rope, self.vd = 0, self.hd, self.hd
        self.adjacent = self.own
        self.scaling = j.get("rope_scaling")


def param_shapes(c):
    """(HF name, shape, kind) in checkpoint order; kind picks the random init."""
    out = [("model.embed_tokens.weight", (c.vocab, c.h), "embed")]
    for i in range(c.layers):
        p, a = "model.layers.%d." % i, "model.layers.%d.self_attn." % i
        out.append((p + "input_layernorm.weight", (c.h,), "norm"))
        if c.mla:
            out += [(a + "q_proj.weight", (c.nh * c.hd, c.h), "w"),
                    (a + "kv_a_proj.weight", (c.rank, c.h), "w"),
                    (a + "kv_norm.weight", (c.rank,), "norm"),
                    (a + "kv_b_proj.weight", (c.nkv * (c.nope + c.rope + c.vd), c.rank), "w")]
        else:
            for n, rows in (("q", c.nh), ("k", c.nkv), ("v", c.nkv)):
                out.append((a + n + "_proj.weight", (rows * c.hd, c.h), "w"))
                if c.qkv_bias:
                    out.append((a + n + "_proj.bias", (rows * c.hd,), "bias"))
            if c.qk_norm:
                out += [(a + "q_norm.weight", (c.hd,), "norm"), (a + "k_norm.weight", (c.hd,), "norm")]
        if c.gated:
            out.append((a + "gate.weight", (c.nh * c.vd, c.h), "w"))
        out.append((a + "o_proj.weight", (c.h, c.nh * c.vd), "w"))
        if c.o_bias:
            out.append((a + "o_proj.bias", (c.h,), "bias"))
        out.append((p + "post_attention_layernorm.weight", (c.h,), "norm"))
        for n, shape in (("gate", (c.ffn, c.h)), ("up", (c.ffn, c.h)), ("down", (c.h, c.ffn))):
            out.append((p + "mlp.%s_proj.weight" % n, shape, "w"))
            if c.mlp_bias:
                out.append((p + "mlp.%s_proj.bias" % n, (shape[0],), "bias"))
    out.append(("model.norm.weight", (c.h,), "norm"))
    if not c.tied:
        out.append(("lm_head.weight", (c.vocab, c.h), "w"))
    return out


def random_weights(c):
    w = {}
    for name, shape, kind in param_shapes(c):
        if kind == "embed":
            t = torch.randn(shape)
        elif kind == "norm":
            t = 1.0 + 0.2 * torch.randn(shape)
        elif kind == "bias":
            t = 0.2 * torch.randn(shape)
        else:
            t = torch.randn(shape) / math.sqrt(shape[1])
        w[name] = t.float()
    return w


def inv_freq(c, seq_len):
    dim = c.rope
    s = c.scaling or {}
    kind = s.get("rope_type", s.get("type", "default"))
    base = c.theta
    if kind == "dynamic":
        orig = s.get("original_max_position_embeddings", c.max_pos)
        seq_len = max(seq_len, orig)
        base = base * ((s["factor"] * seq_len / orig) - (s["factor"] - 1)) ** (dim / (dim - 2))
    if c.own:  # reference AstrAI: float64
        inv = base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    else:  # Hugging Face: float32
        inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if kind == "linear":
        inv = inv / s["factor"]
    elif kind == "llama3":
        factor, lo, hi = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
        old = s["original_max_position_embeddings"]
        low_wl, high_wl = old / lo, old / hi
        wavelen = 2 * math.pi / inv
        inv_l = torch.where(wavelen > low_wl, inv / factor, inv)
        smooth = (old / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * inv_l / factor + smooth * inv_l
        medium = ~(wavelen < high_wl) * ~(wavelen > low_wl)
        inv = torch.where(medium, smoothed, inv_l)
    elif kind == "yarn":
        inv = yarn_inv_freq(c, s)
    return inv


def yarn_mscale(factor, m=1.0):
    return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0


def yarn_attention_factor(s):
    """Hugging Face's _compute_yarn_parameters: attention_factor, or from mscale / mscale_all_dim."""
    if s.get("attention_factor") is not None:
        return s["attention_factor"]
    if s.get("mscale") and s.get("mscale_all_dim"):
        return yarn_mscale(s["factor"], s["mscale"]) / yarn_mscale(s["factor"], s["mscale_all_dim"])
    return yarn_mscale(s["factor"])


def yarn_inv_freq(c, s):
    """YaRN frequencies, Hugging Face's _compute_yarn_parameters step by step (f32 tensors, the
    correction range in Python floats; float64 tensors for the reference AstrAI)."""
    dim, base, factor = c.rope, c.theta, s["factor"]
    orig = s.get("original_max_position_embeddings") or c.max_pos
    beta_fast, beta_slow = s.get("beta_fast") or 32, s.get("beta_slow") or 1
    dt = torch.float64 if c.own else torch.float32

    def correction_dim(rot):
        return (dim * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=dt) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).to(dt) / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    e = 1 - ramp
    return interpolation * (1 - e) + extrapolation * e


def cos_sin(c, positions):
    inv = inv_freq(c, int(max(positions)) + 1)
    if c.own:
        freqs = torch.outer(torch.tensor(positions, dtype=torch.float64), inv)
    else:
        freqs = inv[None, :].float() * torch.tensor(positions, dtype=torch.float32)[:, None]
    cos, sin = freqs.cos().float(), freqs.sin().float()
    s = c.scaling or {}
    if s.get("rope_type", s.get("type")) == "yarn":  # HF: cos/sin times the attention factor
        a = yarn_attention_factor(s)
        cos, sin = cos * a, sin * a
    return cos, sin


def apply_rope(x, cos, sin, adjacent):
    """x [T, H, D]; cos/sin [T, D/2]."""
    cos, sin = cos[:, None, :], sin[:, None, :]
    if adjacent:
        xr, xi = x[..., 0::2], x[..., 1::2]
        out = torch.stack([xr * cos - xi * sin, xr * sin + xi * cos], dim=-1)
        return out.reshape(x.shape)
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c2, s2 = torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)
    return x * c2 + torch.cat([-x2, x1], -1) * s2


def rms(x, w, eps):
    var = x.pow(2).mean(-1, keepdim=True)
    return w * (x * torch.rsqrt(var + eps))


# Weights whose linear layers quantize their activations to 8 bits (the q8 activation mode of
# src/kernels/cpu/linear_int8.h): id(weight tensor) -> activation block (32 or 256). Set by
# torch_forward(act_q8=...).
_ACT_Q8 = {}


def q8_activations(x, block):
    """x [T, K] rounded as the q8 mode rounds it, per block: amax, inv = 127 / amax and
    d = amax / 127 in f32, q = rint(x * inv) (f32 product, ties to even) within [-127, 127];
    blocks with amax < 1e-30 are zero. Returns d * q exactly (float64)."""
    a = x.detach().numpy().astype(np.float32)
    T, K = a.shape
    a = a.reshape(T, K // block, block)
    amax = np.abs(a).max(-1, keepdims=True)
    tiny = amax < np.float32(1e-30)
    safe = np.where(tiny, np.float32(1), amax).astype(np.float32)
    inv = (np.float32(127) / safe).astype(np.float32)
    d = (safe / np.float32(127)).astype(np.float32)
    q = np.clip(np.rint((a * inv).astype(np.float32)), -127, 127)
    q = np.where(tiny, 0, q)
    return torch.from_numpy((q.astype(np.float64) * d.astype(np.float64)).reshape(T, K))


def lin(x, w, b=None):
    block = _ACT_Q8.get(id(w))
    if block:
        y = (q8_activations(x, block) @ w.double().t()).to(torch.float32)
    else:
        y = x @ w.t()
    return y + b if b is not None else y


def torch_forward(c, W, ids, kv_bf16=False, act_q8=None):
    """Logits [T, vocab] of one sequence (positions 0..T-1). kv_bf16: K and V rounded to bf16
    where they are cached (after RoPE and qk-norm), as a bf16 KV cache stores them. act_q8: {name:
    activation block} of the weights (quantized ones, their values dequantized in W) whose linear
    layers quantize their input to 8 bits, as `--activations q8` does."""
    _ACT_Q8.clear()
    _ACT_Q8.update({id(W[n]): blk for n, blk in (act_q8 or {}).items()})
    try:
        return _forward(c, W, ids, kv_bf16)
    finally:
        _ACT_Q8.clear()


def _forward(c, W, ids, kv_bf16):
    T = len(ids)
    x = W["model.embed_tokens.weight"][torch.tensor(ids)]
    cos, sin = cos_sin(c, list(range(T)))
    mask = torch.full((T, T), float("-inf")).triu(1)
    g = c.nh // c.nkv
    for i in range(c.layers):
        p, a = "model.layers.%d." % i, "model.layers.%d.self_attn." % i
        h = rms(x, W[p + "input_layernorm.weight"], c.eps)
        if c.mla:
            q = lin(h, W[a + "q_proj.weight"]).view(T, c.nh, c.hd)
            lat = rms(lin(h, W[a + "kv_a_proj.weight"]), W[a + "kv_norm.weight"], c.eps)
            kvb = lin(lat, W[a + "kv_b_proj.weight"]).view(T, c.nkv, c.nope + c.rope + c.vd)
            k_nope, k_rope, v = kvb.split([c.nope, c.rope, c.vd], dim=-1)
            q_nope, q_rope = q.split([c.nope, c.rope], dim=-1)
            q = torch.cat([q_nope, apply_rope(q_rope, cos, sin, c.adjacent)], -1)
            k = torch.cat([k_nope, apply_rope(k_rope, cos, sin, c.adjacent)], -1)
        else:
            q = lin(h, W[a + "q_proj.weight"], W.get(a + "q_proj.bias")).view(T, c.nh, c.hd)
            k = lin(h, W[a + "k_proj.weight"], W.get(a + "k_proj.bias")).view(T, c.nkv, c.hd)
            v = lin(h, W[a + "v_proj.weight"], W.get(a + "v_proj.bias")).view(T, c.nkv, c.hd)
            if c.qk_norm and not c.own:  # Qwen3: norm, then RoPE
                q, k = rms(q, W[a + "q_norm.weight"], c.eps), rms(k, W[a + "k_norm.weight"], c.eps)
            q, k = apply_rope(q, cos, sin, c.adjacent), apply_rope(k, cos, sin, c.adjacent)
            if c.qk_norm and c.own:  # reference AstrAI: RoPE, then norm
                q, k = rms(q, W[a + "q_norm.weight"], c.eps), rms(k, W[a + "k_norm.weight"], c.eps)
        if kv_bf16:
            k, v = k.to(torch.bfloat16).to(torch.float32), v.to(torch.bfloat16).to(torch.float32)
        k = k.repeat_interleave(g, dim=1)
        v = v.repeat_interleave(g, dim=1)
        q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)  # [H, T, D]
        scores = (q @ k.transpose(1, 2)) * (1.0 / math.sqrt(c.hd)) + mask
        att = torch.softmax(scores, dim=-1) @ v  # [H, T, vd]
        att = att.transpose(0, 1).reshape(T, c.nh * c.vd)
        if c.gated:
            att = att * torch.sigmoid(lin(h, W[a + "gate.weight"]))
        x = x + lin(att, W[a + "o_proj.weight"], W.get(a + "o_proj.bias"))
        h = rms(x, W[p + "post_attention_layernorm.weight"], c.eps)
        gt = lin(h, W[p + "mlp.gate_proj.weight"], W.get(p + "mlp.gate_proj.bias"))
        up = lin(h, W[p + "mlp.up_proj.weight"], W.get(p + "mlp.up_proj.bias"))
        x = x + lin(torch.nn.functional.silu(gt) * up, W[p + "mlp.down_proj.weight"], W.get(p + "mlp.down_proj.bias"))
    head = W["model.embed_tokens.weight"] if c.tied else W["lm_head.weight"]
    return lin(rms(x, W["model.norm.weight"], c.eps), head)

# ----------------------------------------------------------------------------- configs


def base(model_type, **kw):
    j = {"model_type": model_type, "vocab_size": 211, "hidden_size": 64, "intermediate_size": 160,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4, "rms_norm_eps": 1e-5,
         "rope_theta": 10000.0, "max_position_embeddings": 256, "tie_word_embeddings": False,
         "hidden_act": "silu"}
    j.update(kw)
    return j


# name -> (config, dtype, shards, reference names). Together: every family, MHA/GQA 4/MQA 8,
# tied and untied, q/k/v(/o/mlp) bias, qk-norm before and after RoPE, gate, MLA, all rope
# scalings, both pairings, sharded, bf16 and f16.
MODELS = {
    "llama_gqa4_llama3": (base("llama", hidden_size=128, num_attention_heads=8, num_key_value_heads=2,
                               rope_theta=500000.0, max_position_embeddings=64,
                               rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                             "high_freq_factor": 4.0, "original_max_position_embeddings": 16}),
                          "F32", 1, False),
    "llama_mha_bias_tied_sharded": (base("llama", attention_bias=True, mlp_bias=True, tie_word_embeddings=True),
                                    "F32", 3, False),
    "qwen2_bias_linear": (base("qwen2", hidden_size=96, num_attention_heads=6, num_key_value_heads=6,
                               rope_theta=1000000.0, tie_word_embeddings=True,
                               rope_scaling={"type": "linear", "factor": 2.0}), "F32", 1, False),
    "qwen3_qknorm_mqa8_dynamic_bf16": (base("qwen3", num_attention_heads=8, num_key_value_heads=1, head_dim=24,
                                            max_position_embeddings=16,
                                            rope_scaling={"rope_type": "dynamic", "factor": 2.0}), "BF16", 1, False),
    # YaRN as Qwen's model cards configure it (factor 4, the defaults otherwise), and with every
    # optional field: betas, DeepSeek's mscale pair, no rounding of the correction range.
    "qwen2_gqa2_yarn": (base("qwen2", hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
                             max_position_embeddings=256,
                             rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                           "original_max_position_embeddings": 64}), "F32", 1, False),
    "llama_yarn_mscale_untruncated": (base("llama", hidden_size=128, num_attention_heads=4, rope_theta=50000.0,
                                           rope_scaling={"type": "yarn", "factor": 3.0, "beta_fast": 24.0,
                                                         "beta_slow": 2.0, "mscale": 0.9, "mscale_all_dim": 0.7,
                                                         "truncate": False}), "F32", 1, False),
    "arlm_yarn": (base("autoregressive_lm", rope_scaling={"rope_type": "yarn", "factor": 2.0}), "F32", 1, False),
    "mistral_gqa8_f16": (base("mistral", hidden_size=128, num_attention_heads=8, num_key_value_heads=1,
                              sliding_window=None), "F16", 1, False),
    "arlm_gqa_gate_qknorm": (base("autoregressive_lm", num_attention_heads=8, num_key_value_heads=2,
                                  use_qk_norm=True, use_gated_attention=True, tie_word_embeddings=True),
                             "F32", 1, True),
    "arlm_mla_gate": (base("autoregressive_lm", num_attention_heads=4, num_key_value_heads=2, kv_lora_rank=32,
                           qk_nope_head_dim=16, qk_rope_head_dim=8, use_gated_attention=True), "F32", 1, False),
}


def reference_name(n):
    n = n[len("model."):] if n.startswith("model.") else n
    return n.replace("self_attn.", "attention.").replace("input_layernorm.", "input_norm.") \
            .replace("post_attention_layernorm.", "post_attention_norm.")

# ----------------------------------------------------------------------------- running


def run(args, expect_ok=True):
    r = subprocess.run([ASTRAI] + args, capture_output=True, text=True, errors="replace", timeout=300,
                       env=dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2")))
    if expect_ok and r.returncode != 0:
        raise AssertionError("astrai %s failed (%d): %s" % (" ".join(args), r.returncode, r.stderr))
    return r


def score(d, seqs, tmp, extra=()):
    out = os.path.join(tmp, "logits.npy")
    args = ["score", "--model", d, "--dump-logits", out, "--json"] + list(extra)
    for s in seqs:
        args += ["--ids", ",".join(map(str, s))]
    r = run(args)
    return np.load(out), json.loads(r.stdout)


def rel_err(ours, ref):
    return float(np.max(np.abs(ours - ref)) / np.max(np.abs(ref)))


FAILURES = []


def verdict():
    """Prints the outcome of every check() so far; the exit status for main()."""
    if FAILURES:
        print("%d check(s) failed" % len(FAILURES))
        return 1
    print("all checks passed")
    return 0


def check(cond, msg):
    print(("ok   " if cond else "FAIL ") + msg)
    if not cond:
        FAILURES.append(msg)


def test_model(name, tmp):
    cfg_json, dtype, shards, ref_names = MODELS[name]
    c = Cfg(cfg_json)
    W = random_weights(c)
    d = os.path.join(tmp, name)
    names = [(reference_name(n) if ref_names else n, W[n]) for n, _, _ in param_shapes(c)]
    save_model(d, cfg_json, names, dtype, shards)
    Wr = {n: rounded(t, dtype) for n, t in W.items()}  # what the file holds, in f32

    rng = np.random.RandomState(hash(name) % 2**31)
    seqs = [list(rng.randint(0, c.vocab, size=n)) for n in (24, 7, 13)]
    refs = [torch_forward(c, Wr, s).detach().numpy() for s in seqs]

    alone = [score(d, [s], tmp)[0] for s in seqs]
    for i, s in enumerate(seqs):
        e = rel_err(alone[i], refs[i])
        check(e < TOL, "%s: seq %d (len %d) rel err %.2e < %.0e" % (name, i, len(s), e, TOL))

    packed, js = score(d, seqs, tmp)
    off = 0
    for i, s in enumerate(seqs):
        part = packed[off:off + len(s)]
        off += len(s)
        check(np.array_equal(part, alone[i]), "%s: packed seq %d bit-identical to alone" % (name, i))
        lsm = torch.log_softmax(torch.from_numpy(refs[i]).double(), -1).numpy()
        want = [None] + [float(lsm[t - 1, s[t]]) for t in range(1, len(s))]
        got = js[i]["logprobs"]
        ok = got[0] is None and js[i]["ids"] == [int(v) for v in s] and all(
            abs(g - w) < 1e-3 for g, w in zip(got[1:], want[1:]))
        check(ok, "%s: --json logprobs of seq %d match torch log_softmax" % (name, i))

    # Dynamic NTK rescales by the sequence's longest position so far, so chunks shorter
    # than the original context legitimately see other frequencies (as in transformers).
    if not (c.scaling and c.scaling.get("rope_type", c.scaling.get("type")) == "dynamic"):
        chunked, _ = score(d, seqs, tmp, ["--chunk", "5", "--page-size", "4"])
        check(np.array_equal(chunked, packed), "%s: paged prefill in chunks of 5 bit-identical" % name)

# ----------------------------------------------------------------------------- bad input


def expect_error(args, needle, what):
    r = run(args, expect_ok=False)
    ok = r.returncode == 1 and needle in r.stderr and "error" in r.stderr
    check(ok, "error: %s -> %r%s" % (what, needle, "" if ok else " (rc %d, stderr %r)" % (r.returncode, r.stderr)))


def test_errors(tmp):
    cfg = base("llama", num_attention_heads=4, num_key_value_heads=2)
    c = Cfg(cfg)
    W = random_weights(c)
    tensors = [(n, W[n]) for n, _, _ in param_shapes(c)]

    def model_dir(name, cfg_j=cfg, ts=tensors, raw=None, mutate=None):
        d = os.path.join(tmp, "bad_" + name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg_j, f)
        p = os.path.join(d, "model.safetensors")
        write_safetensors(p, ts, "F32", raw)
        if mutate:
            mutate(p)
        return d

    def score_args(d, ids="1,2,3"):
        return ["score", "--model", d, "--ids", ids]

    good = model_dir("good")
    check(run(score_args(good)).returncode == 0, "error setup: good model scores")
    expect_error(score_args(good, "1,2,%d" % c.vocab), "outside the vocabulary", "id == vocab_size")
    expect_error(score_args(good, "1,-1"), "outside the vocabulary", "negative id")
    expect_error(score_args(good, "1,x"), "is not a token id", "non-numeric id")
    ctx = cfg["max_position_embeddings"]
    check(run(score_args(good, ",".join(["5"] * ctx))).returncode == 0, "a sequence of the whole context scores")
    expect_error(score_args(good, ",".join(["5"] * (ctx + 1))), "the model's context holds %d" % ctx,
                 "a sequence longer than the context")

    for name, change, needle in [
        ("unknown_type", {"model_type": "gpt2"}, 'unknown model_type "gpt2"'),
        ("missing_hidden", {"hidden_size": None}, 'missing required field "hidden_size"'),
        ("heads_kv", {"num_key_value_heads": 3}, "is not a multiple of num_key_value_heads"),
        ("head_div", {"num_attention_heads": 5, "num_key_value_heads": 5}, "not divisible"),
        ("rope_type", {"rope_scaling": {"rope_type": "longrope", "factor": 2.0}}, 'unsupported rope_type "longrope"'),
        ("act", {"hidden_act": "gelu"}, 'unsupported hidden_act "gelu"'),
        ("mla_on_llama", {"kv_lora_rank": 8}, 'field "kv_lora_rank" is not supported'),
    ]:
        j = dict(cfg)
        j.update(change)
        j = {k: v for k, v in j.items() if v is not None}
        expect_error(score_args(model_dir(name, j)), needle, "config " + name)
    alias = dict(base("autoregressive_lm"), dim=32)
    expect_error(score_args(model_dir("alias", alias)), 'contradictory fields "hidden_size"', "config alias conflict")
    with open(os.path.join(tmp, "bad_good", "config.json")) as f:
        pass
    d = model_dir("notjson")
    with open(os.path.join(d, "config.json"), "w") as f:
        f.write("{not json")
    expect_error(score_args(d), "config.json", "config not JSON")

    missing = [t for t in tensors if t[0] != "model.layers.1.mlp.up_proj.weight"]
    expect_error(score_args(model_dir("missing", ts=missing)), 'missing tensor "model.layers.1.mlp.up_proj.weight"',
                 "missing tensor")
    shaped = [(n, t if n != "model.layers.0.self_attn.k_proj.weight" else torch.zeros(16, 64)) for n, t in tensors]
    expect_error(score_args(model_dir("shape", ts=shaped)),
                 'tensor "model.layers.0.self_attn.k_proj.weight" has shape [16, 64], expected [32, 64]',
                 "misshapen tensor")
    emb = W["model.embed_tokens.weight"]
    i32 = {"model.embed_tokens.weight": ("I32", list(emb.shape), emb.numpy().astype(np.int32).tobytes())}
    expect_error(score_args(model_dir("i32", raw=i32)), 'has unsupported dtype I32', "integer weight dtype")
    f8 = {"model.norm.weight": ("F8_E4M3", [64], b"\0" * 64)}
    expect_error(score_args(model_dir("f8", raw=f8)), 'unsupported dtype "F8_E4M3"', "unknown dtype")
    badlen = {"model.norm.weight": ("F32", [64], b"\0" * 200)}
    expect_error(score_args(model_dir("badlen", raw=badlen)), 'tensor "model.norm.weight": shape [64] of F32 needs 256',
                 "shape/offsets mismatch")

    def truncate(p):
        size = os.path.getsize(p)
        with open(p, "r+b") as f:
            f.truncate(size - 100)
    expect_error(score_args(model_dir("trunc", mutate=truncate)), "outside the data section", "truncated data")

    def header_len(value):
        def m(p):
            with open(p, "r+b") as f:
                f.write(struct.pack("<Q", value))
        return m
    expect_error(score_args(model_dir("hdr_big", mutate=header_len(1 << 40))), "exceeds", "oversized header length")
    expect_error(score_args(model_dir("hdr_over", mutate=header_len(10 ** 7))), "exceeds the file", "header past EOF")

    def tiny(p):
        with open(p, "wb") as f:
            f.write(b"\x01\x02")
    expect_error(score_args(model_dir("tiny", mutate=tiny)), "truncated safetensors file", "file under 8 bytes")

    def garbage(p):
        with open(p, "r+b") as f:
            f.seek(8)
            f.write(b"\xff\xfe{{")
    expect_error(score_args(model_dir("garbage", mutate=garbage)), "not valid JSON", "header not JSON")

    d = os.path.join(tmp, "bad_noweights")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    expect_error(score_args(d), "no model.safetensors", "no weights")
    expect_error(["info", "--model", os.path.join(tmp, "nowhere")], "cannot open", "info on a missing dir")

    # Sharded index naming a tensor its shard lacks.
    d = os.path.join(tmp, "bad_index")
    save_model(d, cfg, tensors, "F32", shards=2)
    idx = json.load(open(os.path.join(d, "model.safetensors.index.json")))
    idx["weight_map"]["model.norm.weight"] = "model-00001-of-00002.safetensors"
    json.dump(idx, open(os.path.join(d, "model.safetensors.index.json"), "w"))
    expect_error(score_args(d), 'tensor "model.norm.weight" is listed in shard', "index points to the wrong shard")


def test_info(tmp):
    name = "llama_gqa4_llama3"
    d = os.path.join(tmp, name)
    r = run(["info", "--model", d, "--json"])
    j = json.loads(r.stdout)
    c = Cfg(MODELS[name][0])
    n = sum(int(np.prod(s)) for _, s, _ in param_shapes(c))
    check(j["parameters"] == n, "info: parameter count %d == %d" % (j["parameters"], n))
    check(j["mapped_bytes"] == 4 * n, "info: f32 weights mapped in place (%d bytes)" % j["mapped_bytes"])
    r = run(["info", "--model", d])
    check("GQA heads 8/2" in r.stdout and "llama3" in r.stdout, "info: text summary")


def test_device(tmp):
    """--device cuda: the same greedy tokens as the CPU where there is a GPU and a CUDA build,
    else a clear error that says what is missing (never a crash or a silent CPU run)."""
    d = os.path.join(tmp, "llama_gqa4_llama3")
    inp = os.path.join(tmp, "device_in.jsonl")
    with open(inp, "w") as f:
        f.write(json.dumps({"prompt_ids": [5, 9, 2, 7], "max_tokens": 6, "ignore_eos": True}) + "\n")
    outs = {}
    for dev in ("cpu", "cuda"):
        out = os.path.join(tmp, "device_%s.jsonl" % dev)
        r = run(["generate", "--model", d, "--input-file", inp, "--output-file", out, "--temperature", "0",
                 "--include-ids", "--device", dev], expect_ok=(dev == "cpu"))
        outs[dev] = (r, [json.loads(l)["ids"] for l in open(out)] if r.returncode == 0 else None)
    r, toks = outs["cuda"]
    if r.returncode == 0:
        check(toks == outs["cpu"][1], "--device cuda: greedy tokens equal the CPU's (%s)" % toks)
    else:
        check(r.returncode == 1 and "error" in r.stderr and "CUDA" in r.stderr,
              "--device cuda without a usable GPU: a clear error (%s)" % r.stderr.strip().splitlines()[-1])


def test_rss(tmp):
    """An f32 model is mapped, not copied: peak RSS of a forward stays near 1x the weights."""
    cfg = base("llama", vocab_size=8192, hidden_size=512, intermediate_size=1024, num_attention_heads=8,
               num_key_value_heads=8)
    c = Cfg(cfg)
    d = os.path.join(tmp, "rss")
    save_model(d, cfg, [(n, torch.randn(s) * 0.02) for n, s, _ in param_shapes(c)])
    weights = os.path.getsize(os.path.join(d, "model.safetensors"))
    probe = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL); "
             "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)")
    r = subprocess.run([sys.executable, "-c", probe, ASTRAI, "score", "--model", d, "--ids", "1,2,3,4"],
                       capture_output=True, text=True, timeout=120)
    rss = int(r.stdout.strip())
    # A copy would cost the weights twice (less the untouched embedding rows, 16 MiB here).
    check(rss < weights + (24 << 20),
          "peak RSS %.1f MiB for %.1f MiB of f32 weights (< weights + 24 MiB)" % (rss / 2**20, weights / 2**20))


def main():
    keep = None
    only = None
    argv = sys.argv[1:]
    if "--keep" in argv:
        keep = argv[argv.index("--keep") + 1]
    if "--only" in argv:
        only = argv[argv.index("--only") + 1]
    tmp = keep or tempfile.mkdtemp(prefix="astrai_oracle_")
    os.makedirs(tmp, exist_ok=True)
    try:
        for name in MODELS:
            if only and only not in name:
                continue
            test_model(name, tmp)
        if not only:
            test_info(tmp)
            test_device(tmp)
            test_rss(tmp)
            test_errors(tmp)
    finally:
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)
    if verdict():
        sys.exit(1)


if __name__ == "__main__":
    main()
