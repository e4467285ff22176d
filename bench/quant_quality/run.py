#!/usr/bin/python3
"""Quality of our weight quantizers next to llama.cpp's, on one trained model and one text.

For a trained f32 Llama checkpoint (our HF layout, a byte-level BPE tokenizer.json):
  1. writes it as GGUF (f32) with its real tokenizer in the metadata (tokenizer.ggml.model gpt2,
     tokens, merges, token types, the llama.cpp pre-tokenizer whose regex is the tokenizer's), so
     llama.cpp tokenizes the text into the ids we do (checked: the ids llama-perplexity saves with
     the base logits are compared with `astrai tokenize`);
  2. for each format in --formats: `astrai quantize --type FMT` and those exact blocks written
     into GGUF (Q and K rows permuted whole, as llama.cpp's converter does, so blocks stay
     intact); a format `astrai quantize` rejects is skipped with a note;
  3. the f32 GGUF quantized by `llama-quantize --pure` to the same type (every matrix, the tied
     embedding too), and, as extra rows, by llama-quantize's default mixtures (--mixtures; also
     --pure with only the token embedding, which is also the output matrix when tied, kept wider);
  4. `llama-perplexity -f TEXT -c CTX --kl-divergence-base` on the f32 GGUF, then
     `--kl-divergence` on each quantized GGUF (same threads, context, f32 KV cache): perplexity,
     mean KL divergence to the f32 model's next-token distribution, same top token %
     (llama-perplexity runs with exit_delay.c preloaded: its logger can drop the closing
     statistics at exit on a busy machine);
  5. `astrai eval perplexity --context CTX --stride CTX/2` on our f32 and quantized checkpoints
     (our engine, its quantized weights times --activations, q8 by default as in the engine), as
     a cross-check; and `astrai score` on llama-perplexity's
     chunks: our f32 model's log-probabilities against those llama.cpp stored for its f32 model
     (the GGUF conversion check), our quantized models' perplexity of the same tokens and mean KL
     and same top token against our f32;
  6. whether our GGUF and llama-quantize --pure's hold the same bytes, tensor by tensor.
Prints a Markdown table and writes everything as JSON (OUT/results.json).

    bench/quant_quality/run.py --model runs/quality/model --llama-bin build/llamacpp/build/bin \\
        --text runs/quality/eval.txt [--formats q8_0,q4_0,q4_k] [--mixtures Q4_0,Q4_K_M,Q4_0:embd=Q8_0]
        [--ctx 128] [--threads 2] [--astrai build/release/src/astrai] [--out build/quant_quality]
        [--activations q8|f32]

llama-perplexity scores the second half of each non-overlapping CTX-token chunk (tokens with
CTX/2+1 to CTX-1 tokens of context, about half the text); `astrai eval perplexity` with stride
CTX/2 scores every token once, past the first window with CTX/2 to CTX-1 tokens of context, and
runs our kernels (llama.cpp also rounds activations to 8 bits for quantized weights, in its own
way: f16 scales, per 256 for k-quants), so the two perplexities are close, not equal. Our formats' GGUF rows and llama-quantize --pure's
share one llama-perplexity run when their tensors are byte-identical (the same numbers follow).
Needs: numpy, llama.cpp's source tree next to its build (gguf-py: --llama-src, default
LLAMA_BIN/../../src).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, os.path.join(ROOT, "bench", "llamacpp"))
from compare import cpu_model, write_gguf  # noqa: E402
from safetensors_np import read_safetensors  # noqa: E402

# our --type -> (the GGML type of our checkpoint's U8 matrices, a llama-quantize type whose --pure
# run gives every matrix that type, which is also the GGUF file type we record)
FORMATS = {"q8_0": ("Q8_0", "Q8_0"), "q4_0": ("Q4_0", "Q4_0"), "q4_k": ("Q4_K", "Q4_K_S"), "q5_k": ("Q5_K", "Q5_K_S"),
           "q6_k": ("Q6_K", "Q6_K")}
# llama.cpp's pre-tokenizer names (tokenizer.ggml.pre) for the split regexes of byte-level BPE
# tokenizers, as llama.cpp's src/llama-vocab.cpp pairs them.
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_TOKENIZERS = {QWEN2_SPLIT: "qwen2"}


def log(*a):
    print("quant_quality:", *a, file=sys.stderr, flush=True)


def run(cmd, check=True, env=None):
    log(" ".join(cmd))
    t = time.time()
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    if check and r.returncode != 0:
        sys.exit(f"quant_quality: {cmd[0]} failed ({r.returncode}):\n{r.stdout[-3000:]}")
    log(f"  {time.time() - t:.0f} s")
    return r


def pre_tokenizer_name(tok):
    """The tokenizer.ggml.pre value whose regex is this tokenizer.json's split, or an error."""
    pt = tok.get("pre_tokenizer") or {}
    seq = pt.get("pretokenizers", [pt]) if pt.get("type") == "Sequence" else [pt]
    kinds = [p.get("type") for p in seq]
    if kinds == ["Split", "ByteLevel"] and not seq[1].get("use_regex", True) \
            and seq[0].get("behavior") == "Isolated" and not seq[0].get("invert", False):
        name = PRE_TOKENIZERS.get(seq[0]["pattern"].get("Regex"))
        if name:
            return name
    if kinds == ["ByteLevel"] and seq[0].get("use_regex", True) and not seq[0].get("add_prefix_space", False):
        return "gpt2"
    sys.exit("quant_quality: no llama.cpp pre-tokenizer known for this tokenizer.json's pre_tokenizer: "
             + json.dumps(pt)[:400])


