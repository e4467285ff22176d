#!/usr/bin/env python3
"""PyTorch half of bench/train_bench: the same Llama model (weights from params.safetensors),
the same batches, the same update (CE loss, global clip 1.0, AdamW wd 0.1 on matrices,
betas 0.9/0.95). Prints {"wall_s", "cpu_s", "last_loss"} for updates 1.. (update 0 warms up).
usage: train_bench_torch.py DIR THREADS"""
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from safetensors_np import read_safetensors_f32  # noqa: E402


def main():
    d, threads = sys.argv[1], int(sys.argv[2])
    torch.set_num_threads(threads)
    c = json.load(open(d + "/config.json"))
    P = {k: torch.from_numpy(v).requires_grad_(True) for k, v in read_safetensors_f32(d + "/params.safetensors").items()}
    batches = json.load(open(d + "/batches.json"))
    D, H = c["hidden_size"], c["num_attention_heads"]
    hd = D // H
    L = len(batches[0][0]) - 1
    inv = 1.0 / (10000.0 ** (torch.arange(0, hd, 2).float() / hd))
    ang = torch.arange(L).float()[:, None] * inv[None, :]
    cos, sin = torch.cos(ang), torch.sin(ang)
    mask = torch.triu(torch.full((L, L), float("-inf")), 1)

    def rope(x):  # [B, H, L, hd]
        h = hd // 2
        x1, x2 = x[..., :h], x[..., h:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    def loss_fn(ids):
        ids = torch.tensor(ids)
        inp, tgt = ids[:, :-1], ids[:, 1:]
        B = inp.shape[0]
        x = P["model.embed_tokens.weight"][inp]
        for l in range(c["num_hidden_layers"]):
            p = f"model.layers.{l}."
            h = rms(x, P[p + "input_layernorm.weight"])
            q = (h @ P[p + "self_attn.q_proj.weight"].T).view(B, L, H, hd).transpose(1, 2)
            k = (h @ P[p + "self_attn.k_proj.weight"].T).view(B, L, H, hd).transpose(1, 2)
            v = (h @ P[p + "self_attn.v_proj.weight"].T).view(B, L, H, hd).transpose(1, 2)
            att = torch.softmax(rope(q) @ rope(k).transpose(-1, -2) / math.sqrt(hd) + mask, dim=-1)
            a = (att @ v).transpose(1, 2).reshape(B, L, D)
            x = x + a @ P[p + "self_attn.o_proj.weight"].T
            h = rms(x, P[p + "post_attention_layernorm.weight"])
            x = x + (F.silu(h @ P[p + "mlp.gate_proj.weight"].T) * (h @ P[p + "mlp.up_proj.weight"].T)) @ P[p + "mlp.down_proj.weight"].T
        logits = rms(x, P["model.norm.weight"]) @ P["model.embed_tokens.weight"].T
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1))

    decay = [v for k, v in P.items() if v.dim() == 2 and "embed" not in k]
    other = [v for k, v in P.items() if not (v.dim() == 2 and "embed" not in k)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.95), eps=1e-8)

    def update(ids):
        opt.zero_grad()
        loss = loss_fn(ids)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(P.values()), 1.0)
        opt.step()
        return loss.item()

    update(batches[0])
    w0, c0 = time.perf_counter(), time.process_time()
    last = 0.0
    for b in batches[1:]:
        last = update(b)
    print(json.dumps({"wall_s": time.perf_counter() - w0, "cpu_s": time.process_time() - c0, "last_loss": last}))


if __name__ == "__main__":
    main()
