#!/usr/bin/python3
"""Oracle test of `astrai quantize --type q8_0|q4_0` and of loading quantized checkpoints, against
llama.cpp's own Python package (gguf-py, from the llama.cpp source in node-llama-cpp's git
bundle, assets/npm/node-llama-cpp/llama/gitRelease.bundle) and PyTorch.
Per random-weight model (f32, bf16 and f16 checkpoints; MHA/GQA/MQA, tied, biases, qk-norm, MLA):
  * every matrix written is byte for byte what gguf-py's Q8_0 / Q4_0 quantizer (bit-exact with
    ggml-quants.c's reference) makes of the same values; vectors are kept as f32, exactly;
  * `astrai score` logits of the quantized checkpoint equal, bit for bit, those of an f32 checkpoint
    holding gguf-py's dequantization of the same blocks (chunked paged prefill too), on every
    CPU level this machine runs; greedy generations are the same tokens;
  * those logits are within 1e-4 of PyTorch on the dequantized weights;
  * `astrai info` names the format; bad inputs fail with clear messages.
Usage: quantize_oracle.py   (ASTRAI_BIN names the binary, ASTRAI_ASSETS the assets directory)
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import oracle_forward as of  # noqa: E402

ASSETS = os.environ.get("ASTRAI_ASSETS", os.path.join(HERE, "..", "..", "assets"))
BUNDLE = os.path.join(ASSETS, "npm", "node-llama-cpp", "llama", "gitRelease.bundle")
MODELS = ["llama_mha_bias_tied_sharded", "qwen3_qknorm_mqa8_dynamic_bf16", "mistral_gqa8_f16", "arlm_mla_gate"]
# How far the quantized model's logits may be from the unquantized model's (max |diff| / max |ref|):
# quantization is lossy; these bounds only catch a broken format (observed: q8_0 ~0.02, q4_0 ~0.2).
LOSSY_BOUND = {"q8_0": 0.1, "q4_0": 0.6}
check = of.check


def gguf_py(tmp):
    """Imports gguf-py from a checkout of the llama.cpp bundle (only its gguf-py folder)."""
    src = os.path.join(tmp, "llama.cpp")
    subprocess.run(["git", "clone", "-q", "--no-checkout", BUNDLE, src], check=True)
    subprocess.run(["git", "-C", src, "-c", "advice.detachedHead=false", "checkout", "-q", "HEAD", "--", "gguf-py"],
                   check=True)
    sys.path.insert(0, os.path.join(src, "gguf-py"))
    from gguf import quants, GGMLQuantizationType  # noqa: E402
    return quants, {"q8_0": GGMLQuantizationType.Q8_0, "q4_0": GGMLQuantizationType.Q4_0}


def read_raw(path):
    """name -> (dtype, shape, bytes) of every tensor of a safetensors file."""
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    return {k: (v["dtype"], v["shape"], data[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in header.items() if k != "__metadata__"}


def levels():
    info = json.loads(of.run(["info", "--json"]).stdout)["cpu"]
    return info["levels_supported"]


def score_at(level, d, seqs, tmp, extra=()):
    old = os.environ.get("ASTRAI_CPU_ISA")
    os.environ["ASTRAI_CPU_ISA"] = level
    try:
        return of.score(d, seqs, tmp, extra)[0]
    finally:
        if old is None:
            os.environ.pop("ASTRAI_CPU_ISA")
        else:
            os.environ["ASTRAI_CPU_ISA"] = old


def greedy(d, seqs, tmp):
    inp, outp = os.path.join(tmp, "in.jsonl"), os.path.join(tmp, "out.jsonl")
    with open(inp, "w") as f:
        for s in seqs:
            f.write(json.dumps({"prompt_ids": s, "max_tokens": 10, "ignore_eos": True, "logprobs": 2}) + "\n")
    of.run(["generate", "--model", d, "--input-file", inp, "--output-file", outp, "--temperature", "0",
            "--include-ids"])
    return open(outp).read()


def test_model(name, fmt, quants, qtype, tmp, lv):
    cfg_json, dtype, shards, ref_names = of.MODELS[name]
    # Room for the generations (the dynamic-RoPE model's context is 16 in oracle_forward.py).
    cfg_json = dict(cfg_json, max_position_embeddings=max(cfg_json.get("max_position_embeddings", 256), 256))
    c = of.Cfg(cfg_json)
    W = of.random_weights(c)
    names = [n for n, _, _ in of.param_shapes(c)]
    stored = lambda n: of.reference_name(n) if ref_names else n  # noqa: E731
    src, q, deq = (os.path.join(tmp, name + s) for s in ("", "_" + fmt, "_deq"))
    name = "%s %s" % (name, fmt)
    of.save_model(src, cfg_json, [(stored(n), W[n]) for n in names], dtype, shards)
    r = of.run(["quantize", "--model", src, "--output", q, "--type", fmt])
    check("quantized" in r.stdout and "MiB" in r.stdout, "%s: quantize reports what it did: %s" % (name, r.stdout.strip()))

    raw = read_raw(os.path.join(q, "model.safetensors"))
    cfg = json.load(open(os.path.join(q, "config.json")))
    check(cfg.get("quantization_config") == {"quant_method": "astrai", "format": fmt},
          "%s: config.json names the format" % name)
    deq_tensors, same, matrices = [], True, 0
    for n in names:
        values = of.rounded(W[n], dtype).numpy().astype(np.float32)  # what the checkpoint holds
        dt, shape, b = raw[stored(n)]
        if values.ndim == 2 and values.shape[1] % 32 == 0:
            matrices += 1
            want = quants.quantize(values, qtype)  # uint8 [rows, cols / 32 * block bytes]
            ok = dt == "U8" and list(shape) == list(want.shape) and b == want.tobytes()
            if not ok:
                print("  %s: %s %s differs from gguf-py's %s" % (n, dt, shape, list(want.shape)))
            same &= ok
            deq_tensors.append((stored(n), torch.from_numpy(quants.dequantize(want, qtype).reshape(values.shape))))
        else:
            same &= dt == "F32" and b == values.tobytes()
            deq_tensors.append((stored(n), torch.from_numpy(values)))
    check(same and matrices > 0, "%s: %d matrices are gguf-py's %s bytes, the vectors f32 as stored"
          % (name, matrices, fmt.upper()))
    of.save_model(deq, cfg_json, deq_tensors, "F32")

    seqs = [[(7 * i + 3) % c.vocab for i in range(1, 30)], [(11 * i + 5) % c.vocab for i in range(1, 9)]]
    want = score_at("auto", deq, seqs, tmp)
    for level in lv:
        got = score_at(level, q, seqs, tmp)
        check(got.tobytes() == want.tobytes(), "%s: logits (%s) == f32 logits of the dequantized weights" % (name, level))
    chunked = score_at("auto", q, seqs, tmp, ["--chunk", "5", "--page-size", "4"])
    check(chunked.tobytes() == want.tobytes(), "%s: chunked paged prefill, bit-identical" % name)
    check(greedy(q, seqs, tmp) == greedy(deq, seqs, tmp), "%s: greedy tokens and log-probs identical" % name)

    Wd = {n: t for n, (_, t) in zip(names, deq_tensors)}
    ref = of.torch_forward(c, Wd, seqs[0]).numpy()
    ours = score_at("auto", q, [seqs[0]], tmp)
    err = of.rel_err(ours.reshape(ref.shape), ref)
    check(err < of.TOL, "%s: logits vs PyTorch on the dequantized weights: rel err %.2e" % (name, err))
    lossy = of.rel_err(ours.reshape(ref.shape), of.torch_forward(c, {n: of.rounded(W[n], dtype) for n in names},
                                                                   seqs[0]).numpy())
    check(0 < lossy < LOSSY_BOUND[fmt], "%s: and %.2e from the unquantized model (lossy, not broken)" % (name, lossy))
    return src, q


def test_errors(src, q, tmp):
    r = of.run(["info", "--model", q], expect_ok=False)
    check(r.returncode == 0 and "q8_0" in r.stdout, "info names the q8_0 format")
    r = of.run(["quantize", "--model", src, "--output", os.path.join(tmp, "x"), "--type", "q4_k"], expect_ok=False)
    check(r.returncode != 0 and "q4_k" in r.stderr, "an unimplemented --type is refused: %s" % r.stderr.strip()[:120])
    r = of.run(["quantize", "--model", src, "--output", src], expect_ok=False)
    check(r.returncode != 0 and "--output" in r.stderr, "quantizing into the source directory is refused")
    r = of.run(["train", "--model", q, "--data", os.path.join(tmp, "none"), "--output", os.path.join(tmp, "t")],
               expect_ok=False)
    check(r.returncode != 0 and "cannot be trained" in r.stderr, "training a q8_0 checkpoint is refused: %s"
          % r.stderr.strip()[-160:])
    # A quantized checkpoint re-quantized: copied unchanged.
    r2 = os.path.join(tmp, "requant")
    of.run(["quantize", "--model", q, "--output", r2])
    check(open(os.path.join(q, "model.safetensors"), "rb").read() == open(os.path.join(r2, "model.safetensors"), "rb").read(),
          "re-quantizing a q8_0 checkpoint leaves its bytes unchanged")
    # Corrupt checkpoints: an unknown format, and a matrix whose byte shape is not whole blocks.
    bad = os.path.join(tmp, "bad_format")
    shutil.copytree(q, bad)
    cfg = json.load(open(os.path.join(bad, "config.json")))
    cfg["quantization_config"] = {"quant_method": "gptq", "bits": 4}
    json.dump(cfg, open(os.path.join(bad, "config.json"), "w"))
    r = of.run(["score", "--model", bad, "--ids", "1,2,3"], expect_ok=False)
    check(r.returncode != 0 and "quantization_config" in r.stderr, "an unknown quantization_config is refused: %s"
          % r.stderr.strip()[-160:])
    bad = os.path.join(tmp, "bad_shape")
    os.makedirs(bad)
    shutil.copy(os.path.join(q, "config.json"), bad)
    tensors = read_raw(os.path.join(q, "model.safetensors"))
    cut = next(k for k, (dt, _, _) in tensors.items() if dt == "U8")  # one block fewer per row
    dt, shape, b = tensors[cut]
    rows, cols = shape[0], shape[1] - 34
    tensors[cut] = (dt, [rows, cols], b"".join(b[r * shape[1]:r * shape[1] + cols] for r in range(rows)))
    of.st.write_safetensors(os.path.join(bad, "model.safetensors"), [(k,) + v for k, v in tensors.items()])
    r = of.run(["score", "--model", bad, "--ids", "1,2,3"], expect_ok=False)
    check(r.returncode != 0 and cut in r.stderr and "Q8_0" in r.stderr,
          "a Q8_0 matrix of the wrong byte shape is named: %s" % r.stderr.strip()[-200:])


def main():
    if not os.path.exists(BUNDLE):
        print("FAIL llama.cpp source bundle not found at %s (scripts/fetch-assets.sh)" % BUNDLE)
        return 1
    tmp = tempfile.mkdtemp(prefix="astrai_q8_")
    try:
        quants, qtypes = gguf_py(tmp)
        lv = levels()
        print("levels: %s" % ", ".join(lv))
        outs = {}
        for name in MODELS:
            for fmt, qtype in qtypes.items():
                outs[fmt] = test_model(name, fmt, quants, qtype, tmp, lv)
        r = of.run(["info", "--model", outs["q4_0"][1]], expect_ok=False)
        check(r.returncode == 0 and "q4_0" in r.stdout, "info names the q4_0 format")
        test_errors(*outs["q8_0"], tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if of.FAILURES:
        print("%d check(s) failed" % len(of.FAILURES))
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
