#!/usr/bin/env python3
"""Data-parallel `mpirun -np N astrai train` on a tiny llama and a synthetic dataset:
1. 2 ranks of batch 2 and 4 ranks of batch 1 (oversubscribed) follow 1 rank of batch 4: loss,
   grad_norm and val_loss of every one of 50 updates, and the final weights, within 1e-6
   relative (weights: ||a - b|| / ||b|| per tensor; the largest element-wise difference is
   printed too, about 1e-6 of the tensor's largest weight); one metrics record per update (only
   rank 0 writes); comm_seconds and comm_bytes in the records;
   SFT, whose ranks count different numbers of targets, too (losses, 20 updates);
2. --deterministic-allreduce: two 4-rank runs give the same bits (metrics and weights), and
   match 1 rank within 1e-6;
3. a 2-rank checkpoint resumed by 4 ranks continues the 1-rank run (within 1e-6);
4. SIGTERM to one rank: every rank stops after the same update, rank 0 writes the checkpoint
   of that update, mpirun exits 0;
5. a rank stopped with SIGSTOP (alive but stalled): the others give up after
   --collective-timeout with an error naming it, and the job ends;
6. a rank killed with SIGKILL: the job ends with an error within the timeout.

usage: mpi_cli_test.py ASTRAI MAKE_SHARDS MPIEXEC   (MPIEXEC empty: astrai built without MPI; skipped)
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
from cli_checks import TINY_CONFIG, check, finish, metrics, run, tiny_seq_args, tiny_seq_setup, without_timing  # noqa: E402
from safetensors_np import read_safetensors_f32  # noqa: E402

SKIP = 77  # SKIP_RETURN_CODE in tests/train/CMakeLists.txt
ASTRAI, MAKE, MPIEXEC = sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else ""
STEPS = 50
GLOBAL_BATCH = 4
TOL = 1e-6
# Open MPI refuses root without these; no single-copy shared memory (ptrace is often barred in
# containers); the comm fields depend on the clock.
MPI_ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_btl_vader_single_copy_mechanism="none")
TIMING = ("comm_seconds", "comm_exposed_seconds")


def train_args(data, cfg, out, ranks, steps=STEPS, extra=()):
    return tiny_seq_args(ASTRAI, data, cfg, out, steps, batch=GLOBAL_BATCH // ranks,
                         extra=("--val-batches", "2", *extra))


def mpi(ranks):
    return [MPIEXEC, "-np", str(ranks), "--bind-to", "none"] + (["--oversubscribe"] if ranks > 2 else [])


def train(ranks, *args, **kw):
    cmd = train_args(*args[:3], ranks, *args[3:], **kw)
    if ranks == 1:
        return run(cmd)
    return run(mpi(ranks) + cmd, env=MPI_ENV, timeout=300)


def strip(records):
    return [{k: v for k, v in r.items() if k not in TIMING} for r in without_timing(records)]


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


def metrics_close(got, ref, what):
    """Every record's loss, grad_norm and val_loss within TOL relative; the same steps."""
    check([m["step"] for m in got] == [m["step"] for m in ref], f"{what}: one metrics record per update")
    worst = 0.0
    for g, r in zip(got, ref):
        for k in ("loss", "grad_norm", "val_loss"):
            if k in r:
                worst = max(worst, rel(g.get(k, float("inf")), r[k]))
    check(worst <= TOL, f"{what}: loss, grad_norm, val_loss within {TOL} relative (worst {worst:.2e})")


def weights_close(out, ref_out, what):
    a, b = read_safetensors_f32(os.path.join(out, "model.safetensors")), read_safetensors_f32(
        os.path.join(ref_out, "model.safetensors"))
    check(sorted(a) == sorted(b), f"{what}: same tensors")
    keys = [k for k in b if k in a]
    worst = max(float(np.linalg.norm(a[k] - b[k]) / max(float(np.linalg.norm(b[k])), 1e-30)) for k in keys)
    worst_max = max(float(np.max(np.abs(a[k] - b[k])) / max(float(np.max(np.abs(b[k]))), 1e-30)) for k in keys)
    check(worst <= TOL, f"{what}: final weights within {TOL} relative, ||a - b|| / ||b|| per tensor (worst "
          f"{worst:.2e}; max |a - b| / max |b|: {worst_max:.2e})")


def same_bytes(p, q):
    with open(p, "rb") as f, open(q, "rb") as g:
        return f.read() == g.read()


def rank_pids(mpirun_pid, want):
    """{rank: pid} of the astrai processes mpirun started (their OMPI_COMM_WORLD_RANK)."""
    found = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != mpirun_pid:
                continue
            with open(f"/proc/{d}/environ", "rb") as f:
                env = dict(e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e)
            if b"OMPI_COMM_WORLD_RANK" in env:
                found[int(env[b"OMPI_COMM_WORLD_RANK"])] = int(d)
        except (OSError, IndexError, ValueError):
            continue
    return found if len(found) == want else None