def bpe_vocab(model_dir, vocab_size):
    """callable(writer, gguf) adding model_dir's byte-level BPE tokenizer as GGUF metadata."""
    tok = json.load(open(os.path.join(model_dir, "tokenizer.json")))
    cfg_path = os.path.join(model_dir, "tokenizer_config.json")
    tcfg = json.load(open(cfg_path)) if os.path.exists(cfg_path) else {}
    m = tok["model"]
    if m.get("type") != "BPE" or (tok.get("decoder") or {}).get("type") != "ByteLevel":
        sys.exit("quant_quality: only byte-level BPE tokenizers are supported")
    pre = pre_tokenizer_name(tok)
    ids = dict(m["vocab"])
    special = {}
    for t in tok.get("added_tokens", []):
        ids[t["content"]] = t["id"]
        special[t["id"]] = t.get("special", False)
    tokens = [None] * vocab_size
    for piece, i in ids.items():
        if i < vocab_size:
            tokens[i] = piece
    missing = [i for i, t in enumerate(tokens) if t is None]
    for i in missing:  # ids the tokenizer never produces: unused padding pieces
        tokens[i] = f"[PAD{i}]"
    merges = [mg if isinstance(mg, str) else " ".join(mg) for mg in m["merges"]]

    def add(wr, gguf):
        types = []
        for i in range(vocab_size):
            if i in special:
                types.append(gguf.TokenType.CONTROL if special[i] else gguf.TokenType.USER_DEFINED)
            elif i in missing:
                types.append(gguf.TokenType.UNUSED)
            else:
                types.append(gguf.TokenType.NORMAL)
        wr.add_tokenizer_model("gpt2")
        wr.add_tokenizer_pre(pre)
        wr.add_token_list(tokens)
        wr.add_token_types(types)
        wr.add_token_merges(merges)
        for key, add_id in (("bos_token", wr.add_bos_token_id), ("eos_token", wr.add_eos_token_id),
                            ("pad_token", wr.add_pad_token_id)):
            name = tcfg.get(key)
            if isinstance(name, dict):
                name = name.get("content")
            if name in ids:
                add_id(ids[name])
        wr.add_add_bos_token(bool(tcfg.get("add_bos_token", False)))
        wr.add_add_eos_token(bool(tcfg.get("add_eos_token", False)))

    return add, pre


def load_checkpoint(model_dir, qtype=None):
    """HF name -> f32 array, or (uint8 blocks, qtype) for the U8 matrices of a quantized one."""
    out = {}
    for name, a in read_safetensors(os.path.join(model_dir, "model.safetensors")).items():
        if a.dtype == np.uint8:
            if qtype is None:
                sys.exit(f"quant_quality: {model_dir}: {name} is U8 in an unquantized checkpoint")
            out[name] = (a, qtype)
        else:
            out[name] = a.astype(np.float32)
    return out


