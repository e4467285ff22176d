#!/usr/bin/env python3
"""The CPU levels' speed aims (docs/performance.md, "Against the aims of the levels issue"),
measured in one run on this machine, every level it runs but generic, in alternation.

Each round runs, per level (ASTRAI_CPU_ISA), bench/forward_bench on the 100M model (prefill of 1 x
512 tokens against OpenBLAS on the same shapes; decode at batch 1 and 32 over 512 tokens of bf16
K/V, against the in-process copy probe) and, with --train, bench/train_bench small (ours against
PyTorch on the same model and batches). Levels alternate within a round because these machines'
memory and cores change speed from minute to minute: compare columns of the same round.

usage: bench/levels.py [--build DIR] [--rounds N] [--train] [--levels v3,v4]
Prints one markdown table per round and the aims each v3 column meets. Nothing is asserted: a
benchmark reports, the reader judges the noise (tests never assert on wall-clock time).
"""
import argparse
import os
import re
import subprocess
import sys

AIM_PREFILL = 75.0  # v3 prefill 1 x 512: % of OpenBLAS's GEMM rate on the same shapes
AIM_DECODE = 85.0  # v3 batch-1 decode: weights read at % of the copy probe
AIM_BATCH = 6.0  # v3 batch-32 tokens/s over batch-1 tokens/s


# OpenBLAS's kernels, the baseline of each level: on v3 its AVX2 ones (what an AVX2-only CPU
# gets), elsewhere the best it picks for this CPU (the binaries upgrade an older guess).
BLAS_CORE = {"v3": "Haswell"}


def run(cmd, level):
    env = dict(os.environ, ASTRAI_CPU_ISA=level)
    env.pop("OPENBLAS_CORETYPE", None)
    if level in BLAS_CORE:
        env["OPENBLAS_CORETYPE"] = BLAS_CORE[level]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"levels.py: {' '.join(cmd)} (ASTRAI_CPU_ISA={level}) failed, rc {p.returncode}:\n{p.stderr[-2000:]}")
    return p.stdout


def levels_of(build):
    out = run([os.path.join(build, "src", "astrai"), "info"], "auto")
    m = re.search(r"^levels:\s+(.*?)\s+\(built", out, re.M)
    if not m:
        sys.exit("levels.py: `astrai info` printed no levels line:\n" + out)
    return [lv for lv in m.group(1).split() if lv != "generic"]


def parse_forward(out):
    """{'probe': (copy, read), 'blas': core, dtype: {'prefill_pct', 'blas_gflops',
    'decode': {batch: (tok/s, GB/s, %copy)}}}"""
    r = {}
    m = re.search(r"copy probe ([\d.]+) GB/s \(read\+write\), streaming read ([\d.]+) GB/s", out)
    if not m:
        sys.exit("levels.py: forward_bench printed no copy probe:\n" + out[-2000:])
    r["probe"] = (float(m.group(1)), float(m.group(2)))
    m = re.search(r"OpenBLAS (\S+)", out)
    r["blas"] = m.group(1) if m else "?"
    dtype = None
    for line in out.splitlines():
        h = re.match(r"== (\w+) weights", line)
        if h:
            dtype = h.group(1).lower()
            r[dtype] = {"prefill_pct": None, "blas_gflops": None, "decode": {}}
            continue
        cells = [c.split() for c in line.split("|")]
        if dtype is None or not cells[0] or not all(x.isdigit() for x in cells[0]):
            continue
        if len(cells) == 4 and cells[0] == ["1", "512"]:  # prefill batch 1 x 512
            r[dtype]["prefill_pct"] = float(cells[3][0].rstrip("%"))
            r[dtype]["blas_gflops"] = float(cells[2][0])
        elif len(cells) == 3 and len(cells[0]) == 1:  # decode: batch | ms/step tok/s | GB/s %copy
            r[dtype]["decode"][int(cells[0][0])] = (float(cells[1][1]), float(cells[2][0]),
                                                    float(cells[2][1].rstrip("%")))
    return r


def parse_train(out):
    m = re.search(r"speedup: ([\d.]+)x wall", out)
    return float(m.group(1)) if m else None


def fmt(v, spec, suffix=""):
    return "n/a" if v is None else format(v, spec) + suffix


def ratio32(r, d):
    """Batch-32 tokens/s over batch-1 tokens/s."""
    return r[d]["decode"][32][0] / r[d]["decode"][1][0]


def met(ok):
    return "met" if ok else "not met"


