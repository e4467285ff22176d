#!/usr/bin/env python3
"""Training on the GPU against the CPU, through the whole `astrai train` path (shards, the
trainer's loop, cross-entropy, clipping, AdamW, validation, checkpoints, resume): fine-tuning
a model directory for 6 updates (checkpoints every 3, validation every 3) with --device cpu and
with --device cuda. Checks, f32 (other summation orders in cuBLAS and the kernels; AdamW moves
every weight by about lr whatever its gradient's size, so differences grow a little per update):
  - every update's loss and every validation loss within 1e-4 relative of the CPU's, the first
    update's gradient norm within 1e-4;
  - resume on the GPU after a lost tail (the step-6 checkpoint deleted) reproduces the GPU's
    uninterrupted run exactly (losses, norms, final weights: the GPU kernels are deterministic);
  - a CPU checkpoint resumed with --device cuda continues within the same tolerance of the CPU.
Prints both runs' training rates. Run by scripts/gpu-check.sh; needs no PyTorch.

  gpu-train-check.py --astrai BIN --model DIR --data DIR [--out DIR]
"""
import argparse
import filecmp
import json
import os
import shutil
import subprocess
import sys
import tempfile

TOL = 1e-4
STEPS = 6


def train(astrai, model, data, out, device, extra=()):
    cmd = [astrai, "train", "--train-type", "seq", "--model", model, "--data", data, "--output", out,
           "--device", device, "--batch-size", "8", "--seq-len", "128", "--max-steps", str(STEPS),
           "--max-lr", "1e-3", "--warmup-steps", "2", "--ckpt-interval", "3", "--val-split", "0.05",
           "--val-interval", "3", "--val-batches", "4", "--seed", "7", "--no-progress", *extra]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"gpu-train-check: `{' '.join(cmd)}` failed:\n{r.stderr[-2000:]}")
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def close(a, b, tol):
    return abs(a - b) <= tol * max(abs(a), abs(b), 1e-30)


def compare(name, want, got, failures):
    """Losses (and val_loss) of every update within TOL; the first update's norm too."""
    if [r["step"] for r in want] != [r["step"] for r in got]:
        failures.append(f"{name}: updates {[r['step'] for r in got]}, CPU {[r['step'] for r in want]}")
        return 0.0
    worst = 0.0
    for w, g in zip(want, got):
        keys = ["loss", "val_loss"] + (["grad_norm"] if w["step"] == 1 else [])
        for k in keys:
            if k not in w:
                continue
            rel = abs(w[k] - g[k]) / max(abs(w[k]), 1e-30)
            worst = max(worst, rel)
            if not close(w[k], g[k], TOL):
                failures.append(f"{name}: update {w['step']} {k} {g[k]!r}, CPU {w[k]!r}")
    return worst


def strip(record):
    """A metrics record without its timings."""
    return {k: v for k, v in record.items() if not k.endswith("_per_s") and not k.endswith("_seconds")}


def rate(metrics):
    rates = [r["tokens_per_s"] for r in metrics[1:] if "tokens_per_s" in r]  # the first update warms up
    return sum(rates) / len(rates) if rates else 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--astrai", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", default=None, help="where the runs are written")
    ap.add_argument("--device", default="cuda", help="the device under test (cpu: checks this script on a CPU)")
    a = ap.parse_args()
    out = a.out or tempfile.mkdtemp(prefix="gpu-train-")
    os.makedirs(out, exist_ok=True)
    failures = []
    runs = {d: os.path.join(out, d) for d in ("cpu", "cuda", "cuda-resumed", "cpu-to-cuda")}
    for d in runs.values():
        shutil.rmtree(d, ignore_errors=True)
    cpu = train(a.astrai, a.model, a.data, runs["cpu"], "cpu")
    gpu = train(a.astrai, a.model, a.data, runs["cuda"], a.device)
    worst = compare("cuda", cpu, gpu, failures)

    # Lost tail on the GPU: a copy of the run without its step-6 checkpoint, resumed.
    shutil.copytree(runs["cuda"], runs["cuda-resumed"])
    shutil.rmtree(os.path.join(runs["cuda-resumed"], "checkpoints", "step-00000006"))
    resumed = train(a.astrai, a.model, a.data, runs["cuda-resumed"], a.device, ["--resume"])
    if [strip(r) for r in resumed] != [strip(r) for r in gpu]:
        failures.append("cuda resume: the metrics differ from the uninterrupted GPU run")
    if not filecmp.cmp(os.path.join(runs["cuda"], "model.safetensors"),
                       os.path.join(runs["cuda-resumed"], "model.safetensors"), shallow=False):
        failures.append("cuda resume: the final weights differ from the uninterrupted GPU run")

    # A CPU checkpoint continued on the GPU.
    shutil.copytree(runs["cpu"], runs["cpu-to-cuda"])
    shutil.rmtree(os.path.join(runs["cpu-to-cuda"], "checkpoints", "step-00000006"))
    crossed = train(a.astrai, a.model, a.data, runs["cpu-to-cuda"], a.device, ["--resume"])
    worst = max(worst, compare("cpu checkpoint resumed on cuda", cpu, crossed, failures))

    print(f"gpu-train-check: {STEPS} updates of 8 x 128 tokens; worst relative difference of a loss "
          f"(or the first norm) from the CPU's: {worst:.2e} (tolerance {TOL:g})")
    print(f"gpu-train-check: training rate, cpu {rate(cpu):.0f} tokens/s, {a.device} {rate(gpu):.0f} tokens/s")
    for f in failures:
        print("FAIL", f)
    if failures:
        sys.exit(1)
    print("gpu-train-check: ok")


if __name__ == "__main__":
    main()