def start_long_run(data, cfg, out, ranks, extra=()):
    """mpirun in the background; returns (process, {rank: pid}) once 3 updates are recorded."""
    p = subprocess.Popen(mpi(ranks) + train_args(data, cfg, out, ranks, 100000, extra), env=MPI_ENV,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    mfile = os.path.join(out, "metrics.jsonl")
    deadline = time.time() + 120
    while time.time() < deadline and p.poll() is None:
        if os.path.exists(mfile) and sum(1 for _ in open(mfile)) >= 3:
            pids = rank_pids(p.pid, ranks)
            if pids:
                return p, pids
        time.sleep(0.01)
    p.kill()
    out_s, err_s = p.communicate()
    raise RuntimeError(f"the long run did not start: {err_s[-600:]}")


def exactness(tmp, data, cfg):
    ref = os.path.join(tmp, "ref1")
    t = time.time()
    r = train(1, data, cfg, ref)
    check(r.returncode == 0, f"1 rank, batch 4 ({time.time() - t:.1f} s) {r.stderr[-300:]}")
    m_ref = metrics(ref)
    check(m_ref[-1]["loss"] < m_ref[0]["loss"] - 0.5, "the loss goes down")
    for ranks in (2, 4):
        out = os.path.join(tmp, f"ref{ranks}")
        t = time.time()
        r = train(ranks, data, cfg, out)
        check(r.returncode == 0, f"mpirun -np {ranks}, batch {GLOBAL_BATCH // ranks} ({time.time() - t:.1f} s) "
              f"{r.stderr[-600:]}")
        if r.returncode != 0:
            continue
        m = metrics(out)
        metrics_close(m, m_ref, f"{ranks} ranks vs 1")
        weights_close(out, ref, f"{ranks} ranks vs 1")
        check(all(x.get("comm_bytes", 0) > 0 and x.get("comm_seconds", -1) >= 0 for x in m),
              f"{ranks} ranks: comm_seconds and comm_bytes in every record")
        check(r.stdout.count("done after") == 1, f"{ranks} ranks: one summary line (rank 0)")
        check(sorted(os.listdir(os.path.join(out, "checkpoints"))) == [f"step-{STEPS:08d}"],
              f"{ranks} ranks: one checkpoint, no temporary directories")
    return ref


def sft_uneven_targets(tmp):
    """SFT: masked prompts leave ranks with different target counts in a micro-batch; the
    gradients are weighted by each rank's share, so 4 ranks still follow 1 (a plain mean of the
    ranks' losses would not)."""
    rng = np.random.default_rng(5)
    words = [f"w{i}" for i in range(40)]
    jsonl, corpus, cfg = (os.path.join(tmp, f) for f in ("inst.jsonl", "corpus.txt", "sft_config.json"))
    with open(jsonl, "w") as f, open(corpus, "w") as c:
        for _ in range(120):
            prompt = " ".join(rng.choice(words, rng.integers(3, 20)))
            response = " ".join(rng.choice(words, rng.integers(1, 12)))
            f.write(json.dumps({"prompt": prompt, "response": response}) + "\n")
            c.write(prompt + " " + response + "\n")
    tok, data = os.path.join(tmp, "tok"), os.path.join(tmp, "sft_data")
    assert run([ASTRAI, "tokenizer", "train", "--input", corpus, "--vocab-size", "300", "--output", tok]).returncode == 0
    vocab = len(json.load(open(os.path.join(tok, "tokenizer.json")))["model"]["vocab"])
    json.dump(dict(TINY_CONFIG, vocab_size=vocab), open(cfg, "w"))
    r = run([ASTRAI, "preprocess", "--tokenizer", tok, "--input", jsonl, "--output", data, "--seq-len", "32",
             "--quiet"])
    assert r.returncode == 0, r.stderr
    extra = ["--train-type", "sft", "--tokenizer", tok, "--max-steps", "20"]
    outs = {n: os.path.join(tmp, f"sft{n}") for n in (1, 4)}
    for n, out in outs.items():
        r = train(n, data, cfg, out, extra=extra)
        check(r.returncode == 0, f"sft on {n} rank(s) {r.stderr[-300:]}")
    if all(os.path.exists(os.path.join(o, "metrics.jsonl")) for o in outs.values()):
        metrics_close(metrics(outs[4]), metrics(outs[1]), "sft (uneven target counts): 4 ranks vs 1")


def determinism(tmp, data, cfg, ref):
    outs = []
    for i in range(2):
        out = os.path.join(tmp, f"det{i}")
        r = train(4, data, cfg, out, extra=["--deterministic-allreduce"])
        check(r.returncode == 0, f"4 ranks --deterministic-allreduce run {i + 1} {r.stderr[-600:]}")
        outs.append(out)
    if not all(os.path.exists(os.path.join(o, "model.safetensors")) for o in outs):
        return
    metrics_close(metrics(outs[0]), metrics(ref), "deterministic 4 ranks vs 1")
    check(strip(metrics(outs[0])) == strip(metrics(outs[1])), "deterministic reruns: the same metrics, bit for bit")
    check(same_bytes(*(os.path.join(o, "model.safetensors") for o in outs)), "deterministic reruns: the same weights")


def resume_other_rank_count(tmp, data, cfg, ref):
    out = os.path.join(tmp, "resume")
    r = train(2, data, cfg, out, extra=["--ckpt-interval", "20"])
    check(r.returncode == 0, f"2 ranks with checkpoints {r.stderr[-300:]}")
    for d in ("step-00000040", f"step-{STEPS:08d}"):  # lose the tail
        shutil.rmtree(os.path.join(out, "checkpoints", d), ignore_errors=True)
    r = train(4, data, cfg, out, extra=["--ckpt-interval", "20", "--resume"])
    check(r.returncode == 0, f"4 ranks resume a 2-rank checkpoint {r.stderr[-600:]}")
    if r.returncode == 0:
        metrics_close(metrics(out), metrics(ref), "2 ranks, then 4 from step 20, vs 1")
        weights_close(out, ref, "2 ranks, then 4 from step 20, vs 1")
    r = train(1, data, cfg, out, extra=["--resume", "--batch-size", "3"])
    check(r.returncode != 0 and "global batch" in r.stderr, f"another global batch is a clear error: "
          f"{r.stderr.strip()[-200:]}")


def sigterm_one_rank(tmp, data, cfg):
    out = os.path.join(tmp, "term")
    p, pids = start_long_run(data, cfg, out, 2)
    os.kill(pids[1], signal.SIGTERM)
    try:
        so, se = p.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        p.kill()
        so, se = p.communicate()
    done = len(metrics(out))
    check(p.returncode == 0 and so.count("stopped after") == 1 and "stopped by signal" in se,
          f"SIGTERM to rank 1: all ranks stop, exit 0 (rc {p.returncode}) {se[-400:]}")
    cks = sorted(os.listdir(os.path.join(out, "checkpoints")))
    check(cks == [f"step-{done:08d}"], f"the checkpoint of the last recorded update ({cks}, {done} records)")
    if cks:
        st = json.load(open(os.path.join(out, "checkpoints", cks[-1], "trainer_state.json")))
        check(st["step"] == done, "its trainer_state holds that step")


def dead_rank(tmp, data, cfg, sig, name):
    timeout = 5
    out = os.path.join(tmp, f"dead_{name}")
    p, pids = start_long_run(data, cfg, out, 2, ["--collective-timeout", str(timeout)])
    t = time.time()
    os.kill(pids[1], sig)
    try:
        so, se = p.communicate(timeout=timeout + 60)
    except subprocess.TimeoutExpired:
        p.kill()
        so, se = p.communicate()
    finally:
        for pid in pids.values():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    took = time.time() - t
    if sig == signal.SIGSTOP:  # alive but silent: only our deadline ends the wait
        clear = "did not complete within --collective-timeout" in se
    else:  # the launcher may notice first
        clear = "did not complete within --collective-timeout" in se or "signal 9" in se or "Killed" in se
    check(p.returncode != 0 and clear, f"{name} on rank 1: the job fails with a clear error (rc {p.returncode}): "
          f"{se.strip()[-300:]}")
    check(took < timeout + 30, f"{name} on rank 1: the job ended {took:.1f} s later (timeout {timeout} s)")


def main():
    if not MPIEXEC:
        print("skip: astrai was built without MPI (no MPI found by CMake), so there is no data-parallel training")
        sys.exit(SKIP)
    tmp = tempfile.mkdtemp(prefix="astrai_mpi_test_")
    try:
        data, cfg = tiny_seq_setup(MAKE, tmp)
        ref = exactness(tmp, data, cfg)
        sft_uneven_targets(tmp)
        determinism(tmp, data, cfg, ref)
        resume_other_rank_count(tmp, data, cfg, ref)
        sigterm_one_rank(tmp, data, cfg)
        dead_rank(tmp, data, cfg, signal.SIGSTOP, "SIGSTOP")
        dead_rank(tmp, data, cfg, signal.SIGKILL, "SIGKILL")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    finish()


if __name__ == "__main__":
    main()
