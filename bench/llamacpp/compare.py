#!/usr/bin/python3
"""AstrAI against llama.cpp on the same machine, in one run, on the same random-weight model.

Writes one 100M-class Llama model (12 layers, hidden 768, 12/4 heads, FFN 2048, vocabulary 32000,
tied embeddings) as our checkpoint (HF-layout safetensors + config.json) in f32, bf16 and f16,
and the same weights as GGUF (with the gguf package from llama.cpp's own source tree; Q and K
rows permuted as llama.cpp's converter does, for its RoPE pairing), then quantized by
llama-quantize to Q8_0, Q4_0, Q4_K, Q5_K and Q6_K (the k-quants --pure) and Q4_K_M. Then, with the
same thread count:
  llama.cpp: llama-bench -p 512,4096 -n 128 (pp512, pp4096, tg128) and llama-batched-bench -npp 512
             -ntg 128 -npl 1,8,32 (aggregate decode with parallel sequences);
  AstrAI:    astrai bench prefill --prompt 512 and 4096, astrai bench decode --prompt 512 --gen 128
             --batches 1,8,32 (KV cache in bf16: the same bytes as llama.cpp's default f16 cache).
Prints a Markdown table (tokens/s and our / llama.cpp ratios) and writes the raw results as JSON;
with the parallel sequences, a second table says what 3x llama.cpp's 32-sequence rate asks of our
step: its attention, its matrix products against the arithmetic peak (`astrai bench` measures it
in the same run), and the best ratio with the products at that peak. A third table does the same
for the prompts against 1.2x llama.cpp's prompt rate, and a fourth sets one sequence's decode
against memory: the bytes a step reads, each side's rate against the copy probe.

    bench/llamacpp/compare.py [--threads 2] [--formats f32,bf16,f16,q8_0,q4_0,q4_k,q4_k_m,q5_k,q6_k]
                              [--no-batched] [--bf16-dot] [--rounds N] [--out build/llamacpp/compare]

--rounds N runs both programs N times per format, alternately, and keeps each side's best rate
(each run is itself the best or mean of a few repetitions, as llama-bench's -r 3).

--level v3 compares at the AVX2 level on this machine: llama.cpp built for AVX2 + FMA + F16C only
(build.sh's v3: what an AVX2-only CPU such as AMD Zen 2/3 gets) against ours with
ASTRAI_CPU_ISA=v3 and ASTRAI_CPU_VNNI=0; --level v3-vnni adds AVX-VNNI on both sides (Intel client
CPUs since Alder Lake). The core is still this machine's (its caches, clocks and ports), so it
stands in for an AVX2-only CPU's instruction set, not for its speed. Results go to
results-LEVEL.json.

--bf16-dot adds a row "bf16 --bf16-dot": our bf16 checkpoint again with bf16 weights times
bf16-rounded activations (AVX512_BF16's VDPBF16PS where the CPU has it), the arithmetic llama.cpp
uses for bf16 weights on such CPUs, against the same llama.cpp figures.

Our Q8_0, Q4_0, Q4_K, Q5_K and Q6_K checkpoints are written by `astrai quantize` from the f32 one (the same
bytes as llama-quantize's blocks, except that llama-quantize's Q4_0 keeps the tied embedding at
Q6_K, see its log; its k-quants are --pure, every matrix in that type as ours); Q4_K_M, llama.cpp's default
mixture with some matrices at Q6_K, is llama-quantize's GGUF file, which both programs run.
Needs: bench/llamacpp/build.sh (run by this script), build/release/src/astrai, numpy.
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from safetensors_np import write_safetensors  # noqa: E402

CONFIG = {"model_type": "llama", "vocab_size": 32000, "hidden_size": 768, "intermediate_size": 2048,
          "num_hidden_layers": 12, "num_attention_heads": 12, "num_key_value_heads": 4,
          "max_position_embeddings": 32768, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
          "tie_word_embeddings": True, "hidden_act": "silu", "torch_dtype": "float32"}
OURS = ("f32", "bf16", "f16")
OUR_QUANT = ("q8_0", "q4_0", "q4_k", "q5_k", "q6_k")  # written by astrai quantize from the f32 checkpoint
# llama-quantize's type for each format; q4_k is --pure (every matrix Q4_K, as ours), q4_k_m is
# llama.cpp's default Q4_K mixture (Q6_K for some matrices), whose GGUF file both sides run.
QUANT = {"q8_0": "Q8_0", "q4_0": "Q4_0", "q4_k": "Q4_K", "q5_k": "Q5_K_S", "q6_k": "Q6_K", "q4_k_m": "Q4_K_M"}
PURE = ("q4_k", "q5_k", "q6_k")
# --level: our side's environment (build.sh builds llama.cpp's side for the same level; OpenBLAS,
# which only the benches' baselines use, gets its AVX2 kernels, as an AVX2-only CPU would) and the
# CPU features (/proc/cpuinfo flags) the level needs.
V3_ENV = {"ASTRAI_CPU_ISA": "v3", "OPENBLAS_CORETYPE": "Haswell"}
V3_FLAGS = ["avx2", "fma", "f16c", "bmi2"]
LEVELS = {"native": {"env": {}, "flags": []},
          "v3": {"env": dict(V3_ENV, ASTRAI_CPU_VNNI="0"), "flags": V3_FLAGS},
          "v3-vnni": {"env": dict(V3_ENV, ASTRAI_CPU_VNNI="1"), "flags": V3_FLAGS + ["avx_vnni"]}}


def log(*a):
    print("compare:", *a, file=sys.stderr, flush=True)


def hf_weights(seed=1):
    """name -> float32 array, HF Llama names, uniform(+-sqrt(3 / fan_in)) matrices, unit norms."""
    c, rng = CONFIG, np.random.default_rng(seed)
    h, f, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    hd = h // c["num_attention_heads"]
    kv = c["num_key_value_heads"] * hd

    def mat(rows, cols):
        a = np.sqrt(3.0 / cols)
        return rng.uniform(-a, a, size=(rows, cols)).astype(np.float32)

    w = {"model.embed_tokens.weight": mat(v, h), "model.norm.weight": np.ones(h, np.float32)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = np.ones(h, np.float32)
        w[p + "post_attention_layernorm.weight"] = np.ones(h, np.float32)
        w[p + "self_attn.q_proj.weight"] = mat(h, h)
        w[p + "self_attn.k_proj.weight"] = mat(kv, h)
        w[p + "self_attn.v_proj.weight"] = mat(kv, h)
        w[p + "self_attn.o_proj.weight"] = mat(h, h)
        w[p + "mlp.gate_proj.weight"] = mat(f, h)
        w[p + "mlp.up_proj.weight"] = mat(f, h)
        w[p + "mlp.down_proj.weight"] = mat(h, f)
    return w


def to_bf16_bits(a):
    """float32 -> bfloat16 bit patterns, round to nearest even."""
    u = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def write_ours(weights, dtype, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    entries = []
    for name, a in weights.items():
        if dtype == "f32":
            entries.append((name, "F32", a.shape, a.tobytes()))
        elif dtype == "bf16":
            entries.append((name, "BF16", a.shape, to_bf16_bits(a).tobytes()))
        else:
            entries.append((name, "F16", a.shape, a.astype(np.float16).tobytes()))
    write_safetensors(os.path.join(out_dir, "model.safetensors"), entries)
    cfg = dict(CONFIG, torch_dtype={"f32": "float32", "bf16": "bfloat16", "f16": "float16"}[dtype])
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)


def permute_rope(w, heads):
    """HF (half-split RoPE) rows -> llama.cpp's adjacent-pair order, as its converter does."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def placeholder_vocab(wr, gguf, vocab_size):
    """A SentencePiece-style vocabulary of placeholder pieces, for runs that feed token ids."""
    v = vocab_size
    tokens = [b"<unk>", b"<s>", b"</s>"] + [f"<0x{i:02X}>".encode() for i in range(256)]
    tokens += [f"tok{i}".encode() for i in range(len(tokens), v)]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL] + [gguf.TokenType.BYTE] * 256
    types += [gguf.TokenType.NORMAL] * (v - len(types))
    wr.add_tokenizer_model("llama")
    wr.add_token_list(tokens)
    wr.add_token_scores([0.0] * v)
    wr.add_token_types(types)
    wr.add_bos_token_id(1)
    wr.add_eos_token_id(2)


