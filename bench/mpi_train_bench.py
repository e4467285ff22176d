#!/usr/bin/env python3
"""Data-parallel training rate: `astrai train` on the small bench model (train_bench.cc's "small":
Llama, 4 layers, hidden 256, vocab 4096, tied; 4.2M parameters) with a global batch of 16 × 128
tokens, as 1 process (all threads) and as `mpirun -np N` (N = 2, 4) with batch 16 / N each.

Reports per run the median over the updates after the first two of tokens/s (all ranks'
tokens), step seconds, comm_seconds (rank 0's time in collectives, waiting included),
comm_exposed_seconds (rank 0's wait for the gradient sums after the backward), comm_bytes
(bytes rank 0 passed to collectives per update) and optimizer_state_bytes (rank 0's AdamW m and
v). Oversubscribed ranks (more ranks × threads than cores) share the cores.

usage: mpi_train_bench.py ASTRAI MAKE_SHARDS [STEPS] [RANKSxTHREADS[:FLAGS]...]
  MAKE_SHARDS: build/release/tests/train/train_make_shards
  RANKSxTHREADS: e.g. 1x2 2x1 4x1 (the default: 1, 2 and 4 ranks of cores / ranks threads, at least 1)
  FLAGS: comma-separated, any of shard (--shard-optimizer), noov (--no-overlap-allreduce),
         det (--deterministic-allreduce); e.g. 2x1:shard,noov
"""
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

CONFIG = dict(model_type="llama", vocab_size=4096, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
              num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=True, max_position_embeddings=512,
              rms_norm_eps=1e-6, rope_theta=10000.0)
GLOBAL_BATCH, SEQ = 16, 128
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_btl_vader_single_copy_mechanism="none")
ENV.pop("OMP_NUM_THREADS", None)  # each rank takes cores / ranks


def main():
    astrai, make = sys.argv[1], sys.argv[2]
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 12
    cores = os.cpu_count()
    flag_of = {"shard": "--shard-optimizer", "noov": "--no-overlap-allreduce", "det": "--deterministic-allreduce"}
    runs = []
    for a in sys.argv[4:]:
        shape, _, flags = a.partition(":")
        ranks, threads = (int(x) for x in shape.split("x"))
        runs.append((ranks, threads, [f for f in flags.split(",") if f]))
    runs = runs or [(r, max(1, cores // r), []) for r in (1, 2, 4)]
    tmp = tempfile.mkdtemp(prefix="astrai_mpi_bench_")
    try:
        data = os.path.join(tmp, "data")
        subprocess.run([make, data, "4000", str(CONFIG["vocab_size"])], check=True, capture_output=True)
        cfg = os.path.join(tmp, "config.json")
        json.dump(CONFIG, open(cfg, "w"))
        print("| ranks | flags | batch per rank | threads per rank | tokens/s | step s | comm s per step | "
              "comm exposed s | comm MB per step | AdamW state bytes (rank 0) |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for i, (ranks, threads, flags) in enumerate(runs):
            out = os.path.join(tmp, f"out{i}")
            cmd = [astrai, "train", "--data", data, "--config", cfg, "--output", out, "--batch-size",
                   str(GLOBAL_BATCH // ranks), "--seq-len", str(SEQ), "--max-steps", str(steps), "--no-progress",
                   "--warmup-steps", "2", "--threads", str(threads)] + [flag_of[f] for f in flags]
            if ranks > 1:
                cmd = ["mpirun", "-np", str(ranks), "--bind-to", "none", "--oversubscribe"] + cmd
            r = subprocess.run(cmd, check=True, capture_output=True, env=ENV, text=True)
            recs = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl")) if l.strip()][2:]
            med = lambda k: statistics.median(r.get(k, 0.0) for r in recs)
            # rank 0's AdamW state: in the records under mpirun, else in the start-up log
            state = recs[-1].get("optimizer_state_bytes")
            if state is None:
                m = re.search(r"optimizer state \(AdamW m, v\): [0-9.]+ MiB \(([0-9]+) bytes\)", r.stderr)
                state = int(m.group(1)) if m else 0
            print(f"| {ranks} | {','.join(flags) or '-'} | {GLOBAL_BATCH // ranks} | {threads} | "
                  f"{med('tokens_per_s'):.0f} | {med('step_seconds'):.3f} | {med('comm_seconds'):.4f} | "
                  f"{med('comm_exposed_seconds'):.4f} | {med('comm_bytes') / 1e6:.2f} | {state:,} |", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
