#!/usr/bin/python3
"""Whole-model check of the CPU levels: `astrai score` logits and `astrai generate` tokens and
log-probs are the same bytes under every level this CPU runs (ASTRAI_CPU_ISA=generic, v3, v4
or neon), on random-weight models of several architectures (tests/model/oracle_forward.py):
f32, bf16 and f16 checkpoints, MHA/GQA/MQA, qk-norm, the attention gate, MLA; plain and paged
chunked prefill; greedy and seeded sampling; f32 and bf16 K/V. bf16 checkpoints are run a second
time in the bf16-dot mode (ASTRAI_BF16_DOT=1: VDPBF16PS on v4 CPUs with AVX512_BF16, emulated
elsewhere), whose outputs must differ from the default's and agree across levels.

With ASTRAI_EMULATE_CPU=Haswell (or another qemu CPU model) every command runs under
`qemu-x86_64 -cpu MODEL`: the same binary on a CPU without AVX-512 (or without AVX2), whatever
the machine running the test has.

With --before BIN, compares instead the outputs of BIN (a build from before a change) with
those of ASTRAI_BIN at the auto level, on every model: "generation bit-identical to before".

Usage: isa_identity.py [--before BIN]   (ASTRAI_BIN names the binary)
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import oracle_forward as of  # noqa: E402

ASTRAI = os.environ.get("ASTRAI_BIN", "astrai")
EMULATE = os.environ.get("ASTRAI_EMULATE_CPU")
PREFIX = ["qemu-x86_64", "-cpu", EMULATE] if EMULATE else []
MODELS = ["llama_mha_bias_tied_sharded", "qwen3_qknorm_mqa8_dynamic_bf16", "mistral_gqa8_f16", "arlm_mla_gate",
          "arlm_gqa_gate_qknorm"]
if EMULATE:  # emulation is slow: one model of each dtype, MLA among them
    MODELS = ["qwen3_qknorm_mqa8_dynamic_bf16", "mistral_gqa8_f16", "arlm_mla_gate"]
AVX2_BLAS = ["Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids"]
FAILURES = []


def check(cond, msg):
    print(("ok   " if cond else "FAIL ") + msg, flush=True)
    if not cond:
        FAILURES.append(msg)


def run(level, args, binary=None, bf16_dot=False):
    env = dict(os.environ, ASTRAI_CPU_ISA=level, OMP_NUM_THREADS="2", ASTRAI_BF16_DOT="1" if bf16_dot else "0")
    r = subprocess.run(PREFIX + [binary or ASTRAI] + args, capture_output=True, text=True, env=env, timeout=600)
    if r.returncode != 0:
        raise RuntimeError("astrai %s (%s) failed: %s" % (" ".join(args), level, r.stderr))
    return r


def levels():
    info = json.loads(run("auto", ["info", "--json"]).stdout)["cpu"]
    print("cpu: %s; levels: %s; OpenBLAS %s" % (info["model"], ", ".join(info["levels_supported"]), info["blas_core"]))
    # OpenBLAS falls back to SSE3 kernels on CPUs newer than itself; astrai restarts with
    # OPENBLAS_CORETYPE set (kernels/cpu/blas_core.h), so an AVX2 CPU always gets AVX2 kernels.
    if "v3" in info["levels_supported"] and "OPENBLAS_CORETYPE" not in os.environ:
        check(info["blas_core"] in AVX2_BLAS, "OpenBLAS runs %s kernels on a CPU with AVX2" % info["blas_core"])
    return info["levels_supported"]


def build(name, tmp):
    cfg_json, dtype, shards, ref_names = of.MODELS[name]
    cfg_json = dict(cfg_json, max_position_embeddings=max(cfg_json.get("max_position_embeddings", 256), 256))
    c = of.Cfg(cfg_json)
    W = of.random_weights(c)
    d = os.path.join(tmp, name)
    of.save_model(d, cfg_json, [(of.reference_name(n) if ref_names else n, W[n]) for n, _, _ in of.param_shapes(c)],
                  dtype, shards)
    return c, d


def outputs(level, c, d, tmp, binary=None, bf16_dot=False):
    """Everything a level produces for model d, as bytes, keyed by what it is."""
    out = {}
    seqs = [[(7 * i + 3) % c.vocab for i in range(1, 30)], [(11 * i + 5) % c.vocab for i in range(1, 9)]]
    for extra in ([], ["--chunk", "5", "--page-size", "4"]):
        npy = os.path.join(tmp, "logits_%s.npy" % level)
        args = ["score", "--model", d, "--dump-logits", npy, "--json"] + extra
        for s in seqs:
            args += ["--ids", ",".join(map(str, s))]
        stdout = run(level, args, binary, bf16_dot).stdout
        with open(npy, "rb") as f:
            out["score logits %s" % " ".join(extra)] = f.read()
        out["score logprobs %s" % " ".join(extra)] = stdout
    records = [{"prompt_ids": seqs[0], "max_tokens": 12, "ignore_eos": True, "logprobs": 3},
               {"prompt_ids": seqs[1], "max_tokens": 9, "ignore_eos": True},
               {"prompt_ids": seqs[0][:5], "max_tokens": 10, "ignore_eos": True, "temperature": 0.9, "top_p": 0.9,
                "seed": 1234, "logprobs": 2},
               {"prompt_ids": seqs[1][:3], "max_tokens": 8, "ignore_eos": True, "temperature": 1.3, "seed": 99}]
    inp = os.path.join(tmp, "in.jsonl")
    with open(inp, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    for kv in ("f32", "bf16"):
        outp = os.path.join(tmp, "out_%s.jsonl" % level)
        run(level, ["generate", "--model", d, "--input-file", inp, "--output-file", outp, "--temperature", "0",
                    "--include-ids", "--kv-dtype", kv], binary, bf16_dot)
        with open(outp) as f:
            out["generate, %s K/V" % kv] = f.read()
    return out


def bf16_dot_option(levels_run):
    """The bf16-dot mode as `astrai info` reports it (off by default; on each level VDPBF16PS where
    v4 and the CPU's AVX512_BF16 allow, else emulated), and a bad ASTRAI_BF16_DOT as a clear error
    before anything is loaded."""
    info = json.loads(run("auto", ["info", "--json"]).stdout)["cpu"]
    check(info["bf16_dot"] == "off", "the bf16-dot mode is off by default (%s)" % info["bf16_dot"])
    for level in levels_run:
        got = json.loads(run(level, ["--bf16-dot", "info", "--json"]).stdout)["cpu"]["bf16_dot"]
        want = "vdpbf16ps" if level == "v4" and "avx512_bf16" in info["features"] else "emulated"
        check(got == want, "--bf16-dot at %s: info reports %s (want %s)" % (level, got, want))
    env = dict(os.environ, ASTRAI_BF16_DOT="yes")
    r = subprocess.run(PREFIX + [ASTRAI, "score", "--model", "/nonexistent", "--ids", "1"], capture_output=True,
                       text=True, env=env, timeout=600)
    check(r.returncode != 0 and "ASTRAI_BF16_DOT" in r.stderr and "nonexistent" not in r.stderr,
          "a bad ASTRAI_BF16_DOT stops the command before it loads the model: %s" % r.stderr.strip()[-120:])


def compare_builds(before, tmp):
    for name in MODELS:
        c, d = build(name, tmp)
        ref = outputs("auto", c, d, tmp, before)
        got = outputs("auto", c, d, tmp)
        for what, want in ref.items():
            check(got[what] == want, "%s: %s identical to the build before" % (name, what))


def main():
    tmp = tempfile.mkdtemp(prefix="astrai_isa_")
    try:
        if len(sys.argv) == 3 and sys.argv[1] == "--before":
            compare_builds(sys.argv[2], tmp)
            return finish()
        lv = levels()
        check(lv[0] == "generic" and len(lv) >= 1, "the generic level is always available")
        if EMULATE == "Haswell":
            check(lv == ["generic", "v3"], "an emulated Haswell (AVX2, no AVX-512) runs generic and v3: %s" % lv)
        if EMULATE == "Nehalem":
            check(lv == ["generic"], "an emulated Nehalem (no AVX) runs generic only: %s" % lv)
        bf16_dot_option(lv)
        for name in MODELS:
            c, d = build(name, tmp)
            ref = outputs("generic", c, d, tmp)
            check(all(len(v) > 0 for v in ref.values()), "%s: generic produced every output" % name)
            # The comparison can tell outputs apart: bf16 K/V changes the log-probs.
            check(ref["generate, f32 K/V"] != ref["generate, bf16 K/V"], "%s: f32 and bf16 K/V outputs differ" % name)
            for level in lv[1:]:
                got = outputs(level, c, d, tmp)
                for what, want in ref.items():
                    check(got[what] == want, "%s: %s identical on %s and generic" % (name, what, level))
            if name.endswith("_bf16"):
                dot = outputs("generic", c, d, tmp, bf16_dot=True)
                check(dot["score logits "] != ref["score logits "], "%s: the bf16-dot mode changes the logits" % name)
                for level in lv[1:]:
                    got = outputs(level, c, d, tmp, bf16_dot=True)
                    for what, want in dot.items():
                        check(got[what] == want, "%s: bf16-dot %s identical on %s and generic" % (name, what, level))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return finish()


def finish():
    if FAILURES:
        print("%d failures" % len(FAILURES))
        return 1
    print("all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
