#!/usr/bin/env python3
"""End-to-end LoRA training (`astrai train --lora-rank`), on synthetic SFT data:
1. the output and every checkpoint are adapter directories in the PEFT layout (with
   base_model_name_or_path), and the base model's files are untouched;
2. the loss goes down and the first update equals the base model's loss (B starts at zero);
3. a resume after a lost tail reproduces the uninterrupted run exactly;
4. `--lora` on score and `astrai lora merge` load the trained adapter (same bits both ways),
   and the adapter changes the base model's scores;
5. DPO with LoRA starts at loss log 2 (the reference is the base); wrong LoRA flags and a
   changed rank on resume are clear errors.

usage: lora_cli_test.py ASTRAI SYNTHETIC_PAIRS_SCRIPT
"""
import hashlib
import json
import math
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cli_checks import check, finish, metrics, run, without_timing  # noqa: E402

ASTRAI, PAIRS = sys.argv[1], sys.argv[2]


def digest(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def main():
    tmp = tempfile.mkdtemp(prefix="astrai_lora_test_")
    try:
        pairs, sft, corpus = (os.path.join(tmp, f) for f in ("pairs.jsonl", "sft.jsonl", "corpus.txt"))
        assert run([sys.executable, PAIRS, "--pairs", "400", "--seed", "6", "--output", pairs, "--sft", sft,
                    "--corpus", corpus]).returncode == 0
        tok = os.path.join(tmp, "tok")
        assert run([ASTRAI, "tokenizer", "train", "--input", corpus, "--vocab-size", "300", "--special-tokens",
                    "<|endoftext|>", "--output", tok]).returncode == 0
        vocab = len(json.load(open(os.path.join(tok, "tokenizer.json")))["model"]["vocab"]) + 1
        data, prefs = os.path.join(tmp, "sft"), os.path.join(tmp, "prefs")
        assert run([ASTRAI, "preprocess", "--tokenizer", tok, "--input", sft, "--output", data, "--no-chat-template",
                    "--add-eos", "--seq-len", "64", "--quiet"]).returncode == 0
        assert run([ASTRAI, "preprocess", "--tokenizer", tok, "--input", pairs, "--output", prefs,
                    "--no-chat-template", "--add-eos", "--quiet"]).returncode == 0
        cfg = os.path.join(tmp, "config.json")
        json.dump(dict(model_type="llama", vocab_size=vocab, hidden_size=32, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, intermediate_size=64, rms_norm_eps=1e-6,
                       rope_theta=10000.0, tie_word_embeddings=True, max_position_embeddings=128), open(cfg, "w"))
        base = os.path.join(tmp, "base")
        r = run([ASTRAI, "train", "--train-type", "sft", "--data", data, "--config", cfg, "--tokenizer", tok,
                 "--output", base, "--batch-size", "8", "--seq-len", "64", "--max-steps", "10", "--max-lr", "3e-3",
                 "--warmup-steps", "1", "--threads", "1", "--no-progress"])
        assert r.returncode == 0, r.stderr
        base_digest = digest(os.path.join(base, "model.safetensors"))

        def train(out, steps, *extra, train_type="sft", data_dir=data):
            return run([ASTRAI, "train", "--train-type", train_type, "--data", data_dir, "--model", base,
                        "--output", out, "--batch-size", "8", "--seq-len", "64", "--max-steps", str(steps),
                        "--max-lr", "3e-3", "--warmup-steps", "1", "--threads", "1", "--no-progress",
                        "--seed", "3", *extra])

        ref = os.path.join(tmp, "ref")
        r = train(ref, 20, "--lora-rank", "4", "--lora-alpha", "8", "--ckpt-interval", "10", "--val-split", "0.1",
                  "--val-interval", "10")
        check(r.returncode == 0 and "trainable parameters" in r.stderr, f"LoRA training succeeds ({r.stderr[-300:]})")
        files = sorted(os.listdir(ref))
        check({"adapter_config.json", "adapter_model.safetensors", "tokenizer.json"} <= set(files)
              and "model.safetensors" not in files, f"the output is an adapter directory ({files})")
        ac = json.load(open(os.path.join(ref, "adapter_config.json")))
        check(ac["r"] == 4 and ac["lora_alpha"] == 8 and ac["base_model_name_or_path"] == os.path.abspath(base)
              and "q_proj" in ac["target_modules"], "adapter_config.json names rank, alpha, targets and the base")
        check(os.path.exists(os.path.join(ref, "checkpoints", "step-00000010", "adapter_model.safetensors")),
              "checkpoints hold the adapter")
        check(digest(os.path.join(base, "model.safetensors")) == base_digest, "the base model is untouched")
        m = metrics(ref)
        check(m[-1]["loss"] < m[0]["loss"], f"loss goes down ({m[0]['loss']:.4f} -> {m[-1]['loss']:.4f})")
        full = os.path.join(tmp, "full")
        assert train(full, 1, "--val-split", "0.1").returncode == 0
        check(metrics(full)[0]["loss"] == m[0]["loss"], "first update's loss is the base model's (B = 0)")

        lost = os.path.join(tmp, "lost")
        shutil.copytree(ref, lost)
        shutil.rmtree(os.path.join(lost, "checkpoints", "step-00000020"))
        r = train(lost, 20, "--lora-rank", "4", "--lora-alpha", "8", "--ckpt-interval", "10", "--val-split", "0.1",
                  "--val-interval", "10", "--resume")
        check(r.returncode == 0 and without_timing(metrics(lost)) == without_timing(m),
              f"resumed LoRA run reproduces every update ({r.stderr[-200:]})")
        r = train(lost, 30, "--lora-rank", "8", "--lora-alpha", "8", "--resume")
        check(r.returncode != 0 and "--lora-rank was 4, now 8" in r.stderr, f"changed rank on resume: {r.stderr.strip()[-150:]}")

        ids = ",".join(str(i) for i in range(5, 40))
        score = lambda *a: run([ASTRAI, "score", "--ids", ids, "--json", *a])
        with_lora = score("--model", base, "--lora", ref)
        plain = score("--model", base)
        merged = os.path.join(tmp, "merged")
        r = run([ASTRAI, "lora", "merge", "--model", base, "--lora", ref, "--output", merged])
        check(r.returncode == 0 and with_lora.returncode == 0, f"adapter loads ({with_lora.stderr[-200:]}{r.stderr[-200:]})")
        check(score("--model", merged).stdout == with_lora.stdout, "lora merge and --lora score the same bits")
        check(plain.stdout != with_lora.stdout, "the trained adapter changes the model")

        dpo = os.path.join(tmp, "dpo")
        r = train(dpo, 3, "--lora-rank", "4", train_type="dpo", data_dir=prefs)
        check(r.returncode == 0 and abs(metrics(dpo)[0]["loss"] - math.log(2)) < 1e-6,
              f"DPO with LoRA starts at log 2 ({r.stderr[-200:]})")

        # Dropout on the adapters' input: the masks follow the seed and the update, so a
        # resumed run draws the same ones; it changes the updates (not the first loss: B = 0).
        drop = os.path.join(tmp, "drop")
        r = train(drop, 4, "--lora-rank", "4", "--lora-alpha", "8", "--lora-dropout", "0.3", "--ckpt-interval", "2",
                  "--val-split", "0.1")
        check(r.returncode == 0, f"LoRA with dropout trains ({r.stderr[-200:]})")
        md = metrics(drop)
        check(md[0]["loss"] == m[0]["loss"] and md[1]["loss"] != m[1]["loss"],
              f"dropout leaves the first loss and changes the next ({md[0]['loss']}, {md[1]['loss']} vs "
              f"{m[0]['loss']}, {m[1]['loss']})")
        check(json.load(open(os.path.join(drop, "adapter_config.json")))["lora_dropout"] == 0.3,
              "adapter_config.json records lora_dropout")
        drop2 = os.path.join(tmp, "drop2")
        shutil.copytree(drop, drop2)
        shutil.rmtree(os.path.join(drop2, "checkpoints", "step-00000004"))
        r = train(drop2, 4, "--lora-rank", "4", "--lora-alpha", "8", "--lora-dropout", "0.3", "--ckpt-interval", "2",
                  "--val-split", "0.1", "--resume")
        check(r.returncode == 0 and without_timing(metrics(drop2)) == without_timing(md),
              f"a resumed run with dropout draws the same masks ({r.stderr[-200:]})")
        for bad in ("1", "-0.1"):
            r = train(os.path.join(tmp, "bad1"), 2, "--lora-rank", "4", "--lora-dropout", bad)
            check(r.returncode != 0 and "--lora-dropout must be in [0, 1)" in r.stderr,
                  f"--lora-dropout {bad}: {r.stderr.strip()[-150:]}")
        r = train(os.path.join(tmp, "bad1"), 2, "--lora-dropout", "0.1")
        check(r.returncode != 0 and "give --lora-rank too" in r.stderr, f"dropout without LoRA: {r.stderr.strip()[-150:]}")
        r = train(os.path.join(tmp, "bad2"), 2, "--lora-rank", "4", "--lora-targets", "q,x")
        check(r.returncode != 0 and "\"x\"" in r.stderr, f"unknown target: {r.stderr.strip()[-150:]}")
        r = train(os.path.join(tmp, "bad3"), 2, "--lora-rank", "-1")
        check(r.returncode != 0 and "--lora-rank" in r.stderr, f"negative rank: {r.stderr.strip()[-150:]}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    finish()


if __name__ == "__main__":
    main()
