#!/usr/bin/env python3
"""ZeRO-1 (`--shard-optimizer`) and the overlapped gradient all-reduce under `mpirun -np N
astrai train` (the tiny seq run of cli_checks.py): every comparison below is bit for bit
(metrics.jsonl without the clock and communication fields, and the bytes of the output files).
1. 2 ranks: sharded == unsharded; --no-overlap-allreduce == overlapped; the sharded rank holds
   about half the AdamW state (optimizer_state_bytes), comm_exposed_seconds is recorded;
   a sharded checkpoint's optimizer.safetensors == the unsharded one (whole-buffer m, v);
2. 4 oversubscribed ranks: sharded without overlap == unsharded with overlap; with
   --deterministic-allreduce and --grad-accum 2: sharded, overlapped == unsharded, not;
3. a 2-rank sharded checkpoint resumed by 4 unsharded ranks continues the 2-rank run (within
   1e-6: another rank count sums in another order), and by 1 process with --shard-optimizer
   (a no-op there) too; an unsharded 2-rank checkpoint resumed by 4 sharded ranks too;
4. LoRA (--lora-rank 4 on the trained tiny model): 2 ranks sharded == unsharded, overlapped or
   not; 4 ranks sharded == unsharded;
5. one process: --shard-optimizer changes nothing.

usage: zero_mpi_cli_test.py ASTRAI MAKE_SHARDS MPIEXEC   (MPIEXEC empty: built without MPI; skipped)
"""
import os
import shutil
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
from cli_checks import check, finish, metrics, run, tiny_seq_args, tiny_seq_setup, without_timing  # noqa: E402
from safetensors_np import read_safetensors_f32  # noqa: E402

SKIP = 77
ASTRAI, MAKE, MPIEXEC = sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else ""
STEPS = 30
GLOBAL_BATCH = 4
TOL = 1e-6
MPI_ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_btl_vader_single_copy_mechanism="none")
# Fields that depend on the clock, on the communication pattern or on the sharding itself.
VARYING = ("comm_seconds", "comm_exposed_seconds", "comm_bytes", "optimizer_state_bytes")


def mpi(ranks):
    return [MPIEXEC, "-np", str(ranks), "--bind-to", "none"] + (["--oversubscribe"] if ranks > 2 else [])


def train(ranks, data, cfg, out, *extra, steps=STEPS):
    cmd = tiny_seq_args(ASTRAI, data, cfg, out, steps, batch=GLOBAL_BATCH // ranks,
                        extra=("--val-batches", "2", "--ckpt-interval", "10", *extra))
    t = time.time()
    r = run(cmd) if ranks == 1 else run(mpi(ranks) + cmd, env=MPI_ENV, timeout=300)
    what = f"{ranks} rank(s) {' '.join(extra)}".strip()
    check(r.returncode == 0, f"{what} ({time.time() - t:.1f} s) {r.stderr[-600:] if r.returncode else ''}")
    return r


def strip(records):
    return [{k: v for k, v in rec.items() if k not in VARYING} for rec in without_timing(records)]


def same_bytes(p, q):
    if not (os.path.exists(p) and os.path.exists(q)):
        return False
    with open(p, "rb") as f, open(q, "rb") as g:
        return f.read() == g.read()


def identical(out, ref, what, weights="model.safetensors"):
    """Bit-identical metrics and output weights."""
    if not (os.path.exists(os.path.join(out, "metrics.jsonl")) and os.path.exists(os.path.join(ref, "metrics.jsonl"))):
        check(False, f"{what}: both runs have metrics")
        return
    a, b = metrics(out), metrics(ref)
    check(len(a) == len(b) and strip(a) == strip(b), f"{what}: the same metrics, bit for bit ({len(a)} records)")
    check(same_bytes(os.path.join(out, weights), os.path.join(ref, weights)), f"{what}: the same {weights}, bit for bit")


def close(out, ref, what):
    a, b = metrics(out), metrics(ref)
    check([m["step"] for m in a] == [m["step"] for m in b], f"{what}: one record per update")
    worst = max((abs(x[k] - y[k]) / max(abs(y[k]), 1e-30) for x, y in zip(a, b)
                 for k in ("loss", "grad_norm", "val_loss") if k in y), default=float("inf"))
    check(worst <= TOL, f"{what}: loss, grad_norm, val_loss within {TOL} relative (worst {worst:.2e})")
    wa = read_safetensors_f32(os.path.join(out, "model.safetensors"))
    wb = read_safetensors_f32(os.path.join(ref, "model.safetensors"))
    worst_w = max(float(np.linalg.norm(wa[k] - wb[k]) / max(float(np.linalg.norm(wb[k])), 1e-30)) for k in wb)
    check(worst_w <= TOL, f"{what}: final weights within {TOL} relative (worst {worst_w:.2e})")


def two_ranks(tmp, data, cfg):
    base = os.path.join(tmp, "np2")
    train(2, data, cfg, base)
    shard = os.path.join(tmp, "np2_shard")
    r = train(2, data, cfg, shard, "--shard-optimizer")
    identical(shard, base, "2 ranks: --shard-optimizer vs not")
    check("sharded over 2 ranks" in r.stderr, "2 ranks: the start-up log reports the sharded optimizer state")
    noov = os.path.join(tmp, "np2_noov")
    train(2, data, cfg, noov, "--no-overlap-allreduce")
    identical(noov, base, "2 ranks: --no-overlap-allreduce vs overlapped")
    if os.path.exists(os.path.join(shard, "metrics.jsonl")) and os.path.exists(os.path.join(base, "metrics.jsonl")):
        ms, mb = metrics(shard), metrics(base)
        sb, ub = ms[-1].get("optimizer_state_bytes", 0), mb[-1].get("optimizer_state_bytes", 0)
        check(ub > 0 and 0.4 * ub <= sb <= 0.6 * ub,
              f"2 ranks: rank 0's AdamW state sharded {sb} bytes, unsharded {ub} (about half)")
        check(all("comm_exposed_seconds" in m and m["comm_exposed_seconds"] <= m["comm_seconds"] + 1e-3 for m in mb),
              "2 ranks: comm_exposed_seconds in every record (at most comm_seconds)")
    for step in ("step-00000010", "step-00000030"):
        check(same_bytes(*(os.path.join(d, "checkpoints", step, "optimizer.safetensors") for d in (shard, base))),
              f"2 ranks: the sharded {step} optimizer.safetensors (gathered on rank 0) == the unsharded one")
    return base, shard


