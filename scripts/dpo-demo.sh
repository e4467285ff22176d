#!/usr/bin/env bash
# DPO learning demo (docs/training.md, "DPO demo"): on synthetic preference pairs whose chosen
# answer repeats the prompt's last word (scripts/synthetic_pairs.py), a small model is first
# pretrained on text holding both kinds of answers (so it knows the format but has no
# preference), then tuned with DPO; the held-out pairs' reward margin and accuracy rise.
# A few minutes on 2 cores. Environment: ASTRAI_DPO_DEMO_DIR (default runs/dpo-demo),
# ASTRAI_JOBS (build parallelism). Needs a release build or builds `astrai`.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
work=${ASTRAI_DPO_DEMO_DIR:-$root/runs/dpo-demo}
[ -x build/release/src/astrai ] || cmake --preset release -DASTRAI_BUILD_TESTS=OFF -DASTRAI_BUILD_BENCH=OFF
cmake --build build/release --target astrai -j "${ASTRAI_JOBS:-$(nproc)}"
astrai=$root/build/release/src/astrai
rm -rf "$work" && mkdir -p "$work"

/usr/bin/python3 scripts/synthetic_pairs.py --pairs 3000 --seed 1 --output "$work/pairs.jsonl" --corpus "$work/corpus.txt"
"$astrai" tokenizer train --input "$work/corpus.txt" --vocab-size 512 --special-tokens "<|endoftext|>" --output "$work/tok"
"$astrai" preprocess --tokenizer "$work/tok" --input "$work/corpus.txt" --format text --text-split line \
  --output "$work/text" --seq-len 128 --add-eos --quiet
"$astrai" preprocess --tokenizer "$work/tok" --input "$work/pairs.jsonl" --output "$work/pairs" --quiet
cat > "$work/config.json" <<'JSON'
{"model_type": "llama", "vocab_size": 512, "hidden_size": 128, "intermediate_size": 344,
 "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4,
 "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": true, "max_position_embeddings": 256}
JSON
# 1. Pretraining on prompts followed by either answer: the format, not the preference.
"$astrai" train --train-type seq --data "$work/text" --config "$work/config.json" --tokenizer "$work/tok" \
  --output "$work/base" --batch-size 16 --seq-len 128 --max-steps 300 --max-lr 3e-3 --warmup-steps 30 --no-progress
# 2. DPO from the pretrained weights (also the reference policy), 10% of the pairs held out.
"$astrai" train --train-type dpo --data "$work/pairs" --model "$work/base" --tokenizer "$work/tok" \
  --output "$work/dpo" --batch-size 16 --seq-len 64 --max-steps 150 --max-lr 3e-4 --warmup-steps 10 \
  --dpo-beta 0.1 --val-split 0.1 --val-interval 25 --val-batches 20 --no-progress
/usr/bin/python3 - "$work/dpo/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print("| update | train loss | held-out loss | held-out reward margin | held-out accuracy |")
print("|---|---|---|---|---|")
for r in rows:
    if "val_loss" in r:
        print(f"| {r['step']} | {r['loss']:.4f} | {r['val_loss']:.4f} | {r['val_rewards_margin']:.3f} | {r['val_rewards_accuracy']:.3f} |")
PY
