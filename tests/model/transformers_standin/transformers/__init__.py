"""A stand-in for the two things llama.cpp's convert_hf_to_gguf.py takes from `transformers` when it
converts a llama / mistral / qwen2 / qwen3 checkpoint with a tokenizer.json: AutoConfig (config.json
as a dict) and AutoTokenizer (the vocabulary, the added tokens, encode and decode).

`transformers` cannot be installed here (no PyPI). Its fast tokenizers are the Hugging Face
`tokenizers` library, so this stand-in runs that same library: the official npm package
(tokenizers@0.23.2, its native Rust binary, in assets/js/node_modules) in one Node process, for
encode and decode. The vocabulary and the added tokens' flags are read from tokenizer.json, as
transformers' fast tokenizers read them. Everything else the converter does (tensor names, q/k
permutation, metadata, its quantizers, its pre-tokenizer table) is llama.cpp's own code.
Anything the converter asks for that is not here fails with AttributeError, not a guess.
Env: ASTRAI_ASSETS (default: the checkout's assets/).
"""
import json
import os
import subprocess

_HERE = os.path.dirname(os.path.abspath(__file__))
_ASSETS = os.environ.get("ASTRAI_ASSETS", os.path.join(_HERE, "..", "..", "..", "..", "assets"))

# One request per line on stdin ({"op", "text" | "ids", "special"}), one JSON answer per line.
_NODE = r"""
const { createRequire } = require('node:module');
const path = require('node:path');
const readline = require('node:readline');
const req = createRequire(path.join(process.argv[1], 'js', 'node_modules', 'x.js'));
const { Tokenizer } = req('tokenizers');
const tok = Tokenizer.fromFile(process.argv[2]);
const rl = readline.createInterface({ input: process.stdin });
const queue = [];
let busy = false;
async function drain() {
  if (busy) return;
  busy = true;
  while (queue.length) {
    const r = JSON.parse(queue.shift());
    let out;
    if (r.op === 'encode') out = (await tok.encode(r.text, null, { addSpecialTokens: r.special })).getIds();
    else out = await tok.decode(r.ids, r.skip);
    process.stdout.write(JSON.stringify(out) + '\n');
  }
  busy = false;
}
rl.on('line', (l) => { queue.push(l); drain(); });
"""


class PretrainedConfig:
    def __init__(self, d):
        self._d = d

    def to_dict(self):
        return dict(self._d)


class AutoConfig:
    @staticmethod
    def from_pretrained(path, trust_remote_code=False, **_):
        with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
            return PretrainedConfig(json.load(f))


class AddedToken:
    def __init__(self, t):
        self.content = t["content"]
        self.special = bool(t.get("special", False))
        self.normalized = bool(t.get("normalized", not self.special))


class FastTokenizer:
    def __init__(self, path):
        file = os.path.join(path, "tokenizer.json")
        with open(file, encoding="utf-8") as f:
            j = json.load(f)
        if j["model"]["type"] != "BPE":
            raise ValueError("transformers stand-in: only BPE tokenizer.json models (%s)" % j["model"]["type"])
        self.added_tokens_decoder = {t["id"]: AddedToken(t) for t in j.get("added_tokens", [])}
        self.vocab = dict(j["model"]["vocab"])
        for i, t in self.added_tokens_decoder.items():
            self.vocab[t.content] = i
        self._proc = subprocess.Popen(["node", "-e", _NODE, os.path.abspath(_ASSETS), file], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True, encoding="utf-8")

    def _ask(self, req):
        self._proc.stdin.write(json.dumps(req) + "\n")
        self._proc.stdin.flush()
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError("transformers stand-in: the tokenizers process ended (is %s/js installed?)" % _ASSETS)
        return json.loads(line)

    def get_added_vocab(self):
        return {t.content: i for i, t in self.added_tokens_decoder.items()}

    def encode(self, text, add_special_tokens=True):
        return self._ask({"op": "encode", "text": text, "special": add_special_tokens})

    def decode(self, ids, skip_special_tokens=False):
        return self._ask({"op": "decode", "ids": list(ids), "skip": skip_special_tokens})


class AutoTokenizer:
    @staticmethod
    def from_pretrained(path, **_):
        return FastTokenizer(str(path))