def four_ranks(tmp, data, cfg):
    base = os.path.join(tmp, "np4")
    train(4, data, cfg, base)
    shard = os.path.join(tmp, "np4_shard_noov")
    train(4, data, cfg, shard, "--shard-optimizer", "--no-overlap-allreduce")
    identical(shard, base, "4 ranks: sharded, not overlapped vs unsharded, overlapped")
    det = os.path.join(tmp, "np4_det")
    train(4, data, cfg, det, "--deterministic-allreduce", "--grad-accum", "2", "--no-overlap-allreduce")
    det_shard = os.path.join(tmp, "np4_det_shard")
    train(4, data, cfg, det_shard, "--deterministic-allreduce", "--grad-accum", "2", "--shard-optimizer")
    identical(det_shard, det, "4 ranks, --deterministic-allreduce --grad-accum 2: sharded, overlapped vs neither")


def resume(tmp, data, cfg, base2, shard2):
    for src, ranks, extra in ((shard2, 4, ()), (shard2, 1, ("--shard-optimizer",)),
                              (base2, 4, ("--shard-optimizer",))):
        kind = "sharded" if src == shard2 else "unsharded"
        out = os.path.join(tmp, f"resume_{kind}_np{ranks}")
        shutil.copytree(src, out)
        for d in ("step-00000020", "step-00000030"):  # lose the tail
            shutil.rmtree(os.path.join(out, "checkpoints", d))
        for f in ("model.safetensors", "config.json"):
            os.remove(os.path.join(out, f))
        train(ranks, data, cfg, out, "--resume", *extra)
        if os.path.exists(os.path.join(out, "model.safetensors")):
            close(out, base2, f"a 2-rank {kind} checkpoint at step 10 resumed by {ranks} rank(s) {' '.join(extra)} "
                  "vs the 2-rank run")


def lora(tmp, data, cfg, base_model):
    runs = {}
    for name, ranks, extra in (("lora2", 2, ()), ("lora2_shard", 2, ("--shard-optimizer",)),
                               ("lora2_shard_noov", 2, ("--shard-optimizer", "--no-overlap-allreduce")),
                               ("lora4", 4, ()), ("lora4_shard", 4, ("--shard-optimizer",))):
        out = os.path.join(tmp, name)
        cmd_extra = ("--lora-rank", "4", "--lora-alpha", "8", *extra)
        # --model instead of --config: tiny_seq_args passes --config, so swap it.
        args = tiny_seq_args(ASTRAI, data, cfg, out, 15, batch=GLOBAL_BATCH // ranks,
                             extra=("--val-batches", "2", *cmd_extra))
        i = args.index("--config")
        args[i:i + 2] = ["--model", base_model]
        r = run(mpi(ranks) + args, env=MPI_ENV, timeout=300)
        check(r.returncode == 0, f"LoRA on {ranks} ranks {' '.join(extra)} {r.stderr[-500:] if r.returncode else ''}")
        runs[name] = out
    w = "adapter_model.safetensors"
    identical(runs["lora2_shard"], runs["lora2"], "LoRA, 2 ranks: sharded vs not", w)
    identical(runs["lora2_shard_noov"], runs["lora2"], "LoRA, 2 ranks: sharded, not overlapped vs neither", w)
    identical(runs["lora4_shard"], runs["lora4"], "LoRA, 4 ranks: sharded vs not", w)
    # B starts at zero: every B trained away from it shows each rank's updated slice reached
    # rank 0 (which writes the adapter) through the all-gather.
    path = os.path.join(runs["lora4_shard"], w)
    if os.path.exists(path):
        ad = read_safetensors_f32(path)
        bs = [k for k in ad if "lora_B" in k]
        check(len(bs) == 14 and all(float(np.abs(ad[k]).max()) > 0 for k in bs),
              f"LoRA, 4 ranks sharded: all {len(bs)} B factors were updated (none left at zero)")


def one_process(tmp, data, cfg):
    a, b = os.path.join(tmp, "np1"), os.path.join(tmp, "np1_shard")
    train(1, data, cfg, a, steps=10)
    r = train(1, data, cfg, b, "--shard-optimizer", steps=10)
    identical(b, a, "1 process: --shard-optimizer vs not")
    check("no effect in a single process" in r.stderr, "1 process: the log says --shard-optimizer has no effect")


def main():
    if not MPIEXEC:
        print("skip: astrai was built without MPI (no MPI found by CMake)")
        sys.exit(SKIP)
    tmp = tempfile.mkdtemp(prefix="astrai_zero_test_")
    try:
        data, cfg = tiny_seq_setup(MAKE, tmp)
        base2, shard2 = two_ranks(tmp, data, cfg)
        four_ranks(tmp, data, cfg)
        resume(tmp, data, cfg, base2, shard2)
        lora(tmp, data, cfg, base2)
        one_process(tmp, data, cfg)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    finish()


if __name__ == "__main__":
    main()
