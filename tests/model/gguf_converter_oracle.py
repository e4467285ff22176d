#!/usr/bin/python3
"""Oracle test: checkpoints in the Hugging Face layout, converted to GGUF by llama.cpp's own converter
(convert_hf_to_gguf.py and its conversion/ package, from the llama.cpp source in node-llama-cpp's
git bundle), read by `astrai --model FILE.gguf`.

The checkpoints are ours: random weights in the HF layout (oracle_forward.py), and one written by
`astrai train` after two updates, carrying real
vocabularies (Llama-3, also with the BOS post-processor of Meta's files, Qwen3, GPT-4o tokenizer.json
and tokenizer_config.json). The converter runs
as written, through transformers_standin/ (config.json and the official tokenizers library in place
of the `transformers` package, which cannot be installed here; see its docstring) with Debian's
PyTorch, sentencepiece and tqdm. For every architecture the converter and we share (llama with GQA,
llama with llama3 RoPE scaling, mistral, qwen2 with biases and tied embeddings, qwen3 with qk-norm):
  * --outtype f32: `astrai score` logits of the converted file equal, bit for bit, those of the
    checkpoint it came from (the converter's q/k permutation, names and metadata undone exactly);
  * --outtype f16, bf16, q8_0 (the converter's own writers and quantizer; llama and qwen2): the
    logits equal, bit for bit, those of an f32 checkpoint of the values the file holds (dequantized
    by gguf-py);
  * the vocabulary the converter wrote (its pre-tokenizer name found by its own hash of the
    official library's ids) encodes texts to the official library's ids and decodes them to the
    library's text (the texts llama.cpp makes control tokens made special on the library's side,
    as in gguf_oracle.py); the chat template it copied renders the checkpoint's prompt.
The same converted files against llama.cpp's inference: bench/llamacpp/gguf_check.py.
Usage: gguf_converter_oracle.py [--only NAME-PART]   (ASTRAI_BIN, ASTRAI_ASSETS as the other oracles)
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "transformers_standin"))
import gguf_oracle as go  # noqa: E402
import oracle_forward as of  # noqa: E402
import quantize_oracle as qo  # noqa: E402

check = of.check
RUNNER = os.path.join(HERE, "transformers_standin", "run_converter.py")
ARCHS = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
         "qwen3": "Qwen3ForCausalLM"}
# name -> (vocabulary, HF config without vocab_size); small widths, the vocabularies' real sizes.
MODELS = {
    "llama_gqa": ("llama3_bos", of.base("llama", num_attention_heads=4, num_key_value_heads=2, rope_theta=500000.0)),
    "llama3_rope_scaling": ("llama3", dict(of.MODELS["llama_gqa4_llama3"][0], num_hidden_layers=1)),
    "mistral_mqa": ("gpt4o", of.base("mistral", num_attention_heads=4, num_key_value_heads=1, sliding_window=None,
                                     num_hidden_layers=1)),
    "qwen2_bias_tied": ("qwen3", of.base("qwen2", hidden_size=96, num_attention_heads=6, num_key_value_heads=2,
                                         rope_theta=1000000.0, tie_word_embeddings=True)),
    "qwen3_qknorm": ("qwen3", of.base("qwen3", num_attention_heads=8, num_key_value_heads=1, head_dim=24,
                                      num_hidden_layers=1)),
    # Written by `astrai train` itself (2 updates from a fresh model), not by this script.
    "qwen3_trained": ("qwen3", of.base("qwen3", num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                       tie_word_embeddings=True)),
}
TRAINED = {"qwen3_trained"}
# f32 for every model; the converter's 16- and 8-bit writers on a permuted llama and a tied qwen2.
OUTTYPES = {"llama_gqa": ["f32", "f16", "bf16", "q8_0"], "qwen2_bias_tied": ["f32", "f16", "bf16", "q8_0"]}


def converter_source(tmp):
    """The converter, its conversion/ package and gguf-py, checked out of the bundle."""
    src = os.path.join(tmp, "llama.cpp")
    subprocess.run(["git", "clone", "-q", "--no-checkout", qo.BUNDLE, src], check=True)
    subprocess.run(["git", "-C", src, "-c", "advice.detachedHead=false", "checkout", "-q", "HEAD", "--", "gguf-py",
                    "convert_hf_to_gguf.py", "conversion"], check=True)
    sys.path.insert(0, os.path.join(src, "gguf-py"))
    return os.path.join(src, "convert_hf_to_gguf.py")


def convert(converter, model_dir, out, outtype):
    r = subprocess.run([sys.executable, RUNNER, converter, model_dir, "--outfile", out, "--outtype", outtype],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise AssertionError("convert_hf_to_gguf.py %s --outtype %s failed:\n%s" % (model_dir, outtype, r.stderr[-3000:]))


def tokenizer_dir(vocab, tmp):
    """The vocabulary's tokenizer files. "llama3_bos": Llama-3's with the BOS post-processor of Meta's
    own tokenizer.json (the asset's adds none, which llama.cpp's converter names "smaug-bpe")."""
    if vocab != "llama3_bos":
        return go.vocab_dir(vocab)
    out = os.path.join(tmp, "tok_llama3_bos")
    if not os.path.isdir(out):
        shutil.copytree(go.vocab_dir("llama3"), out)
        tj = json.load(open(os.path.join(out, "tokenizer.json")))
        bos = "<|begin_of_text|>"
        seq = lambda x: {"Sequence": {"id": x, "type_id": 0}}  # noqa: E731
        tj["post_processor"] = {"type": "Sequence", "processors": [
            tj["post_processor"],
            {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, seq("A")],
             "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, seq("A"),
                      {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
             "special_tokens": {bos: {"id": bos, "ids": [128000], "tokens": [bos]}}}]}
        json.dump(tj, open(os.path.join(out, "tokenizer.json"), "w"))
    return out


def hf_checkpoint(d, vocab, cfg, tmp):
    """Writes our random-weight checkpoint with the vocabulary's files; returns its config."""
    tok = tokenizer_dir(vocab, tmp)
    cfg = dict(cfg, vocab_size=go.vocab_size(tok), architectures=[ARCHS[cfg["model_type"]]])
    c = of.Cfg(cfg)
    W = of.random_weights(c)
    of.save_model(d, cfg, [(name, W[name]) for name, _, _ in of.param_shapes(c)], "F32")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tok, f), d)
    return cfg


