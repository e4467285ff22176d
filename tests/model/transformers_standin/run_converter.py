#!/usr/bin/python3
"""Runs llama.cpp's convert_hf_to_gguf.py (the path given first, then its own arguments) with
Debian 12's PyTorch 1.13 and the transformers stand-in beside this file.

PyTorch 1.13 has no float8 dtypes; the converter names torch.float8_e4m3fn, float8_e5m2 and
float8_e8m0fnu in tables that only FP8 checkpoints reach. They are set here to placeholders that
equal no real dtype, so the module loads and an FP8 checkpoint still fails (a KeyError), while
every other line of the converter runs as written.
Usage: run_converter.py LLAMA_CPP/convert_hf_to_gguf.py MODEL_DIR --outfile F --outtype T
"""
import os
import runpy
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
for name in ("float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu"):
    if not hasattr(torch, name):
        setattr(torch, name, type(name, (), {})())  # a fresh object: hashable, equal to nothing else

script = os.path.abspath(sys.argv[1])
sys.path[:0] = [HERE, os.path.dirname(script), os.path.join(os.path.dirname(script), "gguf-py")]
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")