def gguf_tensors(path, gguf):
    """tensor name -> (GGML type name, raw bytes) of a GGUF file."""
    r = gguf.GGUFReader(path)
    return {t.name: (t.tensor_type.name, bytes(np.asarray(t.data).tobytes())) for t in r.tensors}


def compare_gguf(ours, theirs, gguf):
    a, b = gguf_tensors(ours, gguf), gguf_tensors(theirs, gguf)
    same = sorted(n for n in a if n in b and a[n] == b[n])
    diff = sorted(n for n in a if n in b and a[n] != b[n])
    detail = {n: {"ours": a[n][0], "llama-quantize": b[n][0]} for n in diff}
    return {"tensors": len(a), "identical": len(same), "differ": detail,
            "only_ours": sorted(set(a) - set(b)), "only_llama": sorted(set(b) - set(a))}


# llama-perplexity's log lines: (pattern, the keys its groups fill), first match wins per key.
PERPLEXITY_LINES = [
    (r"Mean PPL\(Q\)\s*:\s*([\d.]+)\s*±\s*([\d.]+)", ("ppl", "ppl_err")),
    (r"Final estimate: PPL = ([\d.]+) \+/- ([\d.]+)", ("ppl", "ppl_err")),
    (r"Mean\s+KLD:\s*([-\d.e]+)\s*±\s*([\d.e-]+)", ("kld", "kld_err")),
    (r"99\.0%\s+KLD:\s*([-\d.e]+)", ("kld_p99",)),
    (r"Same top p:\s*([\d.]+)\s*±\s*([\d.]+)", ("same_top", "same_top_err")),
    (r"Mean ln\(PPL\(Q\)/PPL\(base\)\)\s*:\s*([-\d.]+)", ("ln_ppl_ratio",)),
]


def parse_perplexity(text, kl=False, fatal=True):
    """PPL, mean KL, same-top % (and their ± where printed) from llama-perplexity's log."""
    res = {}
    for pattern, keys in PERPLEXITY_LINES:
        m = re.search(pattern, text)
        if m and keys[0] not in res:
            res.update((k, float(v)) for k, v in zip(keys, m.groups()))
    m = re.search(r"calculating perplexity over (\d+) chunks|computing over (\d+) chunks", text)
    if m:
        res["chunks"] = int(m[1] or m[2])
    if "ppl" not in res or (kl and "kld" not in res):
        if fatal:
            sys.exit("quant_quality: no perplexity in llama-perplexity's output:\n" + text[-3000:])
        return None
    return res


def llama_perplexity(a, gguf_path, extra):
    cmd = [os.path.join(a.llama_bin, "llama-perplexity"), "-m", gguf_path, "-f", a.text, "-c", str(a.ctx),
           "-b", str(a.ctx), "-t", str(a.threads), "-ctk", "f32", "-ctv", "f32"] + extra
    logs = os.path.join(a.out, "logs")
    os.makedirs(logs, exist_ok=True)
    for attempt in range(3):
        out = run(cmd, env=a.perplexity_env).stdout
        with open(os.path.join(logs, os.path.basename(gguf_path) + ".perplexity.txt"), "w") as f:
            f.write(out)
        res = parse_perplexity(out, kl="--kl-divergence" in extra, fatal=attempt == 2)
        if res:
            return res
        # its logger can lose the last lines at exit (exit_delay.c); the run is deterministic
        log("no closing statistics in llama-perplexity's output; running it again")


def base_tokens(logits_file):
    """The token ids llama-perplexity saved with the base logits (n_chunk * n_ctx of them)."""
    with open(logits_file, "rb") as f:
        if f.read(8) != b"_logits_":
            sys.exit(f"quant_quality: {logits_file}: not a llama-perplexity logits file")
        n_ctx, _n_vocab, n_chunk = np.frombuffer(f.read(12), dtype=np.int32)
        return np.frombuffer(f.read(4 * int(n_ctx) * int(n_chunk)), dtype=np.int32)


