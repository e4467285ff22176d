"""Helpers shared by the end-to-end `astrai train` tests: named checks collected into one
verdict, subprocess runs, metrics.jsonl, and the fields that depend on the clock."""
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


def finish():
    print("FAILED: " + "; ".join(failures) if failures else "PASS")
    sys.exit(1 if failures else 0)