def write_gguf(weights, dtype, path, src_dir, config=CONFIG, vocab=None, file_type=None):
    """Writes a Llama model as GGUF with gguf-py, named and laid out as llama.cpp's converter does.

    weights: HF tensor name -> float32 array, or -> (uint8 array [rows, bytes per row], "Q8_0")
    for blocks already quantized (written as they are; Q and K rows move whole, so the blocks
    stay intact). dtype: f32, f16 or bf16, the type float matrices are stored in (vectors stay
    f32). config: the HF config.json dict. vocab: callable(writer, gguf module) that adds the
    tokenizer metadata (default: placeholder pieces). file_type: a gguf.LlamaFileType name to
    record instead of the one dtype implies (e.g. MOSTLY_Q8_0)."""
    sys.path.insert(0, os.path.join(src_dir, "gguf-py"))
    import gguf  # llama.cpp's own package, from the source tree build.sh cloned

    c = config
    wr = gguf.GGUFWriter(path, "llama")
    wr.add_block_count(c["num_hidden_layers"])
    wr.add_context_length(c["max_position_embeddings"])
    wr.add_embedding_length(c["hidden_size"])
    wr.add_feed_forward_length(c["intermediate_size"])
    wr.add_head_count(c["num_attention_heads"])
    wr.add_head_count_kv(c["num_key_value_heads"])
    wr.add_layer_norm_rms_eps(c["rms_norm_eps"])
    wr.add_rope_freq_base(c["rope_theta"])
    wr.add_rope_dimension_count(c["hidden_size"] // c["num_attention_heads"])
    wr.add_vocab_size(c["vocab_size"])
    ftype = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
             "bf16": gguf.LlamaFileType.MOSTLY_BF16}[dtype]
    wr.add_file_type(gguf.LlamaFileType[file_type] if file_type else ftype)
    if vocab is None:
        placeholder_vocab(wr, gguf, c["vocab_size"])
    else:
        vocab(wr, gguf)

    def add(name, a, heads=None):
        if isinstance(a, tuple):  # quantized blocks: uint8 rows, whole
            blocks, qtype = a
            if heads:
                blocks = permute_rope(blocks, heads)
            wr.add_tensor(name, np.ascontiguousarray(blocks), raw_dtype=gguf.GGMLQuantizationType[qtype])
            return
        if heads:
            a = permute_rope(a, heads)
        if a.ndim == 1 or dtype == "f32":
            wr.add_tensor(name, a.astype(np.float32))
        elif dtype == "f16":
            wr.add_tensor(name, a.astype(np.float16))
        else:
            wr.add_tensor(name, to_bf16_bits(a), raw_shape=a.shape, raw_dtype=gguf.GGMLQuantizationType.BF16)

    heads, kv_heads = c["num_attention_heads"], c["num_key_value_heads"]
    add("token_embd.weight", weights["model.embed_tokens.weight"])
    add("output_norm.weight", weights["model.norm.weight"])
    if not c.get("tie_word_embeddings", False):
        add("output.weight", weights["lm_head.weight"])
    names = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for i in range(c["num_hidden_layers"]):
        for hf, gg in names.items():
            a = weights[f"model.layers.{i}.{hf}.weight"]
            rope_heads = {"self_attn.q_proj": heads, "self_attn.k_proj": kv_heads}.get(hf)
            add(f"blk.{i}.{gg}.weight", a, rope_heads)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()