def table(round_no, results, levels, dtypes, train):
    print(f"\n### round {round_no}\n")
    print("| | " + " | ".join(levels) + " |")
    print("|---|" + "---|" * len(levels))
    rows = [("copy probe (read + write) / streaming read",
             [f"{r['probe'][0]:.1f} / {r['probe'][1]:.1f} GB/s" for r in results]),
            ("OpenBLAS GEMM on the prefill shapes (its kernels)",
             [f"{r[dtypes[0]]['blas_gflops']:.0f} GFLOP/s ({r['blas']})" for r in results])]
    for d in dtypes:
        rows.append((f"prefill 1 x 512, {d} weights: % of OpenBLAS", [f"{r[d]['prefill_pct']:.0f}%" for r in results]))
    for d in dtypes:
        rows.append((f"decode batch 1, {d} weights: weights read at (% of the probe)",
                     [f"{r[d]['decode'][1][1]:.1f} GB/s ({r[d]['decode'][1][2]:.0f}%)" for r in results]))
    for d in dtypes:
        rows.append((f"decode batch 32 / batch 1, {d} weights", [f"{ratio32(r, d):.1f}x" for r in results]))
    if train:
        rows.append(("training, small model: ours / PyTorch (wall)",
                     [fmt(r["train"], ".2f", "x") for r in results]))  # n/a: PyTorch failed (train_bench says why)
    for name, cells in rows:
        print(f"| {name} | " + " | ".join(cells) + " |")
    if "v3" in levels:
        r = results[levels.index("v3")]
        print("\nv3 against the aims of the levels issue:")
        for d in dtypes:
            print(f"- {d}: prefill {met(r[d]['prefill_pct'] >= AIM_PREFILL)} (>= {AIM_PREFILL:.0f}%), "
                  f"batch-1 decode {met(r[d]['decode'][1][2] >= AIM_DECODE)} (>= {AIM_DECODE:.0f}% of the probe), "
                  f"batch 32 {met(ratio32(r, d) >= AIM_BATCH)} (>= {AIM_BATCH:.0f}x batch 1)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build/release", help="the release build folder (default build/release)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of every level (default 2)")
    ap.add_argument("--train", action="store_true", help="also train_bench small against PyTorch (needs python3-torch)")
    ap.add_argument("--levels", help="comma-separated levels (default: every level this CPU runs but generic)")
    ap.add_argument("--dtype", default="both", choices=["f32", "bf16", "both"], help="weight dtype(s) (default both)")
    a = ap.parse_args()
    if a.rounds < 1:
        ap.error("--rounds must be at least 1")
    for tool in ["src/astrai", "bench/forward_bench"] + (["bench/train_bench"] if a.train else []):
        if not os.access(os.path.join(a.build, tool), os.X_OK):
            sys.exit(f"levels.py: no {os.path.join(a.build, tool)}: build the release preset with its benches first "
                     "(cmake --preset release && cmake --build --preset release)")
    levels = a.levels.split(",") if a.levels else levels_of(a.build)
    dtypes = ["f32", "bf16"] if a.dtype == "both" else [a.dtype]
    fwd = [os.path.join(a.build, "bench", "forward_bench"), "--quick", "--dtype", a.dtype, "--decode-batches", "1,32",
           "--kv-heads", "4", "--ctx", "512", "--kv-dtype", "bf16"]
    info = run([os.path.join(a.build, "src", "astrai"), "info"], "auto")
    cpu = re.search(r"^cpu:\s+(.*)$", info, re.M)
    print(f"cpu: {cpu.group(1) if cpu else 'unknown'}; levels measured: {', '.join(levels)}")
    print("forward_bench: " + " ".join(fwd[1:]) + (" ; train_bench small 5 2" if a.train else ""))
    for rnd in range(1, a.rounds + 1):
        results = []
        for lv in levels:
            print(f"round {rnd}, {lv} ...", file=sys.stderr, flush=True)
            r = parse_forward(run(fwd, lv))
            for d in dtypes:
                if d not in r or r[d]["prefill_pct"] is None or not {1, 32} <= r[d]["decode"].keys():
                    sys.exit(f"levels.py: forward_bench printed no {d} prefill row for 1 x 512 or decode rows "
                             f"for batches 1 and 32 at {lv}")
            if a.train:
                r["train"] = parse_train(run([os.path.join(a.build, "bench", "train_bench"), "small", "5", "2"], lv))
            results.append(r)
        table(rnd, results, levels, dtypes, a.train)


if __name__ == "__main__":
    main()
