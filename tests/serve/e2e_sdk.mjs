// End-to-end: a live `astrai serve` (random-weight Qwen3-shaped model, real Qwen3 tokenizer)
// driven by the official clients openai@6.49.0 and @anthropic-ai/sdk@1.14.0, plus raw HTTP for
// error codes, auth, CORS, disconnects and 256 concurrent streams. Loopback only.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";

import { countChatTokens, countTextTokens, makeModel, requireJs, run, startServer, stats, tempDir, waitFor } from "./e2e_common.mjs";

const OpenAI = requireJs("openai").default;
const Anthropic = requireJs("@anthropic-ai/sdk").default;

const model = makeModel();
const srv = await startServer(model, ["--max-running", "64", "--http-threads", "4"]);
const openai = new OpenAI({ baseURL: srv.base + "/v1", apiKey: "unused", maxRetries: 0 });
const anthropic = new Anthropic({ baseURL: srv.base, apiKey: "unused", maxRetries: 0 });
const user = (content) => [{ role: "user", content }];

const tools = [{
  type: "function",
  function: {
    name: "get_weather", description: "Weather in a city",
    parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
  },
}];

function sortKeys(v) {
  if (Array.isArray(v)) return v.map(sortKeys);
  if (v && typeof v === "object") return Object.fromEntries(Object.keys(v).sort().map((k) => [k, sortKeys(v[k])]));
  return v;
}

async function collectChatStream(params) {
  const stream = await openai.chat.completions.create({ ...params, stream: true });
  const chunks = [];
  for await (const c of stream) chunks.push(c);
  return chunks;
}