def run(cmd, env=None):
    log(" ".join(cmd))
    t = time.time()
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    if r.returncode != 0:
        sys.exit(f"compare: {cmd[0]} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    log(f"  {time.time() - t:.0f} s")
    return r.stdout


def last_json(text):
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    sys.exit("compare: no JSON report in:\n" + text[-2000:])


def llama_side(bin_dir, gguf_path, threads, batched):
    res = {}
    out = json.loads(run([f"{bin_dir}/llama-bench", "-m", gguf_path, "-p", "512,4096", "-n", "128", "-t", str(threads),
                          "-r", "3", "-o", "json"]))
    for r in out:
        res[f"pp{r['n_prompt']}" if r["n_prompt"] else "tg128"] = r["avg_ts"]
    if batched:
        text = run([f"{bin_dir}/llama-batched-bench", "-m", gguf_path, "-c", str(32 * 640 + 64), "-b", "2048",
                    "-ub", "512", "-npp", "512", "-ntg", "128", "-npl", "1,8,32", "-t", str(threads),
                    "--output-format", "jsonl"])
        for line in text.splitlines():
            if line.startswith("{"):
                j = json.loads(line)
                res[f"b{j['pl']}_tg"] = j["speed_tg"]
                res[f"b{j['pl']}_pp"] = j["speed_pp"]
    return res


def best_of(rounds):
    """One result from several rounds of one side: each rate the best of its rounds (as
    llama-bench -r and our --repeat do within a run); the 32-sequence step's breakdown from the
    round with the best 32-sequence rate."""
    best = dict(rounds[0])
    for r in rounds[1:]:
        for k, v in r.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "products_peak":
                best[k] = max(best.get(k, v), v)
    top = max(rounds, key=lambda r: r.get("b32_tg", 0))
    for k in ("b32_step", "products_peak"):
        if k in top:
            best[k] = top[k]
    for pp in ("pp512", "pp4096"):  # each prompt's breakdown from its fastest round
        top = max(rounds, key=lambda r: r.get(pp, 0))
        if f"{pp}_run" in top:
            best[f"{pp}_run"] = top[f"{pp}_run"]
    top = max(rounds, key=lambda r: r.get("b1_tg", 0))
    if "b1_run" in top:  # the copy probe: the best of the rounds
        best["b1_run"] = dict(top["b1_run"], copy_bw=max(r["b1_run"]["copy_bw"] for r in rounds if "b1_run" in r))
    if len(rounds) > 1:
        best["rounds"] = len(rounds)
    return best


def our_side(astrai, model_dir, threads, batched, env=None):
    res = {}
    common = ["--model", model_dir, "--threads", str(threads), "--kv-dtype", "bf16", "--json"]
    for prompt in (512, 4096):
        j = last_json(run([astrai, "bench", "prefill", "--prompt", str(prompt), "--batches", "1", "--repeat", "3"]
                          + common, env))
        b = j["batches"][0]
        res[f"pp{prompt}"] = b["tokens_per_s"]
        res["kernels"], res["cpu"] = j["kernels"], j["cpu"]
        res["bf16_dot"] = j.get("bf16_dot", "off")
        if "products_ms" in b:  # where the prompt's time goes (prefill_limits())
            res[f"pp{prompt}_run"] = {"seconds": b["seconds"], "products_ms": b["products_ms"],
                                      "products_ops": b["products_ops"], "attention_ms": b["attention_ms"],
                                      "products_peak": j.get("products_peak")}
    batches = "1,8,32" if batched else "1"
    j = last_json(run([astrai, "bench", "decode", "--prompt", "512", "--gen", "128", "--batches", batches] + common,
                      env))
    for b in j["batches"]:
        res[f"b{b['batch']}_tg"] = b["tokens_per_s"]
        if b["batch"] == 1 and "bytes_per_s" in b:  # what one step streams (stream_limits())
            res["b1_run"] = {"copy_bw": j["copy_bw"], "step_bytes": b["bytes_per_s"] / b["tokens_per_s"]}
        if b["batch"] == 32 and "products_ms" in b:  # where a 32-sequence step goes (limits())
            res["b32_step"] = {"step_ms": b["step_ms"], "products_ms": b["products_ms"],
                               "products_ops": b["products_ops"], "attention_ms": b["attention_ms"],
                               "kv_gbs": b["kv_bytes"] / b["attention_ms"] / 1e6}
    res["tg128"] = res["b1_tg"]
    res["products_peak"] = j.get("products_peak")
    return res


def cpu_flags():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def table(results, batched):
    # Decode columns at the context of a 512-token prompt on both sides (llama-batched-bench's
    # parallel sequences); llama-bench's tg128 starts from an empty context, so it is not one.
    cols = [("pp512", "prompt 512 (tok/s)"), ("pp4096", "prompt 4096 (tok/s)")]
    cols += [("b1_tg", "decode, 1 sequence (tok/s)")] if batched else [("tg128", "decode, 1 sequence (tok/s)")]
    if batched:
        cols += [("b8_tg", "decode, 8 sequences (tok/s)"), ("b32_tg", "decode, 32 sequences (tok/s)")]
    head = "| weights | " + " | ".join(f"{t}: llama.cpp / ours / ratio" for _, t in cols) + " |"
    lines = [head, "|---" * (len(cols) + 1) + "|"]
    for fmt, r in results.items():
        cells = []
        for key, _ in cols:
            a = r["llama.cpp"].get(key)
            b = r.get("astrai", {}).get(key)
            if a is None:
                cells.append("-")
            elif b is None:
                cells.append(f"{a:.1f} / (no {fmt} yet) / -")
            else:
                cells.append(f"{a:.1f} / {b:.1f} / {b / a:.2f}x")
        lines.append(f"| {fmt} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def limits(results):
    """What 3x llama.cpp's 32-sequence rate asks of our step, next to where the step goes: the
    budget (llama.cpp's step / 3); our step; its attention; its matrix products and their share
    of the arithmetic peak measured in the same run (`astrai bench` prints it: the 8-bit dot
    product for quantized weights, the f32 FMA otherwise); and the best ratio reachable with the
    products at 100% of that peak and everything else as measured."""
    lines = ["| weights | llama.cpp (tok/s) | 3x needs a step of | our step | attention (K/V read) | matrix products "
             "(share of the peak) | products at the peak | best ratio with products at the peak |",
             "|---|---|---|---|---|---|---|---|"]
    for fmt, r in results.items():
        ours, theirs = r.get("astrai", {}), r["llama.cpp"].get("b32_tg")
        st, peak = ours.get("b32_step"), ours.get("products_peak")
        if not st or not theirs or not peak:
            continue
        budget = 32 / (3 * theirs) * 1e3
        at_peak = st["products_ops"] / peak * 1e3
        best_step = st["step_ms"] - st["products_ms"] + at_peak
        share = st["products_ops"] / (st["products_ms"] / 1e3) / peak
        kv = f" ({st['kv_gbs']:.0f} GB/s)" if "kv_gbs" in st else ""  # results.json of older runs lack it
        lines.append(f"| {fmt} | {theirs:.1f} | {budget:.1f} ms | {st['step_ms']:.1f} ms | {st['attention_ms']:.1f} ms{kv} | "
                     f"{st['products_ms']:.1f} ms ({100 * share:.0f}%) | {at_peak:.1f} ms | "
                     f"{32 / (best_step / 1e3) / theirs:.2f}x |")
    return "\n".join(lines) if len(lines) > 2 else ""


def stream_limits(results):
    """One sequence's decode against memory: the bytes a step reads (every weight and the
    sequence's K/V: ours, the same file sizes on both sides but for llama-quantize's Q6_K
    embedding in its Q4_0), each side's rate in GB/s and as a share of our copy probe (a parallel
    memcpy, read + written bytes, measured by `astrai bench decode` in the same run), and the rate
    1.2x llama.cpp's tokens/s would need."""
    lines = ["| weights | bytes per step | llama.cpp: tok/s, GB/s (share of the probe) | ours | copy probe | "
             "1.2x llama.cpp needs |", "|---|---|---|---|---|---|"]
    for fmt, r in results.items():
        # llama-batched-bench's one sequence after the same 512-token prompt (tg128 starts empty).
        run_, theirs = r.get("astrai", {}).get("b1_run"), r["llama.cpp"].get("b1_tg")
        ours = r.get("astrai", {}).get("b1_tg")
        if not run_ or not theirs or not ours:
            continue
        mb, probe = run_["step_bytes"], run_["copy_bw"]
        rate = lambda tps: f"{tps * mb / 1e9:.1f} GB/s ({100 * tps * mb / probe:.0f}%)"
        lines.append(f"| {fmt} | {mb / 1e6:.0f} MB | {theirs:.1f}, {rate(theirs)} | {ours:.1f}, {rate(ours)} | "
                     f"{probe / 1e9:.1f} GB/s | {rate(1.2 * theirs)} |")
    return "\n".join(lines) if len(lines) > 2 else ""


def prefill_limits(results):
    """What 1.2x llama.cpp's prompt rate asks of our prefill, next to where its time goes: our
    time for the prompt; its attention; its matrix products and their share of the arithmetic
    peak measured in the same run; and the best ratio reachable with the products at 100% of that
    peak and everything else as measured."""
    lines = ["| weights | prompt | llama.cpp (tok/s) | 1.2x needs | our time | attention | matrix products (share of "
             "the peak) | products at the peak | best ratio with products at the peak |",
             "|---|---|---|---|---|---|---|---|---|"]
    for fmt, r in results.items():
        ours = r.get("astrai", {})
        for pp in ("pp512", "pp4096"):
            run_, theirs = ours.get(f"{pp}_run"), r["llama.cpp"].get(pp)
            if not run_ or not theirs or not run_.get("products_peak"):
                continue
            tokens = int(pp[2:])
            at_peak = run_["products_ops"] / run_["products_peak"] * 1e3
            best_ms = run_["seconds"] * 1e3 - run_["products_ms"] + at_peak
            share = run_["products_ops"] / (run_["products_ms"] / 1e3) / run_["products_peak"]
            lines.append(f"| {fmt} | {tokens} | {theirs:.1f} | {tokens / (1.2 * theirs) * 1e3:.0f} ms | "
                         f"{run_['seconds'] * 1e3:.0f} ms | {run_['attention_ms']:.0f} ms | {run_['products_ms']:.0f} ms "
                         f"({100 * share:.0f}%) | {at_peak:.0f} ms | {tokens / (best_ms / 1e3) / theirs:.2f}x |")
    return "\n".join(lines) if len(lines) > 2 else ""


def print_tables(results, batched):
    """The ratios, then each table of limits that the results have figures for."""
    print(table(results, batched))
    for extra in (limits(results) if batched else "", prefill_limits(results), stream_limits(results)):
        if extra:
            print("\n" + extra)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--formats", default="f32,bf16,f16,q8_0,q4_0,q4_k,q4_k_m")
    ap.add_argument("--no-batched", action="store_true", help="skip the 8 and 32 parallel sequences runs")
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "llamacpp", "compare"))
    ap.add_argument("--astrai", default=os.path.join(ROOT, "build", "release", "src", "astrai"))
    ap.add_argument("--table", metavar="RESULTS_JSON", help="only print the table of an earlier run's results.json")
    ap.add_argument("--bf16-dot", action="store_true",
                    help="also run our bf16 checkpoint with --bf16-dot (bf16-rounded activations, as llama.cpp)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="per format, run llama.cpp and ours alternately this many times and keep each side's best "
                         "(this host's rates move by up to 1.5x between minutes)")
    ap.add_argument("--activations", choices=["q8", "f32"], default="q8",
                    help="what our quantized weights multiply (astrai --activations; q8, the default, as llama.cpp)")
    ap.add_argument("--level", choices=list(LEVELS), default="native",
                    help="instruction-set level of both programs (default native: the best this CPU runs)")
    a = ap.parse_args()
    os.environ["ASTRAI_ACTIVATIONS"] = a.activations  # every astrai run below
    os.environ.update(LEVELS[a.level]["env"])
    results_name = "results.json" if a.level == "native" else f"results-{a.level}.json"
    if a.table:
        report = json.load(open(a.table))
        batched = all("b8_tg" in r["llama.cpp"] for r in report["results"].values())
        level = report.get("level", "native")
        level = "" if level == "native" else f", level {level} on both sides"
        print(f"{report['cpu']}, {report['threads']} threads{level}, {report['date']}\n")
        print_tables(report["results"], batched)
        return
    missing = [f for f in LEVELS[a.level]["flags"] if f not in cpu_flags()]
    if missing:
        sys.exit(f"compare: --level {a.level} needs CPU features this machine lacks: {' '.join(missing)}")
    formats = a.formats.split(",")
    for f in formats:
        if f not in OURS and f not in QUANT:
            sys.exit(f"compare: unknown format {f} (known: {', '.join(OURS + tuple(QUANT))})")
    if not os.access(a.astrai, os.X_OK):
        sys.exit(f"compare: {a.astrai} not found: build with cmake --build --preset release")
    llama_dir = os.path.join(ROOT, "build", "llamacpp")
    bin_dir = subprocess.run([os.path.join(ROOT, "bench", "llamacpp", "build.sh"), llama_dir, a.level], check=True,
                             stdout=subprocess.PIPE, text=True).stdout.strip().splitlines()[-1]
    src_dir = os.path.join(llama_dir, "src")
    os.makedirs(a.out, exist_ok=True)
    weights = hf_weights()
    results = {}
    for fmt in formats:
        base = fmt if fmt in OURS else "f32"
        gguf_path = os.path.join(a.out, f"model-{base}.gguf")
        if not os.path.exists(gguf_path):
            log(f"writing {gguf_path}")
            write_gguf(weights, base, gguf_path, src_dir)
        if fmt in QUANT:
            qpath = os.path.join(a.out, f"model-{fmt}.gguf")
            if not os.path.exists(qpath):
                pure = ["--pure"] if fmt in PURE else []
                run([f"{bin_dir}/llama-quantize"] + pure + [gguf_path, qpath, QUANT[fmt], str(a.threads)])
            gguf_path = qpath
        theirs, ours = [], []
        if fmt in OURS or fmt in OUR_QUANT:
            d = os.path.join(a.out, f"astrai-{fmt}")
            if not os.path.exists(os.path.join(d, "config.json")):
                if fmt in OURS:
                    write_ours(weights, fmt, d)
                else:
                    f32_dir = os.path.join(a.out, "astrai-f32")
                    if not os.path.exists(os.path.join(f32_dir, "config.json")):
                        write_ours(weights, "f32", f32_dir)
                    run([a.astrai, "quantize", "--model", f32_dir, "--type", fmt, "--output", d])
        else:  # llama.cpp's own mixture (Q4_K_M): we run the same GGUF file
            d = gguf_path
        for _ in range(max(1, a.rounds)):  # alternately: both sides meet the host in the same states
            theirs.append(llama_side(bin_dir, gguf_path, a.threads, not a.no_batched))
            ours.append(our_side(a.astrai, d, a.threads, not a.no_batched))
        r = {"llama.cpp": best_of(theirs), "astrai": best_of(ours)}
        results[fmt] = r
        log(fmt, json.dumps(r))
        if fmt == "bf16" and a.bf16_dot:
            env = dict(os.environ, ASTRAI_BF16_DOT="1")
            results["bf16 --bf16-dot"] = {
                "llama.cpp": r["llama.cpp"],
                "astrai": best_of([our_side(a.astrai, d, a.threads, not a.no_batched, env) for _ in range(max(1, a.rounds))])}
            log("bf16 --bf16-dot", json.dumps(results["bf16 --bf16-dot"]))
    report = {"cpu": cpu_model(), "threads": a.threads, "date": time.strftime("%Y-%m-%d"), "results": results,
              "activations": a.activations, "rounds": max(1, a.rounds), "level": a.level}
    with open(os.path.join(a.out, results_name), "w") as f:
        json.dump(report, f, indent=1)
    kern = next((r["astrai"]["kernels"] for r in results.values() if "astrai" in r), "?")
    rounds = f", best of {report['rounds']} alternating rounds per side" if report["rounds"] > 1 else ""
    level = "" if a.level == "native" else f", level {a.level} on both sides"
    print(f"{report['cpu']}, {a.threads} threads{level}, AstrAI kernels {kern}, quantized weights times {a.activations} "
          f"activations{rounds}, {report['date']}\n")
    print_tables(results, not a.no_batched)


if __name__ == "__main__":
    main()
