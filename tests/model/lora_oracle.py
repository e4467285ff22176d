#!/usr/bin/env python3
"""LoRA adapters in the PEFT layout, merged at load (`--lora`) and by `astrai lora merge`,
against PyTorch.

For random base models and random adapters (rank 4 on every projection, or a subset; plain
and rsLoRA scaling), the log-probabilities `astrai score --lora ADAPTER` gives equal a float64
PyTorch forward in which every adapted projection computes x·Wᵀ + s·(x·Aᵀ)·Bᵀ (the unmerged
LoRA forward; tolerance 1e-4 absolute on log-probabilities, which are O(1..10)). The checkpoint
`astrai lora merge` writes scores the same bits as --lora; its bf16 variant loads and stays
within bf16 precision. Adapters PEFT features we do not implement (bias training, DoRA,
modules_to_save), a missing lora_B, an adapter for another model's shapes and a module the
model lacks are clear errors.

usage: lora_oracle.py   (ASTRAI_BIN names the binary)
"""
import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "train"))
import safetensors_np as st  # noqa: E402
from oracle_train import forward_logits, param_shapes  # noqa: E402

ASTRAI = os.environ.get("ASTRAI_BIN", "astrai")
failures = []

CASES = {
    "llama_all": dict(config=dict(model_type="llama", vocab_size=67, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, intermediate_size=48,
                                  rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=True),
                      targets=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
                      r=4, alpha=8, rslora=False),
    "qwen2_qv_rslora": dict(config=dict(model_type="qwen2", vocab_size=59, hidden_size=24, num_hidden_layers=2,
                                        num_attention_heads=3, num_key_value_heads=3, intermediate_size=40,
                                        rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=False),
                            targets=["q_proj", "v_proj"], r=8, alpha=16, rslora=True),
}


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def run(args):
    return subprocess.run([ASTRAI] + args, capture_output=True, text=True)


def module_of(name):
    parts = name.split(".")
    return parts[-2] if name.endswith(".weight") and len(parts) >= 2 else None


def write_model(d, c, P):
    os.makedirs(d, exist_ok=True)
    json.dump(c, open(os.path.join(d, "config.json"), "w"))
    st.write_safetensors(os.path.join(d, "model.safetensors"), [st.f32_entry(n, t.numpy()) for n, t in P.items()])


def write_adapter(d, case, factors, extra_config=None, drop_b=None):
    os.makedirs(d, exist_ok=True)
    cfg = dict(peft_type="LORA", r=case["r"], lora_alpha=case["alpha"], use_rslora=case["rslora"],
               target_modules=case["targets"], bias="none", lora_dropout=0.0)
    cfg.update(extra_config or {})
    json.dump(cfg, open(os.path.join(d, "adapter_config.json"), "w"))
    entries = []
    for name, (A, B) in factors.items():
        base = "base_model.model." + name[: -len(".weight")]
        entries.append(st.f32_entry(base + ".lora_A.weight", A.numpy()))
        if name != drop_b:
            entries.append(st.f32_entry(base + ".lora_B.weight", B.numpy()))
    st.write_safetensors(os.path.join(d, "adapter_model.safetensors"), entries)


