#!/usr/bin/python3
"""Checks linked x86-64 binaries for instructions outside their CPU level.

The project is compiled for baseline x86-64; only the kernels' v3 and v4 copies
(namespaces astrai::kernels::v3 / ::v4, src/kernels/cpu/level.h) may use more. A function
of another level, or of the rest of the program, holding such instructions would crash a
CPU without them: for example an inline helper or template compiled for v4 that the linker
kept as the only copy. This disassembles each binary (objdump) and fails if
  * an AVX-512 instruction (zmm registers, opmask registers, EVEX-only registers 16-31)
    appears in a function outside astrai::kernels::v4, or
  * an AVX/AVX2/FMA/F16C (VEX-encoded) or BMI1/BMI2/LZCNT/MOVBE instruction appears in a
    function outside astrai::kernels::v3 and ::v4, or
  * a VNNI instruction (AVX-VNNI or AVX-512 VNNI: vpdpbusd, vpdpwssd and their saturating forms),
    which neither level implies, appears outside a level's `vnni` namespace: the kernels call
    those only after checking the CPU (src/kernels/cpu/linear_int8.cc), or
  * an AVX512_BF16 instruction (vdpbf16ps, vcvtne2ps2bf16, vcvtneps2bf16), which v4 does not
    imply, appears outside v4's `bf16dot` namespace (src/kernels/cpu/linear_bf16.cc).

Usage: check-isa.py BINARY...   (exit 0: clean; 1: offending functions listed)
"""
import re
import subprocess
import sys

AVX512 = re.compile(r"%zmm|%k[0-7]\b|%[xy]mm(1[6-9]|2[0-9]|3[01])\b|\{%k")
BMI = {"andn", "bextr", "blsi", "blsmsk", "blsr", "bzhi", "mulx", "pdep", "pext", "rorx", "sarx", "shlx", "shrx",
       "lzcnt", "movbe"}  # not tzcnt: GCC's baseline code emits `rep bsf`, which runs as bsf on older CPUs
FUNC = re.compile(r"^[0-9a-f]+ <(.*)>:$")
VNNI = re.compile(r"\bvpdp(bu|ws)sds?\b")
BF16 = re.compile(r"\bv(dpbf16ps|cvtne2?ps2bf16)\b")


def level_of(instr):
    """'v4', 'v3' or None (baseline) for one disassembled instruction line."""
    parts = instr.split("\t")
    if len(parts) < 2:
        return None
    text = parts[-1].strip()
    if not text:
        return None
    if AVX512.search(text):
        return "v4"
    mnemonic = text.split()[0]
    if mnemonic.startswith("v") or "%ymm" in text or mnemonic in BMI:
        return "v3"
    return None


def check(path):
    dump = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "-C", path], check=True, capture_output=True,
                          text=True).stdout
    bad = {}
    counts = {"v3": 0, "v4": 0, "vnni": 0, "bf16": 0}
    func = "?"
    for line in dump.splitlines():
        m = FUNC.match(line)
        if m:
            func = m.group(1)
            continue
        lvl = level_of(line)
        if lvl is None:
            continue
        counts[lvl] += 1
        if VNNI.search(line):
            counts["vnni"] += 1
            if "::vnni::" not in func:
                bad.setdefault(func, ("VNNI (only in a level's vnni namespace)", line.strip()))
                continue
        if BF16.search(line):
            counts["bf16"] += 1
            if "astrai::kernels::v4::" not in func or "::bf16dot::" not in func:
                bad.setdefault(func, ("AVX512_BF16 (only in v4's bf16dot namespace)", line.strip()))
                continue
        allowed = "astrai::kernels::v4::" in func or (lvl == "v3" and "astrai::kernels::v3::" in func)
        if not allowed:
            bad.setdefault(func, (lvl, line.strip()))
    print("%s: %d AVX-512, %d AVX2-level, %d VNNI and %d AVX512_BF16 instructions, all inside their levels' kernels"
          % (path, counts["v4"], counts["v3"], counts["vnni"], counts["bf16"])
          if not bad else "%s: %d functions use instructions beyond their level:" % (path, len(bad)))
    for func, (lvl, line) in sorted(bad.items())[:40]:
        print("  %s needs %s: %s" % (func, lvl, line))
    if counts["v4"] == 0 or counts["v3"] == 0:
        print("  (no v3 or v4 kernel code found: is this the portable x86-64 build?)")
        return False
    return not bad


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    ok = all([check(p) for p in sys.argv[1:]])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
