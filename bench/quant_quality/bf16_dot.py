#!/usr/bin/python3
"""What the bf16-dot mode (--bf16-dot) costs in quality, next to plain bf16 weights.

For a trained f32 checkpoint (bench/quant_quality/prepare.sh makes one): its bf16 copy (every
weight rounded to nearest even) run by our engine twice, with bf16 widened exactly (the default)
and with ASTRAI_BF16_DOT=1 (the activations rounded to bf16 before each product, as llama.cpp
computes bf16 weights on CPUs with AVX512_BF16). For each, and for the f32 model:
  * perplexity of the held-out text, `astrai eval perplexity --context CTX --stride CTX/2`;
  * on the text cut into CTX-token chunks (`astrai tokenize`), `astrai score` at the second half
    of each chunk, as llama-perplexity scores (run.py): mean and 99th-percentile KL divergence to
    the f32 model's next-token distributions, and how often the most likely token is the same.
Prints a Markdown table and writes OUT/results.json.

    bench/quant_quality/bf16_dot.py --model runs/quality/model --text runs/quality/eval.txt
        [--ctx 128] [--threads 2] [--astrai build/release/src/astrai] [--out build/quant_quality_bf16]
"""
import argparse
import json
import os
import shutil
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "bench", "llamacpp"))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from compare import cpu_model, to_bf16_bits  # noqa: E402
from run import kl_stats, log, our_logprobs, our_perplexity, run, target_ppl  # noqa: E402
from safetensors_np import read_safetensors, write_safetensors  # noqa: E402


def write_bf16_copy(model_dir, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    weights = read_safetensors(os.path.join(model_dir, "model.safetensors"), dtypes=("F32",))
    write_safetensors(os.path.join(out_dir, "model.safetensors"),
                      [(n, "BF16", a.shape, to_bf16_bits(a).tobytes()) for n, a in weights.items()])
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    cfg["torch_dtype"] = "bfloat16"
    json.dump(cfg, open(os.path.join(out_dir, "config.json"), "w"), indent=1)
    for f in os.listdir(model_dir):
        if f.startswith("tokenizer"):
            shutil.copy(os.path.join(model_dir, f), out_dir)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="trained f32 checkpoint directory")
    ap.add_argument("--text", required=True, help="held-out text")
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--astrai", default=os.path.join(ROOT, "build", "release", "src", "astrai"))
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "quant_quality_bf16"))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    bf16_dir = os.path.join(a.out, "model-bf16")
    write_bf16_copy(a.model, bf16_dir)
    out = run([a.astrai, "tokenize", "--tokenizer", a.model, "--file", a.text, "--json", "--no-special"]).stdout
    ids = json.loads(next(line for line in reversed(out.splitlines()) if line.startswith("{")))["ids"]
    n_chunk = len(ids) // a.ctx
    tokens = np.array(ids[:n_chunk * a.ctx], dtype=np.int64).reshape(n_chunk, a.ctx)
    log(f"{len(ids)} tokens, {n_chunk} chunks of {a.ctx}")
    rows = []
    base = None
    for label, model_dir, dot in (("f32", a.model, "0"), ("bf16", bf16_dir, "0"), ("bf16 --bf16-dot", bf16_dir, "1")):
        os.environ["ASTRAI_BF16_DOT"] = dot
        lp = our_logprobs(a, model_dir, tokens)
        row = {"weights": label, "eval_ppl": our_perplexity(a, model_dir)["ppl"], "chunk_ppl": target_ppl(lp, tokens)}
        if base is None:
            base = lp
        else:
            row.update(kl_stats(base, lp))
        rows.append(row)
        log(json.dumps(row))
    json.dump({"cpu": cpu_model(), "ctx": a.ctx, "chunks": n_chunk, "rows": rows},
              open(os.path.join(a.out, "results.json"), "w"), indent=1)
    print("| weights | PPL (eval perplexity) | PPL (chunks) | mean KL to f32 | 99% KL | same top token |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        kl = (f"{r['kld']:.2e} ± {r['kld_err']:.1e} | {r['kld_p99']:.2e} | {r['same_top']:.2f} ± {r['same_top_err']:.2f}%"
              if "kld" in r else "| |")
        print(f"| {r['weights']} | {r['eval_ppl']:.3f} | {r['chunk_ppl']:.3f} | {kl} |")


if __name__ == "__main__":
    main()