def score(model, ids, lora=None):
    args = ["score", "--model", model, "--ids", ",".join(map(str, ids)), "--json", "--threads", "2"]
    if lora:
        args += ["--lora", lora]
    r = run(args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["logprobs"]


def torch_logprobs(c, P64, ids):
    lp = torch.log_softmax(forward_logits(c, P64, ids[:-1]), dim=-1)
    return [None] + [lp[i, ids[i + 1]].item() for i in range(len(ids) - 1)]


def main():
    torch.manual_seed(5)
    rng = np.random.default_rng(5)
    with tempfile.TemporaryDirectory() as tmp:
        for name, case in CASES.items():
            c = case["config"]
            P = {}
            for n, s in param_shapes(c).items():
                P[n] = (1.0 + 0.1 * torch.randn(s)) if n.endswith("norm.weight") else (
                    0.1 * torch.randn(s) if n.endswith(".bias") else torch.randn(s) / math.sqrt(s[-1]))
            factors = {}
            for n, t in P.items():
                if module_of(n) in case["targets"] and t.dim() == 2:
                    factors[n] = (0.3 * torch.randn(case["r"], t.shape[1]), 0.3 * torch.randn(t.shape[0], case["r"]))
            base, adapter = os.path.join(tmp, name), os.path.join(tmp, name + "_lora")
            write_model(base, c, P)
            write_adapter(adapter, case, factors)
            s = case["alpha"] / (math.sqrt(case["r"]) if case["rslora"] else case["r"])
            P64 = {n: t.double() for n, t in P.items()}
            for n, (A, B) in factors.items():
                P64[n] = P64[n] + s * (B.double() @ A.double())  # = the unmerged x·Wᵀ + s·(x·Aᵀ)·Bᵀ
            ids = rng.integers(0, c["vocab_size"], size=23).tolist()
            ours = score(base, ids, adapter)
            want = torch_logprobs(c, P64, ids)
            err = max(abs(a - b) for a, b in zip(ours[1:], want[1:]))
            plain = torch_logprobs(c, {n: t.double() for n, t in P.items()}, ids)
            moved = max(abs(a - b) for a, b in zip(plain[1:], want[1:]))
            check(err <= 1e-4 and moved > 0.05,
                  f"{name}: {len(factors)} adapted weights; --lora log-probs vs PyTorch max abs err {err:.2e} "
                  f"(the adapter moves them by {moved:.2f})")
            merged = os.path.join(tmp, name + "_merged")
            r = run(["lora", "merge", "--model", base, "--lora", adapter, "--output", merged])
            check(r.returncode == 0 and f"merged {len(factors)} LoRA weights" in r.stdout, f"{name}: lora merge ({r.stderr[-200:]})")
            check(score(merged, ids) == ours, f"{name}: the merged checkpoint scores the same bits as --lora")
            merged16 = os.path.join(tmp, name + "_merged_bf16")
            r = run(["lora", "merge", "--model", base, "--lora", adapter, "--output", merged16, "--dtype", "bf16"])
            err16 = max(abs(a - b) for a, b in zip(score(merged16, ids)[1:], want[1:])) if r.returncode == 0 else 1e9
            check(err16 < 0.1, f"{name}: bf16 merge loads, log-probs within bf16 precision ({err16:.3f})")

        # Clear errors.
        case = CASES["llama_all"]
        c = case["config"]
        base = os.path.join(tmp, "llama_all")
        P = {n: torch.zeros(s) for n, s in param_shapes(c).items()}
        good = {n: (torch.zeros(case["r"], t.shape[1]), torch.zeros(t.shape[0], case["r"]))
                for n, t in P.items() if module_of(n) in ("q_proj",)}
        ids = ["--ids", "1,2,3"]

        def expect_error(label, adapter_dir, needle):
            r = run(["score", "--model", base, "--lora", adapter_dir] + ids)
            check(r.returncode != 0 and needle in r.stderr, f"{label}: {r.stderr.strip()[-150:]}")

        for label, extra, needle in (("bias training", {"bias": "all"}, "\"bias\""),
                                     ("DoRA", {"use_dora": True}, "DoRA"),
                                     ("modules_to_save", {"modules_to_save": ["lm_head"]}, "modules_to_save")):
            d = os.path.join(tmp, "bad_" + label.replace(" ", "_"))
            write_adapter(d, case, good, extra)
            expect_error(label, d, needle)
        d = os.path.join(tmp, "bad_no_b")
        write_adapter(d, case, good, drop_b=next(iter(good)))
        expect_error("missing lora_B", d, "no lora_B")
        wrong = {n: (torch.zeros(case["r"], A.shape[1] + 1), B) for n, (A, B) in good.items()}
        d = os.path.join(tmp, "bad_shape")
        write_adapter(d, case, wrong)
        expect_error("shape of another model", d, "q_proj")
        d = os.path.join(tmp, "bad_module")
        write_adapter(d, case, {"model.layers.7.self_attn.q_proj.weight": next(iter(good.values()))})
        expect_error("module the model lacks", d, "does not have")
        expect_error("not an adapter", os.path.join(tmp, "nothing_here"), "adapter_config.json")
    print("FAILED: " + "; ".join(failures) if failures else "PASS")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