def trained_checkpoint(d, vocab, cfg, tmp):
    """`astrai train` (2 updates of a fresh model on a short text) writes the checkpoint to d."""
    tok = tokenizer_dir(vocab, tmp)
    work = d + "_work"
    os.makedirs(work)
    json.dump(dict(cfg, vocab_size=go.vocab_size(tok)), open(os.path.join(work, "config.json"), "w"))
    with open(os.path.join(work, "text.txt"), "w") as f:
        f.write("The quick brown fox jumps over the lazy dog. Ünïcödé, 日本語, 12345. " * 40)
    data = os.path.join(work, "data")
    of.run(["preprocess", "--tokenizer", tok, "--input", os.path.join(work, "text.txt"), "--format", "text",
            "--output", data, "--seq-len", "32", "--quiet"])
    of.run(["train", "--data", data, "--config", os.path.join(work, "config.json"), "--tokenizer", tok, "--output", d,
            "--batch-size", "2", "--seq-len", "32", "--max-steps", "2", "--no-progress"])
    shutil.rmtree(work)
    return json.load(open(os.path.join(d, "config.json")))


def make_checkpoint(name, d, tmp):
    vocab, cfg = MODELS[name]
    return (trained_checkpoint if name in TRAINED else hf_checkpoint)(d, vocab, cfg, tmp)