def base_logprobs(logits_file):
    """(tokens [chunks, ctx], log-probabilities [chunks, ctx/2 - 1, vocab]) from llama-perplexity's
    --kl-divergence-base file: per chunk, the distributions at positions ctx/2 .. ctx-2, each
    stored as a scale, the lowest log-probability kept (16 nats under the top) and 16-bit steps."""
    with open(logits_file, "rb") as f:
        f.read(8)
        n_ctx, n_vocab, n_chunk = (int(x) for x in np.frombuffer(f.read(12), dtype=np.int32))
        tokens = np.frombuffer(f.read(4 * n_ctx * n_chunk), dtype=np.int32).reshape(n_chunk, n_ctx)
        nv = 2 * ((n_vocab + 1) // 2) + 4
        n = n_ctx - 1 - n_ctx // 2
        raw = np.frombuffer(f.read(), dtype=np.uint16).reshape(n_chunk, n, nv)
    head = raw[:, :, :4].copy().view(np.float32)  # [chunks, n, 2]: scale, min log-probability
    lp = head[:, :, 1:2] + head[:, :, 0:1] * raw[:, :, 4:4 + n_vocab].astype(np.float32)
    return tokens, lp


def log_softmax(x):
    x = x.astype(np.float64)
    x -= x.max(axis=-1, keepdims=True)
    return (x - np.log(np.exp(x).sum(axis=-1, keepdims=True))).astype(np.float32)


def our_logprobs(a, model_dir, tokens):
    """Our engine's log-probabilities (`astrai score`, every chunk one sequence of a packed batch)
    at the positions llama-perplexity scores: [chunks, ctx/2 - 1, vocab]."""
    n_chunk, n_ctx = tokens.shape
    path = os.path.join(a.out, "score-logits.npy")
    cmd = [a.astrai, "score", "--model", model_dir, "--threads", str(a.threads), "--dump-logits", path]
    for c in tokens:
        cmd += ["--ids", ",".join(str(int(t)) for t in c)]
    log(f"{a.astrai} score --model {model_dir} --ids ... ({n_chunk} sequences of {n_ctx}) --dump-logits {path}")
    t = time.time()
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        sys.exit(f"quant_quality: astrai score failed ({r.returncode}):\n{r.stderr[-3000:]}")
    log(f"  {time.time() - t:.0f} s")
    logits = np.load(path, mmap_mode="r").reshape(n_chunk, n_ctx, -1)
    out = np.stack([log_softmax(logits[i, n_ctx // 2:n_ctx - 1]) for i in range(n_chunk)])
    del logits
    os.remove(path)
    return out


def target_ppl(logprobs, tokens):
    """Perplexity of the tokens llama-perplexity scores, from [chunks, ctx/2 - 1, vocab] log-probs."""
    t = tokens[:, tokens.shape[1] // 2 + 1:][..., None]
    return float(np.exp(-np.take_along_axis(logprobs, t, -1).astype(np.float64).mean()))


def kl_stats(p_log, q_log):
    """Mean and 99th percentile of KL(p || q) per position, and the share of positions whose most
    likely token is the same, as llama-perplexity reports them."""
    kl = np.concatenate([(np.exp(p.astype(np.float64)) * (p.astype(np.float64) - q)).sum(-1).ravel()
                         for p, q in zip(p_log, q_log)])
    same = float((p_log.argmax(-1) == q_log.argmax(-1)).mean())
    return {"kld": float(kl.mean()), "kld_err": float(kl.std(ddof=1) / np.sqrt(kl.size)),
            "kld_p99": float(np.percentile(kl, 99)), "same_top": 100 * same,
            "same_top_err": 100 * float(np.sqrt(same * (1 - same) / (kl.size - 1)))}


def our_perplexity(a, model_dir):
    r = run([a.astrai, "eval", "perplexity", "--model", model_dir, "--data", a.text, "--context", str(a.ctx),
             "--stride", str(a.ctx // 2), "--threads", str(a.threads), "--json"])
    j = next(json.loads(line) for line in reversed(r.stdout.splitlines()) if line.startswith("{"))
    return {"ppl": j["perplexity"], "nll_per_token": j["nll_per_token"], "scored_tokens": j["scored_tokens"]}


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def table(rows):
    lines = ["| format | quantizer | file bytes | PPL (llama.cpp) | mean KL to f32 | 99% KL | same top token |"
             " PPL (astrai eval) | PPL, astrai engine | mean KL, astrai engine | same top, astrai engine |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lp, ours, ok = r.get("llama_perplexity", {}), r.get("astrai_eval", {}), r.get("astrai_kl", {})
        kld = lp.get("kld")
        kl = "-" if kld is None else f"{kld:.6f} ± {lp['kld_err']:.6f}"
        top = "-" if "same_top" not in lp else f"{lp['same_top']:.2f} ± {lp['same_top_err']:.2f} %"
        ppl = "-" if "ppl" not in lp else f"{lp['ppl']:.3f} ± {lp['ppl_err']:.3f}"
        q = r["quantizer"] + (" (tensors byte-identical to ours)" if r.get("same_tensors_as") else "")
        lines.append(f"| {r['format']} | {q} | {r['bytes']:,} | {ppl} | {kl} | "
                     f"{fmt(lp.get('kld_p99'), '.6f')} | {top} | {fmt(ours.get('ppl'), '.3f')} | "
                     f"{fmt((ok or r.get('astrai_vs_llama_f32', {})).get('ppl'), '.3f')} | "
                     + ("-" if not ok else f"{ok['kld']:.6f} ± {ok['kld_err']:.6f}") + " | "
                     + ("-" if not ok else f"{ok['same_top']:.2f} ± {ok['same_top_err']:.2f} %") + " |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="trained f32 checkpoint directory (config.json, "
                    "model.safetensors, tokenizer.json)")
    ap.add_argument("--llama-bin", required=True, help="llama.cpp's bin directory (llama-perplexity, llama-quantize)")
    ap.add_argument("--llama-src", help="llama.cpp's source tree, for gguf-py (default: LLAMA_BIN/../../src)")
    ap.add_argument("--text", required=True, help="evaluation text file")
    ap.add_argument("--formats", default="q8_0,q4_0,q4_k",
                    help=f"our formats, each against llama-quantize --pure (known: {', '.join(FORMATS)})")
    ap.add_argument("--mixtures", default="Q4_0,Q4_K_M,Q4_0:embd=Q8_0",
                    help="llama-quantize types run without --pure (its default per-tensor mixture), or "
                    "TYPE:embd=EMBD_TYPE: --pure TYPE except the (tied) token embedding in EMBD_TYPE; '' for none")
    ap.add_argument("--ctx", type=int, default=128, help="context: llama-perplexity -c, astrai eval --context")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--astrai", default=os.path.join(ROOT, "build", "release", "src", "astrai"))
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "quant_quality"))
    ap.add_argument("--no-astrai-eval", action="store_true",
                    help="skip our engine's runs (astrai eval perplexity, astrai score)")
    ap.add_argument("--activations", choices=["q8", "f32"], default="q8",
                    help="what our engine's quantized weights multiply (astrai --activations)")
    a = ap.parse_args()
    os.environ["ASTRAI_ACTIVATIONS"] = a.activations  # every astrai run below
    formats = [f for f in a.formats.split(",") if f]
    for f in formats:
        if f not in FORMATS:
            sys.exit(f"quant_quality: unknown format {f} (known: {', '.join(FORMATS)})")
    mixtures = [m for m in a.mixtures.split(",") if m]
    src = a.llama_src or os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(a.llama_bin))), "src")
    sys.path.insert(0, os.path.join(src, "gguf-py"))
    import gguf
    os.makedirs(a.out, exist_ok=True)
    a.perplexity_env = None
    shim = os.path.join(a.out, "exit_delay.so")
    r = subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", shim, os.path.join(os.path.dirname(__file__), "exit_delay.c")],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode == 0:
        a.perplexity_env = dict(os.environ, LD_PRELOAD=shim)
    else:
        log("no C compiler for exit_delay.c: llama-perplexity runs that lose their last lines are rerun")
    config = json.load(open(os.path.join(a.model, "config.json")))
    if config.get("quantization_config"):
        sys.exit("quant_quality: --model must be the float checkpoint")
    vocab, pre = bpe_vocab(a.model, config["vocab_size"])
    quantize = os.path.join(a.llama_bin, "llama-quantize")

    # f32 GGUF and the base logits
    f32_gguf = os.path.join(a.out, "model-f32.gguf")
    write_gguf(load_checkpoint(a.model), "f32", f32_gguf, src, config=config, vocab=vocab)
    base_logits = os.path.join(a.out, "base.logits")
    rows = [{"format": "f32", "quantizer": "-", "bytes": os.path.getsize(f32_gguf), "gguf": f32_gguf,
             "llama_perplexity": llama_perplexity(a, f32_gguf, ["--kl-divergence-base", base_logits])}]
    if not a.no_astrai_eval:
        rows[0]["astrai_eval"] = our_perplexity(a, a.model)

    # the tokens llama.cpp read are ours
    r = run([a.astrai, "tokenize", "--tokenizer", a.model, "--file", a.text, "--json"])
    our_ids = np.array(json.loads(r.stdout)["ids"], dtype=np.int32)
    theirs = base_tokens(base_logits)
    tokens_match = bool(len(our_ids) >= len(theirs) and np.array_equal(our_ids[:len(theirs)], theirs))
    log(f"tokenization: ours {len(our_ids)} tokens, llama.cpp's first {len(theirs)} "
        f"{'identical' if tokens_match else 'DIFFER'}")

    # our engine on the same chunks: the f32 model against llama.cpp's, then each of our formats
    # against our f32 model
    ours_f32 = None
    if not a.no_astrai_eval:
        chunk_tokens, llama_lp = base_logprobs(base_logits)
        ours_f32 = our_logprobs(a, a.model, chunk_tokens)
        target = chunk_tokens[:, a.ctx // 2 + 1:][..., None]
        theirs = np.take_along_axis(llama_lp, target, -1)
        kept = theirs > llama_lp.min(-1, keepdims=True)  # stored clipped: more than 16 nats under the top
        d = np.abs(np.take_along_axis(ours_f32, target, -1) - theirs)[kept]
        rows[0]["astrai_vs_llama_f32"] = {
            "targets": int(kept.size), "targets_clipped": int(kept.size - kept.sum()),
            "max_abs_target_logprob_diff": float(d.max()), "mean_abs_target_logprob_diff": float(d.mean()),
            "storage_step": float(((llama_lp.max(-1) - llama_lp.min(-1)) / 65535).mean()),
            "ppl": target_ppl(ours_f32, chunk_tokens),
            "same_top": 100 * float((ours_f32.argmax(-1) == llama_lp.argmax(-1)).mean())}
        del llama_lp
        log("f32, astrai against llama.cpp: " + json.dumps(rows[0]["astrai_vs_llama_f32"]))

    def kl_row(fmt_name, quantizer, path, model_dir=None):
        row = {"format": fmt_name, "quantizer": quantizer, "bytes": os.path.getsize(path), "gguf": path,
               "llama_perplexity": llama_perplexity(a, path, ["--kl-divergence-base", base_logits, "--kl-divergence"])}
        if model_dir and not a.no_astrai_eval:
            row["astrai_eval"] = our_perplexity(a, model_dir)
            q_log = our_logprobs(a, model_dir, chunk_tokens)
            row["astrai_kl"] = dict(kl_stats(ours_f32, q_log), ppl=target_ppl(q_log, chunk_tokens))
        return row

    notes, identity = [], {}
    for f in formats:
        qtype, llama_type = FORMATS[f]
        qdir = os.path.join(a.out, f"astrai-{f}")
        r = run([a.astrai, "quantize", "--model", a.model, "--type", f, "--output", qdir], check=False)
        ours_gguf = None
        if r.returncode != 0:
            why = r.stdout.strip().splitlines()[0] if r.stdout.strip() else f"exit {r.returncode}"
            notes.append(f"{f}: astrai quantize rejects it ({why.strip()}); llama.cpp's row only")
            log(notes[-1])
        else:
            ours_gguf = os.path.join(a.out, f"astrai-{f}.gguf")
            write_gguf(load_checkpoint(qdir, qtype), "f32", ours_gguf, src, config=config, vocab=vocab,
                       file_type=f"MOSTLY_{llama_type}")
        pure = os.path.join(a.out, f"llama-{f}-pure.gguf")
        run([quantize, "--pure", f32_gguf, pure, llama_type, str(a.threads)])
        if ours_gguf:
            rows.append(kl_row(f, "astrai quantize", ours_gguf, qdir))
            identity[f] = d = compare_gguf(ours_gguf, pure, gguf)
            log(f"{f}: {d['identical']}/{d['tensors']} tensors byte-identical to llama-quantize's")
            if d["identical"] == d["tensors"] and not d["only_llama"]:
                # the same tensors: llama-perplexity computes the same numbers; not run twice
                row = dict(rows[-1], quantizer="llama-quantize --pure", bytes=os.path.getsize(pure), gguf=pure,
                           same_tensors_as=ours_gguf)
                row.pop("astrai_eval", None)
                row.pop("astrai_kl", None)
                rows.append(row)
                continue
        rows.append(kl_row(f, "llama-quantize --pure", pure))
    for m in mixtures:
        qtype, _, embd = m.partition(":embd=")
        path = os.path.join(a.out, f"llama-{qtype}{'-embd-' + embd if embd else ''}.gguf")
        if embd:
            run([quantize, "--pure", "--token-embedding-type", embd, f32_gguf, path, qtype, str(a.threads)])
            label = f"llama-quantize --pure, token embedding {embd}"
        else:
            run([quantize, f32_gguf, path, qtype, str(a.threads)])
            label = "llama-quantize (default mixture)"
        mix = {}
        for t in gguf.GGUFReader(path).tensors:
            mix[t.tensor_type.name] = mix.get(t.tensor_type.name, 0) + 1
        row = kl_row(qtype, label, path)
        row["tensor_types"] = mix
        rows.append(row)

    commit = subprocess.run(["git", "-C", src, "rev-parse", "HEAD"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True).stdout.strip()
    report = {"cpu": cpu_model(), "threads": a.threads, "llama_cpp_commit": commit, "ctx": a.ctx, "date": time.strftime("%Y-%m-%d"),
              "model": os.path.abspath(a.model), "config": config, "text": os.path.abspath(a.text),
              "text_bytes": os.path.getsize(a.text), "text_tokens": int(len(our_ids)), "pre_tokenizer": pre,
              "llama_tokens_identical": tokens_match, "rows": rows, "byte_identity": identity, "notes": notes}
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(report, f, indent=1)
    chunks = rows[0]["llama_perplexity"].get("chunks")
    print(f"{report['cpu']}, {a.threads} threads, {report['date']}; text {report['text_bytes']:,} bytes, "
          f"{len(our_ids):,} tokens ({'llama.cpp tokenizes it identically' if tokens_match else 'llama.cpp TOKENIZES IT DIFFERENTLY'}); "
          f"context {a.ctx}, {chunks} chunks\n")
    print(table(rows))
    if "astrai_vs_llama_f32" in rows[0]:
        c = rows[0]["astrai_vs_llama_f32"]
        print(f"\nf32, astrai score against llama.cpp's stored base log-probabilities (16-bit, step "
              f"{c['storage_step']:.1e} nats): scored token |difference| max {c['max_abs_target_logprob_diff']:.2e}, "
              f"mean {c['mean_abs_target_logprob_diff']:.2e} nats ({c['targets_clipped']} of {c['targets']} "
              f"stored clipped, left out); same top token {c['same_top']:.2f} %; perplexity of the scored tokens "
              f"{c['ppl']:.4f} (llama.cpp: {rows[0]['llama_perplexity']['ppl']:.4f})")
    for f, d in identity.items():
        print(f"\n{f}: {d['identical']} of {d['tensors']} tensors byte-identical to llama-quantize --pure's"
              + (f"; differ: {json.dumps(d['differ'])}" if d["differ"] else ""))
    for mrow in rows:
        if "tensor_types" in mrow:
            print(f"\n{mrow['format']}, {mrow['quantizer']}: tensor types {json.dumps(mrow['tensor_types'])}")
    for n in notes:
        print("\nnote:", n)


if __name__ == "__main__":
    main()
