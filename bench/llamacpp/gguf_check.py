#!/usr/bin/python3
"""GGUF files read by AstrAI and by llama.cpp itself (libllama, the build of build.sh) must agree.

For each file, both sides score the same token sequences: llama.cpp through llama_logits.cpp (its
public API: llama_tokenize, llama_decode, every position's logits; f32 KV cache, no flash attention)
and AstrAI through `astrai score --model FILE.gguf --dump-logits`. Reported per file: whether the two
tokenize the texts to the same ids, the share of positions whose top-1 token is the same, and the
largest difference of a log-probability (log-softmax of the logits, over the whole vocabulary).
Files:
  * random-weight models of tests/model/gguf_oracle.py (llama with GQA, llama with biases and tied
    embeddings, qwen2 with biases and linear RoPE scaling, qwen3 with qk-norm, llama with llama3 RoPE
    scaling as per-pair frequency factors, llama with widths for Q4_K) written by gguf-py in F32, F16,
    BF16, Q8_0 and Q4_0 (and Q4_K, Q5_K, Q6_K blocks from `astrai quantize`, alone and mixed),
    q/k permuted as llama.cpp's converter does;
  * F32 llama files requantized by llama.cpp's own `llama-quantize --pure` to Q8_0, Q4_0, Q4_K, Q5_K
    and Q6_K, and to its default Q4_K_M and Q5_K_M mixtures (Q4_K or Q5_K with Q6_K tensors in one
    file; on a model whose widths are not multiples of 256, its fallbacks Q5_0, Q5_1 and Q8_0);
  * Q4_1, Q5_0 and Q5_1 files written by gguf-py (we rewrite those types in memory);
  * small llama models carrying real vocabularies (Llama-3, Qwen3 and GPT-4o byte-level BPE, Llama-2
    SentencePiece), scored on texts that each side tokenizes itself.
For the random-weight files a third party computes the exact answer: PyTorch on the values the
file holds (read back and dequantized by gguf-py). The error measure is the largest log-probability
difference divided by the largest |logit| of the row (a relative error; tied embeddings make logits
large). A file passes when our logits are within 1e-5 of PyTorch's and our top-1 token equals
llama.cpp's wherever llama.cpp's top two logits are further apart than its own error from PyTorch;
llama.cpp's error is reported next to ours. (In F32 the two agree to about 5e-7; in 16 bits and in
Q8_0/Q4_0 llama.cpp rounds the activations to 16 or 8 bits before its dot products, while we widen
the weights exactly (`--activations f32`, set here), so there llama.cpp is the one further from
the exact answer.)
Usage: bench/llamacpp/gguf_check.py [--llamacpp DIR] [--astrai BIN] [--json OUT] [--only NAME-PART] [--converted-only]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "model"))
TOL = 1e-5  # ours vs PyTorch on the file's values, relative to the largest |logit|


def log_softmax(x):
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def build_driver(llamacpp, out):
    src = os.path.join(ROOT, "bench", "llamacpp", "llama_logits.cpp")
    if os.path.exists(out) and os.path.getmtime(out) > os.path.getmtime(src):
        return out
    lib = os.path.join(llamacpp, "build", "bin")
    subprocess.run(["g++", "-O2", "-std=c++17", src, "-I" + os.path.join(llamacpp, "src", "include"),
                    "-I" + os.path.join(llamacpp, "src", "ggml", "include"), "-L" + lib, "-lllama", "-lggml",
                    "-lggml-base", "-Wl,-rpath," + lib, "-o", out], check=True)
    return out


def llama_side(driver, model, lines, tmp):
    """[(ids, logits [n, vocab])] for each line ("ids ..." or "hex ...") by libllama."""
    out = tempfile.mkdtemp(dir=tmp)
    subprocess.run([driver, model, out], input="\n".join(lines) + "\n", text=True, check=True,
                   capture_output=True)
    res = []
    for k in range(len(lines)):
        ids = [int(x) for x in open(os.path.join(out, "%d.ids" % k)).read().split()]
        logits = np.fromfile(os.path.join(out, "%d.f32" % k), dtype=np.float32).reshape(len(ids), -1)
        res.append((ids, logits))
    return res


def our_side(astrai, model, ids, tmp):
    out = os.path.join(tmp, "ours.npy")
    subprocess.run([astrai, "score", "--model", model, "--ids", ",".join(map(str, ids)), "--dump-logits", out],
                   check=True, capture_output=True, env=dict(os.environ, OMP_NUM_THREADS="2"))
    return np.load(out).reshape(len(ids), -1)


def our_ids(astrai, model, texts, tmp):
    inp = os.path.join(tmp, "texts.jsonl")
    with open(inp, "w") as f:
        for t in texts:
            f.write(json.dumps({"text": t}) + "\n")
    r = subprocess.run([astrai, "tokenize", "--tokenizer", model, "--batch-jsonl", inp], check=True,
                       capture_output=True, text=True)
    return [json.loads(line)["ids"] for line in r.stdout.splitlines()]


def rel(a, b):
    """max over rows of max |log_softmax(a) - log_softmax(b)| / max |b|."""
    la, lb = log_softmax(a), log_softmax(b)
    return float((np.abs(la - lb).max(axis=-1) / np.abs(b).max(axis=-1)).max())


def compare(name, ttype, triples, same_ids=None):
    """triples: [(llama.cpp logits, our logits, exact logits or None)] of the same sequences."""
    ours_err = llama_err = ours_llama = 0.0
    agree = decided = positions = 0
    for theirs, ours, exact in triples:
        n = len(theirs)
        ours = ours[:n, :theirs.shape[1]]
        ours_llama = max(ours_llama, rel(ours, theirs))
        margin = TOL
        if exact is not None:
            ours_err = max(ours_err, rel(ours, exact))
            llama_err = max(llama_err, rel(theirs, exact))
            margin = max(TOL, 2 * rel(theirs, exact))
        scale = np.abs(theirs).max(axis=-1)
        top2 = np.sort(theirs, axis=-1)[:, -2:]
        clear = (top2[:, 1] - top2[:, 0]) > margin * scale
        same = theirs.argmax(-1) == ours.argmax(-1)
        agree += int(same.sum())
        decided += int((same | ~clear).sum())
        positions += n
    if triples[0][2] is None:  # no exact answer: the two must agree as f32 does
        ok = ours_llama <= TOL and decided == positions and same_ids is not False
    else:
        ok = ours_err <= TOL and decided == positions and same_ids is not False
    row = {"file": name, "type": ttype, "positions": positions, "top1_agree": agree / positions,
           "ours_vs_llamacpp": ours_llama, "ours_vs_pytorch": ours_err if triples[0][2] is not None else None,
           "llamacpp_vs_pytorch": llama_err if triples[0][2] is not None else None, "same_token_ids": same_ids,
           "ok": ok}
    exact = "" if triples[0][2] is None else ", vs PyTorch: ours %.1e, llama.cpp %.1e" % (ours_err, llama_err)
    print("%-4s %-28s %-5s top-1 %5.1f%% of %4d, ours vs llama.cpp %.1e%s%s" % (
        "ok" if ok else "FAIL", name, ttype, 100 * agree / positions, positions, ours_llama, exact,
        "" if same_ids is None else ", token ids %s" % ("equal" if same_ids else "DIFFER")))
    return row


def score_texts(a, driver, path, tmp, texts, label, cfg=None):
    """Texts each side tokenizes itself, scored by both (PyTorch on the file's values too, given
    the model's cfg): the compare() triples and whether the token ids were the same."""
    import gguf_oracle as go
    import oracle_forward as of
    theirs = llama_side(driver, path, ["hex " + t.encode().hex() for t in texts], tmp)
    ours_ids = our_ids(a.astrai, path, texts, tmp)
    same = [t[0] == o for t, o in zip(theirs, ours_ids)]
    for text, t, o in zip(texts, theirs, ours_ids):
        if t[0] != o:
            print("     %s %r: llama.cpp %s, ours %s" % (label, text, t[0][:16], o[:16]))
    held = go.held_values(path, cfg) if cfg is not None else None
    triples = [(t[1], our_side(a.astrai, path, t[0], tmp),
                of.torch_forward(of.Cfg(cfg), held, t[0]).numpy() if cfg is not None else None) for t in theirs]
    return triples, all(same)


def converted_files(a, driver, tmp, texts):
    """Our HF checkpoints (tests/model/gguf_converter_oracle.py's models, real vocabularies) converted by
    llama.cpp's own convert_hf_to_gguf.py, scored by both programs on texts."""
    import gguf_converter_oracle as co
    rows = []
    converter = os.path.join(a.llamacpp, "src", "convert_hf_to_gguf.py")
    for name in ({} if a.only else co.MODELS):
        d = os.path.join(tmp, "hf_" + name)
        cfg = co.make_checkpoint(name, d, tmp)
        for ttype in co.OUTTYPES.get(name, ["f32"]):
            path = os.path.join(tmp, "converted_%s_%s.gguf" % (name, ttype))
            co.convert(converter, d, path, ttype)
            triples, same = score_texts(a, driver, path, tmp, texts, name, cfg)
            rows.append(compare("%s (convert_hf_to_gguf.py)" % name, ttype.upper(), triples, same))
            os.remove(path)
        shutil.rmtree(d, ignore_errors=True)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llamacpp", default=os.path.join(ROOT, "build", "llamacpp"),
                    help="llama.cpp clone + build of bench/llamacpp/build.sh (default build/llamacpp)")
    ap.add_argument("--astrai", default=os.path.join(ROOT, "build", "release", "src", "astrai"))
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--only", help="only the random-weight models whose name contains this (no vocabularies)")
    ap.add_argument("--converted-only", action="store_true",
                    help="only our HF checkpoints converted by llama.cpp's convert_hf_to_gguf.py")
    a = ap.parse_args()
    sys.path.insert(0, os.path.join(a.llamacpp, "src", "gguf-py"))
    os.environ["ASTRAI_BIN"] = a.astrai  # for the test helpers below
    # The exact answer (PyTorch on the file's values) is the yardstick: quantized weights times f32
    # activations, not the x86 default q8 (whose agreement with llama.cpp is docs/quantization.md's
    # KL table).
    os.environ["ASTRAI_ACTIVATIONS"] = "f32"
    import gguf
    import gguf_oracle as go
    import oracle_forward as of
    go.gguf = gguf
    tmp = tempfile.mkdtemp(prefix="astrai_gguf_check_")
    driver = build_driver(a.llamacpp, os.path.join(a.llamacpp, "llama_logits"))
    rows = []
    seqs = lambda v: [[(7 * i + 3) % v for i in range(1, 40)], [(11 * i + 5) % v for i in range(1, 12)]]  # noqa

    def score_all(path, cfg, ids_list):
        theirs = llama_side(driver, path, ["ids " + " ".join(map(str, s)) for s in ids_list], tmp)
        held = go.held_values(path, cfg)
        return [(t[1], our_side(a.astrai, path, s, tmp), of.torch_forward(of.Cfg(cfg), held, s).numpy())
                for t, s in zip(theirs, ids_list)]

    for name, cfg in go.MODELS.items():
        if a.converted_only or (a.only and a.only not in name):
            continue
        c = of.Cfg(cfg)
        W = of.random_weights(c)
        pure_k = ["Q4_K", "Q5_K", "Q6_K"] if name == "llama_q4_k" else []
        mixed_k = ["Q4_K_M", "Q5_K_M"] if name == "llama_q4_k" else []
        k_quants = pure_k + mixed_k
        for ttype in ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"] + k_quants:
            path = os.path.join(tmp, "%s_%s.gguf" % (name, ttype))
            go.write_model_gguf(path, cfg, W, ttype, blocks=go.k_quant_blocks(cfg, W, tmp, ttype) if ttype in k_quants else None)
            rows.append(compare(name, ttype, score_all(path, cfg, seqs(c.vocab))))
            if name in ("llama_gqa", "llama_q4_k") and ttype == "F32":
                # --pure: every matrix of the type; Q4_K_M, Q5_K_M: llama.cpp's default mixtures (with Q6_K)
                # llama_gqa's widths (128) are not multiples of 256: its Q4_K_M and Q5_K_M fall back to
                # Q5_0 / Q5_1 (and Q8_0 for Q6_K) in every matrix, as for Qwen2.5-0.5B's hidden 896.
                mixed = ["Q4_K_M", "Q5_K_M"]
                for q, pure in [(t, ["--pure"]) for t in ["Q8_0", "Q4_0"] + pure_k] + [(t, []) for t in mixed]:
                    qpath = os.path.join(tmp, "%s_llama-quantize_%s.gguf" % (name, q))
                    subprocess.run([os.path.join(a.llamacpp, "build", "bin", "llama-quantize")] + pure + [path, qpath, q],
                                   check=True, capture_output=True)
                    label = name + (" (llama-quantize --pure)" if pure else " (llama-quantize)")
                    rows.append(compare(label, q, score_all(qpath, cfg, seqs(c.vocab))))

    texts = go.TEXTS
    for vocab, (kind, pre) in ({} if a.only or a.converted_only else go.VOCABS).items():
        path = os.path.join(tmp, "vocab_%s.gguf" % vocab)
        cfg = of.base("llama", vocab_size=go.vocab_size(go.vocab_dir(vocab)), num_hidden_layers=1)
        go.write_model_gguf(path, cfg, of.random_weights(of.Cfg(cfg)), "F32", (kind, pre, go.vocab_dir(vocab)))
        triples, same = score_texts(a, driver, path, tmp, texts, vocab)
        rows.append(compare("%s vocabulary (%d texts)" % (vocab, len(texts)), "F32", triples, same))
    rows += converted_files(a, driver, tmp, texts)
    if a.json:
        json.dump(rows, open(a.json, "w"), indent=1)
    shutil.rmtree(tmp, ignore_errors=True)
    bad = [r for r in rows if not r["ok"]]
    print("%d of %d files agree" % (len(rows) - len(bad), len(rows)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
