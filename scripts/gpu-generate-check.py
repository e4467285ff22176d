#!/usr/bin/env python3
"""Generation on the GPU against the CPU, through the whole `astrai generate` path (engine,
paged KV cache in device memory, continuous batching, decode steps replayed as CUDA graphs,
sampling): eight greedy requests of different lengths decoded together, once with
--device cpu, once with --device cuda and once with --device cuda --sample-on device (tokens
drawn on the GPU). The token ids must be equal; each chosen token's
log-probability within 1e-4 (1 + |lp|) of the CPU's (f32 model: other summation orders in
cuBLAS and the attention's key splits). Run by scripts/gpu-check.sh with a model
directory; needs no PyTorch.

  gpu-generate-check.py --astrai BIN --model DIR [--out DIR]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

PROMPTS = ["The whale", "Call me Ishmael.", "It was the", "Queequeg and I", "The sea",
           "Ahab stood on the deck and", "Of all the", "A ship"]
TOL = 1e-4


def generate(astrai, model, device, requests, out, sample_on="host"):
    start = time.time()
    subprocess.run([astrai, "generate", "--model", model, "--device", device, "--input-file", requests,
                    "--output-file", out, "--include-ids", "--ignore-eos", "--kv-dtype", "f32",
                    "--sample-on", sample_on], check=True)
    seconds = time.time() - start
    with open(out) as f:
        return [json.loads(line) for line in f if line.strip()], seconds


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--astrai", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", default=None, help="where the requests and both outputs are written")
    a = ap.parse_args()
    out = a.out or tempfile.mkdtemp(prefix="gpu-generate-")
    os.makedirs(out, exist_ok=True)
    requests = os.path.join(out, "requests.jsonl")
    with open(requests, "w") as f:
        for i, p in enumerate(PROMPTS):
            f.write(json.dumps({"prompt": p, "max_tokens": 48 + 8 * i, "temperature": 0, "logprobs": 1}) + "\n")
    cpu, cpu_s = generate(a.astrai, a.model, "cpu", requests, os.path.join(out, "cpu.jsonl"))
    gpu, gpu_s = generate(a.astrai, a.model, "cuda", requests, os.path.join(out, "cuda.jsonl"))
    on_gpu, on_gpu_s = generate(a.astrai, a.model, "cuda", requests, os.path.join(out, "cuda-sampled.jsonl"), "device")
    failures = 0
    for name, run, seconds in (("cuda", gpu, gpu_s), ("cuda --sample-on device", on_gpu, on_gpu_s)):
        failures += compare(cpu, run, name, cpu_s, seconds)
    sys.exit(1 if failures else 0)


def compare(cpu, gpu, name, cpu_s, gpu_s):
    """Prints how the GPU run `name` compares with the CPU's; returns the number of failures."""
    if len(cpu) != len(PROMPTS) or len(gpu) != len(PROMPTS):
        print(f"gpu-generate-check: {len(cpu)} CPU and {len(gpu)} {name} results for {len(PROMPTS)} requests")
        return 1
    failures, worst, tokens = 0, 0.0, 0
    for i, (c, g) in enumerate(zip(cpu, gpu)):
        if c["ids"] != g["ids"]:
            at = next((j for j, (x, y) in enumerate(zip(c["ids"], g["ids"])) if x != y), min(len(c["ids"]), len(g["ids"])))
            gap = ""
            if at < len(c["logprobs"]) and at < len(g["logprobs"]):
                gap = f" (CPU chose {c['ids'][at]} at {c['logprobs'][at]['logprob']:.6f}, GPU {g['ids'][at]} at {g['logprobs'][at]['logprob']:.6f})"
            print(f"{name}, request {i}: token ids differ from position {at}{gap}")
            failures += 1
            continue
        tokens += len(c["ids"])
        for j, (lc, lg) in enumerate(zip(c["logprobs"], g["logprobs"])):
            err = abs(lc["logprob"] - lg["logprob"])
            worst = max(worst, err / (1 + abs(lc["logprob"])))
            if err > TOL * (1 + abs(lc["logprob"])):
                print(f"{name}, request {i} token {j}: logprob {lg['logprob']} on the GPU, {lc['logprob']} on the CPU")
                failures += 1
                break
    print(f"gpu-generate-check, {name}: {len(PROMPTS)} greedy requests, {tokens} tokens equal to the CPU's; worst "
          f"logprob difference {worst:.2e} relative (tolerance {TOL}); wall time cpu {cpu_s:.1f} s, {name} {gpu_s:.1f} s "
          f"(model load included)")
    return failures


if __name__ == "__main__":
    main()