def test_model(name, converter, tmp, seqs_for):
    d = os.path.join(tmp, name)
    cfg = make_checkpoint(name, d, tmp)
    seqs = seqs_for(cfg["vocab_size"])
    want = qo.score_at("auto", d, seqs, tmp)
    ref_cfg = dict(cfg)
    llama3 = (cfg.get("rope_scaling") or {}).get("rope_type") == "llama3"
    if llama3:  # the file holds per-pair factors: the reference too, as in gguf_oracle.py
        ref_cfg["rope_scaling"] = {"rope_type": "freq_factors",
                                   "freq_factors": [float(x) for x in go.llama3_freq_factors(cfg)]}
    for outtype in OUTTYPES.get(name, ["f32"]):
        path = os.path.join(tmp, "%s_%s.gguf" % (name, outtype))
        convert(converter, d, path, outtype)
        got = qo.score_at("auto", path, seqs, tmp)
        if outtype == "f32" and not llama3:
            check(got.tobytes() == want.tobytes(),
                  "%s: logits of the converter's f32 file == the checkpoint's, bit for bit" % name)
        else:
            held = go.held_values(path, cfg)
            ref = os.path.join(tmp, "%s_%s_ref" % (name, outtype))
            of.save_model(ref, ref_cfg, [(n, held[n]) for n, _, _ in of.param_shapes(of.Cfg(cfg))], "F32")
            check(got.tobytes() == qo.score_at("auto", ref, seqs, tmp).tobytes(),
                  "%s: logits of the converter's %s file == f32 logits of the values it holds" % (name, outtype))
        if outtype == "f32" and llama3:
            # llama3 scaling as the file's per-pair factors: each frequency divided by its factor in
            # f32 where the checkpoint's formula scales it in one step; the logits agree closely.
            err = of.rel_err(got, want)
            check(err < of.TOL, "%s: f32 file against the checkpoint (llama3 scaling as rope_freqs): rel err %.1e"
                  % (name, err))
    return d, os.path.join(tmp, "%s_f32.gguf" % name)


def test_vocab(name, d, path, tmp):
    """The converted file's tokenizer against the official library on the checkpoint's tokenizer.json."""
    import transformers  # the stand-in: the official tokenizers library
    # llama.cpp makes some texts control tokens whatever the file says ("</s>" in Qwen's vocabulary),
    # and the GGUF reader follows it: the library reads a tokenizer.json with those tokens special.
    hf = transformers.AutoTokenizer.from_pretrained(go.with_control_texts(tokenizer_dir(MODELS[name][0], tmp), tmp, name))
    ours = go.tokenize(path, go.TEXTS, tmp)
    same_ids = [hf.encode(t) == o["ids"] for t, o in zip(go.TEXTS, ours)]
    for t, o, ok in zip(go.TEXTS, ours, same_ids):
        if not ok:
            print("  %s %r: tokenizers %s, GGUF %s" % (name, t, hf.encode(t)[:16], o["ids"][:16]))
    f = go.gguf.GGUFReader(path).fields["tokenizer.ggml.pre"]
    pre = bytes(f.parts[f.data[0]]).decode()
    check(all(same_ids), "%s: the converted vocabulary (pre-tokenizer %s) encodes %d texts to the official library's ids"
          % (name, pre, len(go.TEXTS)))
    check(all(hf.decode(o["ids"]) == o["decoded"] for o in ours),
          "%s: and decodes them to the library's text" % name)
    msgs = os.path.join(tmp, "messages.json")
    json.dump([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"},
               {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}], open(msgs, "w"))
    if not isinstance(json.load(open(os.path.join(d, "tokenizer_config.json"))).get("chat_template"), str):
        return  # GPT-4o's files carry none
    args = ["chat-template", "--messages", msgs, "--add-generation-prompt"]
    a, b = of.run(args + ["--tokenizer", d]).stdout, of.run(args + ["--tokenizer", path]).stdout
    check(a == b and len(a) > 20, "%s: the chat template the converter copied renders the same prompt" % name)


def main():
    if not os.path.exists(qo.BUNDLE):
        print("FAIL llama.cpp source bundle not found at %s (scripts/fetch-assets.sh)" % qo.BUNDLE)
        return 1
    os.environ["ASTRAI_ACTIVATIONS"] = "f32"  # quantized files against f32 checkpoints of their values
    tmp = tempfile.mkdtemp(prefix="astrai_gguf_conv_")
    try:
        converter = converter_source(tmp)
        import gguf  # noqa: E402  (gguf-py, put on the path by converter_source)
        go.gguf = gguf
        only = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else None
        seqs_for = lambda v: [[(7919 * i + 3) % v for i in range(1, 24)], [(104729 * i + 5) % v for i in range(1, 9)]]  # noqa
        for name in MODELS:
            if only and only not in name:
                continue
            d, path = test_model(name, converter, tmp, seqs_for)
            test_vocab(name, d, path, tmp)
            for f in os.listdir(tmp):  # the checkpoint, its files and references
                if f.startswith(name):
                    p = os.path.join(tmp, f)
                    shutil.rmtree(p, ignore_errors=True) if os.path.isdir(p) else os.remove(p)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return of.verdict()


if __name__ == "__main__":
    sys.exit(main())
