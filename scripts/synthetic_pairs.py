#!/usr/bin/env python3
"""Synthetic preference pairs with a rule a model can learn and apply to unseen prompts.

Each prompt lists 3-6 words drawn from a fixed list; the chosen answer repeats the LAST word,
the rejected answer names a word of the list that is not in the prompt. A policy that learns
to prefer the chosen answers has learned to look back at the prompt (an attention skill), so
held-out pairs (other word sequences) test generalisation, not memory.

usage: synthetic_pairs.py --pairs N --seed S --output pairs.jsonl [--corpus corpus.txt]
                          [--prompts prompts.jsonl] [--sft sft.jsonl] [--task last|first]
  --corpus also writes a text (prompts and both answers) to train a tokenizer on;
  --prompts also writes the prompts with their answer ({"prompt", "answer"}: GRPO with the
  exact-match reward); --sft also writes {"prompt", "response"} records with the chosen
  answer (supervised fine-tuning on the format); --task first asks for the FIRST word instead
  (a second skill on the same words: fine-tuning a model of one task to the other).
"""
import argparse
import json
import random

WORDS = ("apple river stone cloud tiger lemon chair piano rocket garden window silver "
         "forest candle bridge mirror planet honey castle ocean pepper violin marble desert").split()


def pair(rng, task="last"):
    words = rng.sample(WORDS, rng.randint(3, 6))
    other = rng.choice([w for w in WORDS if w not in words])
    prompt = f"Repeat the {task} word: " + " ".join(words) + "\nAnswer:"
    answer = words[-1] if task == "last" else words[0]
    return {"prompt": prompt, "chosen": " " + answer + ".", "rejected": " " + other + "."}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--output", required=True)
    ap.add_argument("--corpus")
    ap.add_argument("--prompts")
    ap.add_argument("--sft")
    ap.add_argument("--task", choices=("last", "first"), default="last")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    records = [pair(rng, a.task) for _ in range(a.pairs)]
    with open(a.output, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    if a.prompts:
        with open(a.prompts, "w") as f:
            for r in records:
                f.write(json.dumps({"prompt": r["prompt"], "answer": r["chosen"].strip(" .")}) + "\n")
    if a.sft:
        with open(a.sft, "w") as f:
            for r in records:
                f.write(json.dumps({"prompt": r["prompt"], "response": r["chosen"]}) + "\n")
    if a.corpus:
        with open(a.corpus, "w") as f:
            for r in records:
                f.write(r["prompt"] + r["chosen"] + "\n" + r["prompt"] + r["rejected"] + "\n")


if __name__ == "__main__":
    main()