const tests = [
  ["models list", async () => {
    const list = await openai.models.list();
    assert.deepEqual(list.data.map((m) => m.id), ["tiny"]);
  }],

  ["chat: non-streaming, max_tokens ends with length, usage equals astrai tokenize", async () => {
    const messages = [{ role: "system", content: "You are terse." }, ...user("Hello there, how are you?")];
    const r = await openai.chat.completions.create({ model: "tiny", messages, max_tokens: 8, temperature: 0 });
    assert.equal(r.object, "chat.completion");
    assert.equal(r.choices[0].finish_reason, "length");
    assert.equal(r.choices[0].message.role, "assistant");
    assert.equal(r.usage.completion_tokens, 8);
    assert.equal(r.usage.prompt_tokens, countChatTokens(model, messages));
    assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + 8);
  }],

  ["chat: streaming equals non-streaming; role first, finish, usage chunk, [DONE]", async () => {
    const params = { model: "tiny", messages: user("Tell me a story"), max_tokens: 12, temperature: 0 };
    const full = await openai.chat.completions.create(params);
    const chunks = await collectChatStream({ ...params, stream_options: { include_usage: true } });
    assert.equal(chunks[0].choices[0].delta.role, "assistant");
    const text = chunks.flatMap((c) => c.choices.map((ch) => ch.delta.content || "")).join("");
    assert.equal(text, full.choices[0].message.content);
    const finish = chunks.flatMap((c) => c.choices.map((ch) => ch.finish_reason)).filter(Boolean);
    assert.deepEqual(finish, ["length"]);
    const last = chunks[chunks.length - 1];
    assert.deepEqual(last.choices, []);
    assert.equal(last.usage.completion_tokens, 12);
    assert.equal(last.usage.prompt_tokens, full.usage.prompt_tokens);
    // The raw stream ends with data: [DONE].
    const raw = await (await fetch(srv.base + "/v1/chat/completions", {
      method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ ...params, stream: true }),
    })).text();
    assert.ok(raw.endsWith("data: [DONE]\n\n"), raw.slice(-80));
  }],

  ["stop sequences end the reply without the stop text (OpenAI and Anthropic)", async () => {
    const base = { model: "tiny", messages: user("Count with me"), max_tokens: 40, temperature: 1, seed: 7 };
    const free = (await openai.chat.completions.create(base)).choices[0].message.content;
    assert.ok(free.length > 20, "need some text: " + JSON.stringify(free));
    const stop = free.slice(Math.floor(free.length / 2), Math.floor(free.length / 2) + 4);
    const expect = free.slice(0, free.indexOf(stop));
    const r = await openai.chat.completions.create({ ...base, stop: [stop] });
    assert.equal(r.choices[0].message.content, expect);
    assert.equal(r.choices[0].finish_reason, "stop");
    const streamed = await collectChatStream({ ...base, stop });
    assert.equal(streamed.map((c) => c.choices[0]?.delta.content || "").join(""), expect);
    // Anthropic has no seed: use greedy output and a stop string from its middle.
    const aparams = { model: "tiny", max_tokens: 40, temperature: 0, messages: user("Count with me") };
    const afree = (await anthropic.messages.create(aparams)).content[0].text;
    const astop = afree.slice(Math.floor(afree.length / 2), Math.floor(afree.length / 2) + 3);
    const a = await anthropic.messages.create({ ...aparams, stop_sequences: [astop] });
    assert.equal(a.stop_reason, "stop_sequence");
    assert.equal(a.stop_sequence, astop);
    assert.equal(a.content[0].text, afree.slice(0, afree.indexOf(astop)));
  }],

  ["n > 1 with a seed: distinct indices, usage sums the choices", async () => {
    const r = await openai.chat.completions.create({
      model: "tiny", messages: user("Pick a word"), n: 3, max_tokens: 6, temperature: 1, seed: 3,
    });
    assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2]);
    assert.equal(r.usage.completion_tokens, 18);
    const again = await openai.chat.completions.create({
      model: "tiny", messages: user("Pick a word"), n: 3, max_tokens: 6, temperature: 1, seed: 3,
    });
    assert.deepEqual(again.choices.map((c) => c.message.content), r.choices.map((c) => c.message.content));
    const chunks = await collectChatStream({ model: "tiny", messages: user("Pick a word"), n: 2, max_tokens: 4, temperature: 1, seed: 3 });
    const finishes = chunks.flatMap((c) => c.choices.filter((ch) => ch.finish_reason).map((ch) => ch.index)).sort();
    assert.deepEqual(finishes, [0, 1]);
  }],

  ["chat logprobs: one entry per token with top alternatives", async () => {
    const r = await openai.chat.completions.create({
      model: "tiny", messages: user("hi"), max_tokens: 5, temperature: 0, logprobs: true, top_logprobs: 3,
    });
    const content = r.choices[0].logprobs.content;
    assert.equal(content.length, 5);
    for (const t of content) {
      assert.ok(t.logprob <= 0);
      assert.equal(t.top_logprobs.length, 3);
      // Greedy: the chosen token is the most likely one.
      assert.ok(Math.abs(t.logprob - t.top_logprobs[0].logprob) < 1e-5);
      assert.equal(t.token, t.top_logprobs[0].token);
    }
  }],

  ["completions: echo + logprobs scores the prompt (max_tokens 0), token ids prompt", async () => {
    const text = "The quick brown fox jumps over the lazy dog.";
    const file = path.join(tempDir("astrai-p-"), "p.txt");
    fs.writeFileSync(file, text);
    const n = countTextTokens(model, file);
    const r = await openai.completions.create({ model: "tiny", prompt: text, max_tokens: 0, echo: true, logprobs: 1 });
    const c = r.choices[0];
    assert.equal(c.text, text);
    assert.equal(c.logprobs.tokens.length, n);
    assert.equal(c.logprobs.token_logprobs[0], null);
    assert.ok(c.logprobs.token_logprobs.slice(1).every((x) => x <= 0));
    assert.equal(c.logprobs.tokens.join(""), text);
    assert.equal(r.usage.prompt_tokens, n);
    assert.equal(r.usage.completion_tokens, 0);
    const ids = JSON.parse(execFileSync(process.env.ASTRAI_BIN || "astrai", ["tokenize", "--tokenizer", model, "--file", file, "--json"]).toString()).ids;
    const g = await openai.completions.create({ model: "tiny", prompt: ids, max_tokens: 5, temperature: 0, logprobs: 0 });
    assert.equal(g.usage.prompt_tokens, ids.length);
    assert.equal(g.choices[0].finish_reason, "length");
    assert.equal(g.choices[0].logprobs.tokens.length, 5);
    // The same continuation scored by echo gets the same log-probabilities.
    const scored = await openai.completions.create({ model: "tiny", prompt: text + g.choices[0].text, max_tokens: 0, echo: true, logprobs: 0 });
    const tail = scored.choices[0].logprobs.token_logprobs.slice(-5);
    const lp = g.choices[0].logprobs.token_logprobs;
    if (scored.choices[0].logprobs.tokens.slice(-5).join("") === g.choices[0].logprobs.tokens.join("")) {
      for (let i = 0; i < 5; i++) assert.ok(Math.abs(tail[i] - lp[i]) < 1e-3, `${tail[i]} vs ${lp[i]}`);
    }
    const s = await openai.completions.create({ model: "tiny", prompt: text, max_tokens: 4, temperature: 0, stream: true, stream_options: { include_usage: true } });
    let streamed = "", usage = null;
    for await (const ch of s) {
      if (ch.choices[0]) streamed += ch.choices[0].text;
      if (ch.usage) usage = ch.usage;
    }
    assert.equal(usage.completion_tokens, 4);
    const nonstream = await openai.completions.create({ model: "tiny", prompt: text, max_tokens: 4, temperature: 0 });
    assert.equal(streamed, nonstream.choices[0].text);
  }],

  ["anthropic: non-streaming and streaming agree; exact event order; usage", async () => {
    const params = { model: "tiny", max_tokens: 7, temperature: 0, system: "Be brief.", messages: user("Hello!") };
    const m = await anthropic.messages.create(params);
    assert.equal(m.type, "message");
    assert.equal(m.stop_reason, "max_tokens");
    assert.equal(m.usage.output_tokens, 7);
    const expected = countChatTokens(model, [{ role: "system", content: "Be brief." }, ...user("Hello!")]);
    assert.equal(m.usage.input_tokens, expected);
    const counted = await anthropic.messages.countTokens({ model: "tiny", system: "Be brief.", messages: user("Hello!") });
    assert.equal(counted.input_tokens, expected);
    const stream = anthropic.messages.stream(params);
    const final = await stream.finalMessage();
    assert.equal(final.content[0].text, m.content[0].text);
    assert.equal(final.usage.output_tokens, 7);
    assert.equal(final.stop_reason, "max_tokens");
    // The SDK hides pings; check the wire: every event line, in order.
    const raw = await (await fetch(srv.base + "/v1/messages", {
      method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ ...params, stream: true }),
    })).text();
    const types = [...raw.matchAll(/^event: (\w+)$/gm)].map((x) => x[1]);
    assert.deepEqual(types.slice(0, 3), ["message_start", "content_block_start", "ping"]);
    assert.deepEqual(types.slice(-3), ["content_block_stop", "message_delta", "message_stop"]);
    assert.ok(types.slice(3, -3).every((t) => t === "content_block_delta"));
  }],

  ["tools round trip: tools, assistant tool_calls and tool results reach the template", async () => {
    const history = [
      ...user("What is the weather in Paris?"),
      { role: "assistant", content: null, tool_calls: [{ id: "call_1", type: "function", function: { name: "get_weather", arguments: "{\"city\":\"Paris\"}" } }] },
      { role: "tool", tool_call_id: "call_1", content: "sunny, 21 C" },
    ];
    const r = await openai.chat.completions.create({ model: "tiny", messages: history, tools, max_tokens: 3, temperature: 0 });
    const templated = [
      history[0],
      { role: "assistant", content: "", tool_calls: [{ id: "call_1", type: "function", function: { name: "get_weather", arguments: { city: "Paris" } } }] },
      history[2],
    ];
    // Request JSON is held as nlohmann::json (keys sorted), so `tools | tojson` prints sorted
    // keys; render the reference the same way.
    assert.equal(r.usage.prompt_tokens, countChatTokens(model, templated, sortKeys(tools)));
    const none = await openai.chat.completions.create({ model: "tiny", messages: user("hi"), tools, tool_choice: "none", max_tokens: 1 });
    assert.equal(none.usage.prompt_tokens, countChatTokens(model, user("hi")));
    const a = await anthropic.messages.create({
      model: "tiny", max_tokens: 3, temperature: 0,
      tools: [{ name: "get_weather", description: "Weather in a city", input_schema: tools[0].function.parameters }],
      messages: [
        ...user("What is the weather in Paris?"),
        { role: "assistant", content: [{ type: "tool_use", id: "call_1", name: "get_weather", input: { city: "Paris" } }] },
        { role: "user", content: [{ type: "tool_result", tool_use_id: "call_1", content: "sunny, 21 C" }] },
      ],
    });
    assert.equal(a.usage.input_tokens, r.usage.prompt_tokens);
  }],

  ["errors through the SDKs: 404 model, 400 fields, 400 response_format", async () => {
    await assert.rejects(openai.chat.completions.create({ model: "gpt-x", messages: user("hi") }), (e) => e.status === 404 && e instanceof OpenAI.NotFoundError);
    await assert.rejects(openai.chat.completions.create({ model: "tiny", messages: user("hi"), temperature: 5 }), (e) => e.status === 400 && /temperature/.test(e.message));
    await assert.rejects(openai.chat.completions.create({ model: "tiny", messages: user("hi"), response_format: { type: "json_object" } }), (e) => e.status === 400 && /response_format/.test(e.message));
    await assert.rejects(anthropic.messages.create({ model: "tiny", messages: user("hi") }), (e) => e.status === 400 && e instanceof Anthropic.BadRequestError);
    await assert.rejects(anthropic.messages.create({ model: "nope", max_tokens: 3, messages: user("hi") }), (e) => e.status === 404 && e.error?.error?.type === "not_found_error");
  }],

  ["raw HTTP: 413, 404, 405, bad JSON, CORS preflight", async () => {
    const big = await fetch(srv.base + "/v1/chat/completions", { method: "POST", body: "x".repeat(9 << 20) }).catch((e) => e);
    if (!(big instanceof Error)) {
      assert.equal(big.status, 413);
      assert.equal((await big.json()).error.code, "request_too_large");
    }
    const curl = execFileSync("curl", ["-s", "-o", "/dev/null", "-w", "%{http_code}", "-H", "content-type: application/json",
      "--data-binary", "@-", srv.base + "/v1/messages"], { input: "y".repeat(9 << 20) }).toString();
    assert.equal(curl, "413");
    assert.equal((await fetch(srv.base + "/v2/nothing")).status, 404);
    assert.equal((await fetch(srv.base + "/v1/messages")).status, 405);
    const bad = await fetch(srv.base + "/v1/messages", { method: "POST", body: "{nope" });
    assert.equal(bad.status, 400);
    assert.equal((await bad.json()).type, "error");
    const pre = await fetch(srv.base + "/v1/chat/completions", {
      method: "OPTIONS",
      headers: { origin: "http://example.test", "access-control-request-method": "POST", "access-control-request-headers": "authorization,content-type" },
    });
    assert.equal(pre.status, 204);
    assert.equal(pre.headers.get("access-control-allow-origin"), "*");
    assert.match(pre.headers.get("access-control-allow-methods"), /POST/);
    const metrics = await (await fetch(srv.base + "/metrics")).text();
    assert.match(metrics, /astrai_time_to_first_token_seconds_count [1-9]/);
    assert.match(metrics, /astrai_inter_token_latency_seconds_bucket\{le="\+Inf"\} [1-9]/);
    assert.match(metrics, /astrai_request_queue_time_seconds_count [1-9]/);
    assert.match(metrics, /astrai_e2e_request_latency_seconds_sum /);
  }],

  ["disconnect mid-stream cancels the request and returns its pages", async () => {
    const before = await stats(srv.base);
    const ctl = new AbortController();
    const r = await fetch(srv.base + "/v1/chat/completions", {
      method: "POST", signal: ctl.signal, headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "tiny", messages: user("go on forever"), max_tokens: 3000, stream: true, temperature: 1, seed: 1 }),
    });
    const reader = r.body.getReader();
    let got = "";
    while ((got.match(/data: /g) || []).length < 4) got += new TextDecoder().decode((await reader.read()).value);
    const during = await stats(srv.base);
    assert.equal(during.running, 1);
    assert.ok(during.kv_pages_used > 0);
    ctl.abort();
    await waitFor(async () => { const s = await stats(srv.base); return s.running === 0 && s.kv_pages_used === 0; }, "pages back");
    const metrics = await (await fetch(srv.base + "/metrics")).text();
    assert.match(metrics, /astrai_client_disconnects_total 1/);
    const after = await stats(srv.base);
    assert.equal(after.kv_pages_free, before.kv_pages_free);
  }],

  ["disconnect while queued cancels too", async () => {
    // Fill the running batch (max-running 64) with long requests, queue one more, drop it.
    const ctls = [];
    const started = [];
    for (let i = 0; i < 64; i++) {
      const ctl = new AbortController();
      ctls.push(ctl);
      started.push(fetch(srv.base + "/v1/completions", {
        method: "POST", signal: ctl.signal, headers: { "content-type": "application/json" },
        body: JSON.stringify({ model: "tiny", prompt: "x " + i, max_tokens: 3000, stream: true }),
      }).catch(() => null));
    }
    await waitFor(async () => (await stats(srv.base)).running === 64, "64 running");
    const late = new AbortController();
    fetch(srv.base + "/v1/completions", {
      method: "POST", signal: late.signal, headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "tiny", prompt: "late", max_tokens: 5, stream: true }),
    }).catch(() => null);
    await waitFor(async () => (await stats(srv.base)).waiting === 1, "one waiting");
    late.abort();
    await waitFor(async () => (await stats(srv.base)).waiting === 0, "queued request cancelled");
    for (const c of ctls) c.abort();
    await Promise.all(started);
    await waitFor(async () => { const s = await stats(srv.base); return s.running === 0 && s.kv_pages_used === 0; }, "all pages back");
  }],

  ["256 concurrent streams complete with bounded threads", async () => {
    const pid = srv.proc.pid;
    const threads = () => Number(fs.readFileSync(`/proc/${pid}/status`, "utf8").match(/Threads:\s+(\d+)/)[1]);
    const threadsBefore = threads();
    let peakConnections = 0;
    const jobs = [];
    for (let i = 0; i < 256; i++) {
      jobs.push((async () => {
        const chunks = await collectChatStream({ model: "tiny", messages: user("stream " + i), max_tokens: 16, temperature: 1, seed: i });
        return chunks;
      })());
    }
    const poll = setInterval(async () => {
      const s = await stats(srv.base).catch(() => null);
      if (s) peakConnections = Math.max(peakConnections, s.open_connections);
    }, 50);
    const results = await Promise.all(jobs);
    clearInterval(poll);
    for (const chunks of results) {
      const finish = chunks.flatMap((c) => c.choices.map((ch) => ch.finish_reason)).filter(Boolean);
      assert.equal(finish.length, 1);
    }
    assert.ok(peakConnections >= 100, "streams were open at once: " + peakConnections);
    assert.equal(threads(), threadsBefore, "no thread per connection");
    await waitFor(async () => { const s = await stats(srv.base); return s.running === 0 && s.kv_pages_used === 0; }, "idle");
  }],

  ["auth: keys via Bearer and x-api-key; /health exempt; SIGTERM drains and exits 0", async () => {
    const locked = await startServer(model, ["--api-key", "k1", "--api-key", "k2"]);
    try {
      const ok = new OpenAI({ baseURL: locked.base + "/v1", apiKey: "k2", maxRetries: 0 });
      assert.equal((await ok.chat.completions.create({ model: "tiny", messages: user("hi"), max_tokens: 2 })).choices.length, 1);
      const bad = new OpenAI({ baseURL: locked.base + "/v1", apiKey: "nope", maxRetries: 0 });
      await assert.rejects(bad.models.list(), (e) => e.status === 401 && e instanceof OpenAI.AuthenticationError);
      const a = new Anthropic({ baseURL: locked.base, apiKey: "k1", maxRetries: 0 });
      assert.equal((await a.messages.create({ model: "tiny", max_tokens: 2, messages: user("hi") })).usage.output_tokens, 2);
      const abad = new Anthropic({ baseURL: locked.base, apiKey: "zzz", maxRetries: 0 });
      await assert.rejects(abad.messages.create({ model: "tiny", max_tokens: 2, messages: user("hi") }), (e) => e.status === 401 && e instanceof Anthropic.AuthenticationError);
      assert.equal((await fetch(locked.base + "/health")).status, 200);
      assert.equal((await fetch(locked.base + "/stats")).status, 401);
      // A stream in flight when SIGTERM arrives still ends properly.
      const r = await fetch(locked.base + "/v1/chat/completions", {
        method: "POST", headers: { "content-type": "application/json", authorization: "Bearer k1" },
        body: JSON.stringify({ model: "tiny", messages: user("long"), max_tokens: 40, stream: true }),
      });
      const textPromise = r.text();
      locked.proc.kill("SIGTERM");
      const text = await textPromise;
      assert.ok(text.endsWith("data: [DONE]\n\n"), text.slice(-200));
      const exit = await locked.exited;
      assert.equal(exit.code, 0);
      assert.match(locked.log(), /serve: stopped/);
    } finally {
      await locked.stop();
    }
  }],
];

await run(tests, () => srv.stop());
