"""Helpers shared by the end-to-end `astrai train` tests: named checks collected into one
verdict, subprocess runs, metrics.jsonl, the fields that depend on the clock, and the tiny
seq run (config, synthetic data, arguments) the resume, MPI and dashboard tests train."""
import json
import os
import subprocess
import sys

failures = []
# Wall-clock fields of metrics.jsonl: they differ between otherwise identical runs.
TIMING = ("tokens_per_s", "step_seconds", "rollout_tokens_per_s", "rollout_seconds", "train_tokens_per_s")


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def run(args, **kw):
    return subprocess.run(args, capture_output=True, text=True, **kw)


def metrics(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(l) for l in f if l.strip()]


def without_timing(records):
    return [{k: v for k, v in r.items() if k not in TIMING} for r in records]


# The tiny llama of the seq-run tests (vocab 64: train_make_shards' data).
TINY_CONFIG = dict(model_type="llama", vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, intermediate_size=64, rms_norm_eps=1e-6, rope_theta=10000.0,
                   tie_word_embeddings=True, max_position_embeddings=128)


def tiny_seq_setup(make_shards, tmp):
    """Writes TMP/data (300 synthetic documents, train_make_shards) and TMP/config.json; returns both paths."""
    data, cfg = os.path.join(tmp, "data"), os.path.join(tmp, "config.json")
    r = run([make_shards, data, "300", "64"])
    assert r.returncode == 0, r.stderr
    with open(cfg, "w") as f:
        json.dump(TINY_CONFIG, f)
    return data, cfg


def tiny_seq_args(astrai, data, cfg, out, steps, batch=4, val_interval=10, extra=()):
    """`astrai train` of the tiny seq run: one thread, seed 7, 10% held out."""
    return [astrai, "train", "--train-type", "seq", "--data", data, "--config", cfg, "--output", out,
            "--batch-size", str(batch), "--seq-len", "32", "--max-steps", str(steps), "--max-lr", "3e-3",
            "--warmup-steps", "5", "--val-split", "0.1", "--val-interval", str(val_interval), "--threads", "1",
            "--no-progress", "--seed", "7", *extra]


def finish():
    print("FAILED: " + "; ".join(failures) if failures else "PASS")
    sys.exit(1 if failures else 0)
