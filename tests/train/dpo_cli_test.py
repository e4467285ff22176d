#!/usr/bin/env python3
"""End-to-end `astrai train --train-type dpo` on synthetic preference pairs
(scripts/synthetic_pairs.py) with a tokenizer trained here:
1. preprocess makes a preference dataset; DPO trains on it with validation;
2. the first update's loss is log 2 (policy == reference, so every pair has h = 0);
3. metrics.jsonl has the rewards (chosen, rejected, margin, accuracy), also for validation;
   the margin grows over several epochs of the same pairs;
4. a resume after a lost tail reproduces the uninterrupted run exactly (the reference policy
   is rebuilt from the same start);
5. IPO and conservative DPO run; wrong dataset kinds, flags of the wrong loss and a changed
   --dpo-beta on resume are clear errors.

usage: dpo_cli_test.py ASTRAI SYNTHETIC_PAIRS_SCRIPT
"""
import json
import math
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cli_checks import check, finish, metrics, run, without_timing  # noqa: E402

ASTRAI, PAIRS = sys.argv[1], sys.argv[2]


def main():
    tmp = tempfile.mkdtemp(prefix="astrai_dpo_test_")
    try:
        pairs, corpus = os.path.join(tmp, "pairs.jsonl"), os.path.join(tmp, "corpus.txt")
        r = run([sys.executable, PAIRS, "--pairs", "64", "--seed", "3", "--output", pairs, "--corpus", corpus])
        assert r.returncode == 0, r.stderr
        tok = os.path.join(tmp, "tok")
        r = run([ASTRAI, "tokenizer", "train", "--input", corpus, "--vocab-size", "300", "--output", tok])
        assert r.returncode == 0, r.stderr
        vocab = len(json.load(open(os.path.join(tok, "tokenizer.json")))["model"]["vocab"])
        data = os.path.join(tmp, "data")
        r = run([ASTRAI, "preprocess", "--tokenizer", tok, "--input", pairs, "--output", data, "--quiet"])
        check(r.returncode == 0, f"preprocess writes a preference dataset ({r.stderr[-300:]})")
        check(json.load(open(os.path.join(data, "meta.json")))["kind"] == "preference", "dataset kind is preference")
        cfg = os.path.join(tmp, "config.json")
        json.dump(dict(model_type="llama", vocab_size=vocab, hidden_size=48, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, intermediate_size=96, rms_norm_eps=1e-6,
                       rope_theta=10000.0, tie_word_embeddings=True, max_position_embeddings=128), open(cfg, "w"))

        def train(out, steps, *extra):
            return run([ASTRAI, "train", "--train-type", "dpo", "--data", data, "--config", cfg, "--output", out,
                        "--batch-size", "8", "--seq-len", "96", "--max-steps", str(steps), "--max-lr", "3e-3",
                        "--warmup-steps", "2", "--val-split", "0.25", "--val-interval", "10", "--threads", "1",
                        "--no-progress", "--seed", "5", *extra])

        ref = os.path.join(tmp, "ref")
        r = train(ref, 30, "--ckpt-interval", "10", "--dpo-beta", "0.5")
        check(r.returncode == 0, f"dpo training succeeds ({r.stderr[-400:]})")
        m = metrics(ref)
        check(len(m) == 30, "one metrics record per update")
        keys = ("rewards_chosen", "rewards_rejected", "rewards_margin", "rewards_accuracy")
        check(all(k in m[0] for k in keys), "rewards in metrics.jsonl")
        check(all("val_" + k in m[9] for k in ("loss",) + keys), "validation rewards every --val-interval")
        check(abs(m[0]["loss"] - math.log(2)) < 1e-6 and m[0]["rewards_margin"] == 0.0,
              f"first update: policy == reference, loss log 2 ({m[0]['loss']:.8f})")
        first = sum(x["rewards_margin"] for x in m[:5]) / 5
        last = sum(x["rewards_margin"] for x in m[-5:]) / 5
        check(last > first and last > 0, f"reward margin grows ({first:.4f} -> {last:.4f})")
        check(m[-1]["loss"] < math.log(2), f"loss below log 2 at the end ({m[-1]['loss']:.4f})")

        lost = os.path.join(tmp, "lost")
        shutil.copytree(ref, lost)
        for d in ("step-00000020", "step-00000030"):
            shutil.rmtree(os.path.join(lost, "checkpoints", d))
        r = train(lost, 30, "--ckpt-interval", "10", "--dpo-beta", "0.5", "--resume")
        check(r.returncode == 0, f"resume succeeds ({r.stderr[-300:]})")
        strip = without_timing
        check(strip(metrics(lost)) == strip(m), "resumed DPO run reproduces every update's loss and rewards exactly")
        r = train(lost, 40, "--ckpt-interval", "10", "--dpo-beta", "0.2", "--resume")
        check(r.returncode != 0 and "--dpo-beta was 0.5, now 0.2" in r.stderr, f"changed --dpo-beta on resume is an error: {r.stderr.strip()[-160:]}")

        r = train(os.path.join(tmp, "ipo"), 6, "--dpo-loss", "ipo")
        check(r.returncode == 0 and "rewards_margin" in metrics(os.path.join(tmp, "ipo"))[-1], "ipo trains")
        r = train(os.path.join(tmp, "cdpo"), 6, "--dpo-label-smoothing", "0.1")
        check(r.returncode == 0, "conservative dpo trains")
        r = train(os.path.join(tmp, "bad1"), 3, "--dpo-loss", "ipo", "--dpo-label-smoothing", "0.1")
        check(r.returncode != 0 and "sigmoid" in r.stderr, f"ipo + --dpo-label-smoothing: {r.stderr.strip()[-160:]}")
        r = train(os.path.join(tmp, "bad2"), 3, "--label-smoothing", "0.1")
        check(r.returncode != 0 and "--dpo-label-smoothing" in r.stderr, f"--label-smoothing with dpo: {r.stderr.strip()[-160:]}")
        r = train(os.path.join(tmp, "bad3"), 3, "--dpo-beta", "0")
        check(r.returncode != 0 and "--dpo-beta" in r.stderr, f"--dpo-beta 0: {r.stderr.strip()[-160:]}")

        # Dataset kinds that do not match the train type.
        r = run([ASTRAI, "train", "--train-type", "sft", "--data", data, "--config", cfg, "--output",
                 os.path.join(tmp, "bad4"), "--max-steps", "2", "--no-progress"])
        check(r.returncode != 0 and "--train-type dpo" in r.stderr, f"sft on preference pairs: {r.stderr.strip()[-200:]}")
        lm = os.path.join(tmp, "lm")
        assert run([ASTRAI, "preprocess", "--tokenizer", tok, "--input", corpus, "--format", "text",
                    "--output", lm, "--quiet"]).returncode == 0
        r = train(os.path.join(tmp, "bad5"), 2)
        r = run([ASTRAI, "train", "--train-type", "dpo", "--data", lm, "--config", cfg, "--output",
                 os.path.join(tmp, "bad5"), "--max-steps", "2", "--no-progress"])
        check(r.returncode != 0 and "preference pairs" in r.stderr, f"dpo on an lm dataset: {r.stderr.strip()[-200:]}")
        # Prompts longer than --seq-len leave no response to compare.
        r = train(os.path.join(tmp, "bad6"), 2, "--seq-len", "4")
        check(r.returncode != 0 and "raise --seq-len" in r.stderr, f"pairs without a response in the window: {r.stderr.strip()[-200:]}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    finish()


if __name__ == "__main__":
    main()
