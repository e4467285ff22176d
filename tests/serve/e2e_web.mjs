// The built-in chat page in headless Chromium (Debian `chromium`, npm playwright-core), against a
// live `astrai serve` with a tiny random-weight model: streaming with token counts and timings,
// the system prompt, conversations in localStorage (reload, rename, delete, export/import), stop
// (cancelled server-side), regenerate, edit-and-resend, every sampling setting in the request,
// the API key, keyboard-only use and a phone-sized screen. Only the escaping/Markdown test fakes
// the model's output (page.route), to make it contain <script> and <img onerror>.
// Screenshots at 1280 and 390 px go to $ASTRAI_ARTIFACTS (set by ctest).
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";

import { countChatTokens, makeModel, requireJs, run, startServer, stats, tempDir, waitFor } from "./e2e_common.mjs";

const { chromium } = requireJs("playwright-core");
const ARTIFACTS = process.env.ASTRAI_ARTIFACTS ||
                  path.resolve(import.meta.dirname, "../../build/release/tests/serve/artifacts");
const KEY = "web-test-key";
const model = makeModel();
// One compute thread each: the model is tiny, and spinning OpenMP threads on a busy machine (CI
// runs tests side by side) cost far more than they give.
const [srv, locked] = await Promise.all([startServer(model, ["--threads", "1"]),
                                         startServer(model, ["--threads", "1", "--api-key", KEY])]);
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run"],
});

// A fresh browser context (empty localStorage) on `base`; records page errors and the bodies
// and headers of chat requests.
async function open(base = srv.base, options = {}) {
  const context = await browser.newContext({ reducedMotion: "reduce", viewport: { width: 1280, height: 900 }, ...options });
  const page = await context.newPage();
  const errors = [];
  const chatRequests = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  page.on("request", (r) => {
    if (r.url().endsWith("/v1/chat/completions")) chatRequests.push({ body: r.postDataJSON(), headers: r.headers() });
  });
  await page.goto(base + "/");
  return { context, page, errors, chatRequests };
}

async function modelShown(page) {
  await page.waitForFunction(() => document.getElementById("model").textContent === "tiny");
}

// Sets sampling fields through the settings dialog (as a user does).
async function setSettings(page, fields) {
  await page.click("#settings-open");
  for (const [name, value] of Object.entries(fields)) {
    if (typeof value === "boolean") await page.setChecked("#set-" + name, value);
    else await page.fill("#set-" + name, value);
  }
  await page.click("#settings-close");
}

// Presses key (Tab or Shift+Tab) until the element with this id has the focus.
async function tabTo(page, id, key) {
  for (let i = 0; i < 40; i++) {
    if (await page.evaluate(() => document.activeElement.id) === id) return;
    await page.keyboard.press(key);
  }
  throw new Error(`${key} never reached #${id}`);
}

async function idle(page) {
  await page.waitForFunction(() => !document.body.classList.contains("busy"), null, { timeout: 60000 });
}

async function sendAndWait(page, text) {
  await page.fill("#input", text);
  await page.press("#input", "Enter");
  await idle(page);
}

const storedChats = (page) => page.evaluate(() => JSON.parse(localStorage.getItem("astrai.chats")));
const chatTitles = (page) => page.$$eval("#chats .chat-title", (els) => els.map((e) => e.textContent));
const messageRoles = (page) => page.$$eval("#log .msg", (els) => els.map((e) => (e.classList.contains("user") ? "user" : "assistant")));
const lastMeta = (page) => page.textContent("#log .msg.assistant:last-child .meta");

async function serverIdle(base, headers) {
  await waitFor(async () => {
    const s = await stats(base, headers);
    return s.running === 0 && s.kv_pages_used === 0;
  }, "no running request and no KV pages in use");
}

const tests = [
  ["a reply streams with tokens, TTFT and tokens/s; model, context and load shown; system prompt sent", async () => {
    const { context, page, errors, chatRequests } = await open();
    await modelShown(page);
    assert.equal(await page.textContent("#ctx"), "context 4096 tokens");
    await page.waitForFunction(() => /^running 0 · waiting 0 · KV pages 0\/\d+$/.test(document.getElementById("load").textContent));
    await page.click("#system-box summary");
    await page.fill("#system", "You answer in one word.");
    await setSettings(page, { max_tokens: "8" });
    await page.click("#input");
    await page.keyboard.type("Hello");
    await page.keyboard.press("Shift+Enter");
    await page.keyboard.type("world");
    await page.keyboard.press("Enter");
    await idle(page);
    assert.equal(chatRequests.length, 1);
    const { body } = chatRequests[0];
    assert.deepEqual(body.messages, [{ role: "system", content: "You answer in one word." }, { role: "user", content: "Hello\nworld" }]);
    assert.equal(body.model, "tiny");
    assert.equal(body.stream, true);
    assert.deepEqual(body.stream_options, { include_usage: true });
    assert.equal(body.max_tokens, 8);
    assert.equal(await page.textContent("#log .msg.user .plain"), "Hello\nworld");
    const prompt = countChatTokens(model, body.messages);
    assert.match(await lastMeta(page),
                 new RegExp(`^8 tokens · TTFT \\d+ ms · \\d+\\.\\d tok/s · context ${prompt + 8}/4096 · finish: length$`));
    const [chat] = await storedChats(page);
    assert.equal(chat.system, "You answer in one word.");
    assert.equal(chat.title, "Hello");
    assert.ok(chat.messages[1].content.length > 0);
    assert.equal(chat.messages[1].stats.completion_tokens, 8);
    assert.deepEqual(errors, []);
    await context.close();
  }],

  ["conversations persist across reload; rename, delete, export and import round-trip", async () => {
    const { context, page, errors } = await open();
    await modelShown(page);
    await setSettings(page, { max_tokens: "4" });
    await sendAndWait(page, "first chat");
    await page.click("#new-chat");
    await sendAndWait(page, "second chat");
    const logBefore = await page.innerText("#log");
    await page.reload();
    await modelShown(page);
    assert.deepEqual(await chatTitles(page), ["second chat", "first chat"]);
    assert.equal(await page.innerText("#log"), logBefore);
    // Rename "first chat" in place; the name survives a reload.
    await page.click('#chats li:has-text("first chat") .rename');
    await page.fill("#chats input", "Renamed <b>chat</b>");
    await page.press("#chats input", "Enter");
    await page.reload();
    assert.deepEqual(await chatTitles(page), ["second chat", "Renamed <b>chat</b>"]);
    // Export: the file holds exactly what localStorage holds.
    const [download] = await Promise.all([page.waitForEvent("download"), page.click("#export")]);
    const file = path.join(tempDir("astrai-web-"), "chats.json");
    await download.saveAs(file);
    const exported = JSON.parse(fs.readFileSync(file, "utf8"));
    assert.equal(exported.format, "astrai-chats");
    assert.deepEqual(exported.conversations, await storedChats(page));
    // Delete (confirmed), then import the export: the deleted one comes back as it was, the
    // other gets a new id beside the original.
    page.once("dialog", (d) => d.accept());
    await page.click('#chats li:has-text("Renamed") .delete');
    assert.deepEqual(await chatTitles(page), ["second chat"]);
    assert.equal((await storedChats(page)).length, 1);
    await page.setInputFiles("#import-file", file);
    await page.waitForFunction(() => document.getElementById("status").textContent.startsWith("Imported 2 conversations"));
    const after = await storedChats(page);
    assert.equal(after.length, 3);
    const renamed = exported.conversations.find((c) => c.title.startsWith("Renamed"));
    assert.deepEqual(after.find((c) => c.title.startsWith("Renamed")), renamed);
    assert.equal(new Set(after.map((c) => c.id)).size, 3);
    // A malformed file is refused with the reason, and nothing is added.
    const bad = path.join(path.dirname(file), "bad.json");
    fs.writeFileSync(bad, JSON.stringify({ conversations: [{ messages: [{ role: "bot", content: 1 }] }] }));
    await page.setInputFiles("#import-file", bad);
    await page.waitForFunction(() => document.getElementById("status").textContent.includes("failed"));
    assert.match(await page.textContent("#status"), /conversation 1, message 1: needs role 'user' or 'assistant'/);
    assert.equal((await storedChats(page)).length, 3);
    assert.deepEqual(errors, []);
    await context.close();
  }],

  ["stop cancels server-side; regenerate replaces the reply; edit and resend truncates the history", async () => {
    const { context, page, errors, chatRequests } = await open();
    await modelShown(page);
    await setSettings(page, { max_tokens: "3000" });
    await page.fill("#input", "Keep going");
    await page.press("#input", "Enter");
    await waitFor(async () => (await stats(srv.base)).running === 1, "generation running");
    await page.waitForFunction(() => document.querySelector("#log .msg.assistant .body").textContent.length > 0);
    await page.click("#stop");
    await idle(page);
    assert.match(await lastMeta(page), /stopped/);
    await serverIdle(srv.base);
    let [chat] = await storedChats(page);
    assert.equal(chat.messages[1].stopped, true);
    assert.ok(chat.messages[1].content.length > 0);
    const stoppedText = chat.messages[1].content;
    // Regenerate: the same history is asked again and the new reply takes the old one's place.
    await setSettings(page, { max_tokens: "6" });
    await page.click("#log .regen");
    await idle(page);
    assert.deepEqual(chatRequests[1].body.messages, [{ role: "user", content: "Keep going" }]);
    assert.deepEqual(await messageRoles(page), ["user", "assistant"]);
    assert.match(await lastMeta(page), /^6 tokens .* finish: length$/);
    [chat] = await storedChats(page);
    assert.equal(chat.messages.length, 2);
    assert.notEqual(chat.messages[1].content, stoppedText);
    assert.equal(chat.messages[1].stopped, undefined);
    // A second turn, then edit the first question: everything after it goes.
    await sendAndWait(page, "Second question");
    assert.equal(chatRequests[2].body.messages.length, 3);
    assert.deepEqual(await messageRoles(page), ["user", "assistant", "user", "assistant"]);
    await page.click("#log .msg.user >> nth=0 >> .edit-btn");
    await page.fill("#log .edit textarea", "Edited question");
    await page.click("#log .save-edit");
    await idle(page);
    assert.deepEqual(chatRequests[3].body.messages, [{ role: "user", content: "Edited question" }]);
    assert.deepEqual(await messageRoles(page), ["user", "assistant"]);
    [chat] = await storedChats(page);
    assert.deepEqual(chat.messages.map((m) => m.role), ["user", "assistant"]);
    assert.equal(chat.messages[0].content, "Edited question");
    assert.deepEqual(errors, []);
    await context.close();
  }],

  ["every sampling setting reaches the request body and persists; a bad setting blocks sending", async () => {
    const { context, page, errors, chatRequests } = await open();
    await modelShown(page);
    const tools = [{ type: "function", function: { name: "get_time", parameters: { type: "object", properties: {} } } }];
    const fields = {
      temperature: "0.5", top_p: "0.9", top_k: "20", min_p: "0.05", presence_penalty: "0.1", frequency_penalty: "0.2",
      repetition_penalty: "1.1", seed: "7", max_tokens: "5", stop: "zzzz\nyyyy", logit_bias: '{"15": -1}',
      ignore_eos: true, tools: JSON.stringify(tools), chat_template_kwargs: '{"enable_thinking": false}',
    };
    await setSettings(page, fields);
    await page.reload();
    await modelShown(page);
    for (const [name, value] of Object.entries(fields)) {
      if (typeof value === "boolean") assert.equal(await page.isChecked("#set-" + name), value, name);
      else assert.equal(await page.inputValue("#set-" + name), value, name);
    }
    await sendAndWait(page, "hi");
    const { body } = chatRequests[0];
    assert.deepEqual({ ...body, messages: undefined }, {
      messages: undefined, model: "tiny", stream: true, stream_options: { include_usage: true },
      temperature: 0.5, top_p: 0.9, top_k: 20, min_p: 0.05, presence_penalty: 0.1, frequency_penalty: 0.2,
      repetition_penalty: 1.1, seed: 7, max_tokens: 5, stop: ["zzzz", "yyyy"], logit_bias: { 15: -1 }, ignore_eos: true,
      tools, chat_template_kwargs: { enable_thinking: false },
    });
    assert.match(await lastMeta(page), /tokens · TTFT/);  // the server took every field
    assert.equal(await page.$("#log .error-text"), null);
    // A field that does not parse: nothing is sent, the message stays in the box.
    await setSettings(page, { logit_bias: "{oops" });
    await page.fill("#input", "not sent");
    await page.press("#input", "Enter");
    await page.waitForFunction(() => document.getElementById("status").textContent.startsWith("Settings: Logit bias is not valid JSON"));
    assert.equal(await page.inputValue("#input"), "not sent");
    assert.equal(chatRequests.length, 1);
    assert.equal((await storedChats(page))[0].messages.length, 2);
    // A value the server refuses comes back as its error in the reply.
    await setSettings(page, { logit_bias: "", temperature: "5" });
    await sendAndWait(page, "too hot");
    assert.match(await page.textContent("#log .msg.assistant:last-child .error-text"), /temperature/);
    assert.deepEqual(errors, []);
    await context.close();
  }],

  ["with --api-key the page sends the key as Bearer; without it, it says so", async () => {
    const { context, page, errors, chatRequests } = await open(locked.base);
    await page.waitForFunction(() => document.getElementById("model").textContent.includes("set the API key in Settings"));
    await page.click("#settings-open");
    await page.fill("#api-key", KEY);
    await page.press("#api-key", "Tab");
    await page.click("#settings-close");
    await modelShown(page);
    await page.waitForFunction(() => document.getElementById("load").textContent.startsWith("running"));
    await setSettings(page, { max_tokens: "4" });
    await sendAndWait(page, "secret hello");
    assert.equal(chatRequests[0].headers.authorization, "Bearer " + KEY);
    assert.match(await lastMeta(page), /^4 tokens/);
    // A wrong key: the server's 401 shows in the reply.
    await page.click("#settings-open");
    await page.fill("#api-key", "wrong");
    await page.press("#api-key", "Tab");
    await page.click("#settings-close");
    await sendAndWait(page, "again");
    assert.match(await page.textContent("#log .msg.assistant:last-child .error-text"), /invalid or missing API key/);
    assert.deepEqual(errors, []);
    await context.close();
  }],

  ["model output with <script> and <img onerror> renders as text; Markdown, code, math, tool calls", async () => {
    const { context, page, errors } = await open(srv.base, { permissions: ["clipboard-read", "clipboard-write"] });
    await page.addInitScript(() => { window.__xss = 0; });
    await page.reload();
    await modelShown(page);
    const code = 'def f(x):  # <script>window.__xss = 4</script>\n    return "s" + 42';
    const reply = [
      "<think>plan <img src=x onerror=\"window.__xss=5\"></think>",
      "# Title <script>window.__xss=1</script>",
      "",
      'Text <img src=x onerror="window.__xss=2"> with **bold**, *it*, `<b>code</b>` and [a link](https://example.com/) ' +
        "and [bad](javascript:window.__xss=3).",
      "",
      "- one",
      "- two <svg onload=window.__xss=6>",
      "",
      "| a | b |",
      "|---|---|",
      "| <i>1</i> | 2 |",
      "",
      "```python",
      code,
      "```",
      "",
      "$$\\frac{a}{b} + x^{2} \\le \\alpha$$",
    ].join("\n");
    const sse = [
      ...reply.match(/[\s\S]{1,9}/g).map((piece) => ({ choices: [{ index: 0, delta: { content: piece }, finish_reason: null }] })),
      { choices: [{ index: 0, delta: { tool_calls: [{ index: 0, id: "call_1", type: "function",
                                                    function: { name: "<img src=x onerror=window.__xss=7>", arguments: "" } }] } }] },
      { choices: [{ index: 0, delta: { tool_calls: [{ index: 0, function: { arguments: '{"q": "<script>x</script>"}' } }] } }] },
      { choices: [{ index: 0, delta: {}, finish_reason: "tool_calls" }] },
      { choices: [], usage: { prompt_tokens: 9, completion_tokens: 70, total_tokens: 79 },
        timings: { ttft_ms: 12.4, decode_tokens_per_second: 55.56 } },
    ].map((j) => "data: " + JSON.stringify(j) + "\n\n").join("") + "data: [DONE]\n\n";
    await page.route("**/v1/chat/completions", (route) =>
      route.fulfill({ status: 200, headers: { "Content-Type": "text/event-stream" }, body: sse }));
    await sendAndWait(page, "<script>window.__xss=8</script> show me");
    await page.waitForTimeout(300);
    assert.equal(await page.evaluate(() => window.__xss), 0);
    const log = "#log";
    assert.equal(await page.$$eval("img, svg, iframe, i, b", (els) => els.length), 0);
    assert.equal(await page.$$eval("script", (els) => els.length), 1);  // the page's own
    assert.equal(await page.textContent("#chats .chat-title"), "<script>window.__xss=8</script> show me");
    const onAttrs = await page.$$eval("body *", (els) => els.flatMap((e) => [...e.attributes].map((a) => a.name)).filter((n) => n.startsWith("on")));
    assert.deepEqual(onAttrs, []);
    const text = await page.textContent(log);
    for (const s of ["<script>window.__xss=1</script>", '<img src=x onerror="window.__xss=2">', "<svg onload=window.__xss=6>",
                     "<b>code</b>", "[bad](javascript:window.__xss=3)", "<i>1</i>", "<script>window.__xss=8</script> show me",
                     '"q": "<script>x</script>"', "<img src=x onerror=window.__xss=7>", 'onerror="window.__xss=5"']) {
      assert.ok(text.includes(s), "shown as text: " + s);
    }
    assert.deepEqual(await page.$$eval(`${log} a`, (els) => els.map((a) => a.getAttribute("href"))), ["https://example.com/"]);
    // The Markdown's structure.
    assert.equal(await page.textContent(`${log} h1`), "Title <script>window.__xss=1</script>");
    assert.equal(await page.textContent(`${log} strong`), "bold");
    assert.equal(await page.textContent(`${log} em`), "it");
    assert.deepEqual(await page.$$eval(`${log} ul li`, (els) => els.map((e) => e.textContent)), ["one", "two <svg onload=window.__xss=6>"]);
    assert.equal(await page.$$eval(`${log} table tr`, (els) => els.length), 2);
    assert.equal(await page.textContent(`${log} details.think`), 'Thoughtsplan <img src=x onerror="window.__xss=5">');
    assert.equal(await page.textContent(`${log} .code code`), code);
    assert.equal(await page.getAttribute(`${log} .code code`, "data-lang"), "python");
    assert.deepEqual(await page.$$eval(`${log} .code .tok-k`, (els) => els.map((e) => e.textContent)), ["def", "return"]);
    assert.deepEqual(await page.$$eval(`${log} .code .tok-s`, (els) => els.map((e) => e.textContent)), ['"s"']);
    assert.deepEqual(await page.$$eval(`${log} .code .tok-n`, (els) => els.map((e) => e.textContent)), ["42"]);
    assert.equal(await page.textContent(`${log} .code .tok-c`), "# <script>window.__xss = 4</script>");
    assert.equal(await page.textContent(`${log} div.math`), "a/b + x2 ≤ α");
    assert.equal(await page.textContent(`${log} div.math sup`), "2");
    assert.equal(await page.textContent(`${log} .tool-call code`), "<img src=x onerror=window.__xss=7>");
    assert.equal(await page.textContent(`${log} .tool-call pre`), '{\n  "q": "<script>x</script>"\n}');
    assert.equal(await lastMeta(page), "70 tokens · TTFT 12 ms · 55.6 tok/s · context 79/4096 · finish: tool_calls");
    const html = await page.innerHTML(log);
    // Copy puts the code block's text on the clipboard.
    await page.click(`${log} .code .copy`);
    assert.equal(await page.evaluate(() => navigator.clipboard.readText()), code);
    // Stored and rendered again after a reload: the same page, still inert.
    await page.reload();
    await modelShown(page);
    assert.equal(await page.innerHTML(log), html);
    assert.equal(await page.evaluate(() => window.__xss), 0);
    fs.mkdirSync(ARTIFACTS, { recursive: true });
    await page.screenshot({ path: path.join(ARTIFACTS, "chat-1280.png") });
    await page.setViewportSize({ width: 390, height: 844 });
    await page.screenshot({ path: path.join(ARTIFACTS, "chat-390.png") });
    assert.deepEqual(errors, []);
    await context.close();
  }],

  ["phone-sized screen, keyboard only: list behind ☰, Enter/Shift+Enter, Escape stops", async () => {
    const { context, page, errors, chatRequests } = await open(srv.base, { viewport: { width: 390, height: 844 }, isMobile: true, hasTouch: true });
    await modelShown(page);
    assert.ok(await page.evaluate(() => document.documentElement.scrollWidth <= 390), "no horizontal scrolling");
    assert.equal(await page.isVisible("#side"), false);
    // Keyboard only: Tab to ☰, open the list, start a chat, write two lines, send.
    await page.evaluate(() => document.activeElement.blur());
    await tabTo(page, "side-open", "Tab");
    await page.keyboard.press("Enter");
    assert.equal(await page.isVisible("#side"), true);
    assert.equal(await page.evaluate(() => document.activeElement.id), "new-chat");
    await page.keyboard.press("Enter");
    assert.equal(await page.evaluate(() => document.activeElement.id), "input");
    assert.equal(await page.isVisible("#side"), false);
    // The settings dialog by keyboard: Shift+Tab back to its button, Tab through the fields.
    await tabTo(page, "settings-open", "Shift+Tab");
    await page.keyboard.press("Enter");
    assert.equal(await page.evaluate(() => document.activeElement.id), "api-key");
    await tabTo(page, "set-max_tokens", "Tab");
    await page.keyboard.type("3000");
    await page.keyboard.press("Escape");
    assert.equal(await page.evaluate(() => document.getElementById("settings").open), false);
    await tabTo(page, "input", "Tab");
    await page.keyboard.type("line one");
    await page.keyboard.press("Shift+Enter");
    await page.keyboard.type("line two");
    await page.keyboard.press("Enter");
    await waitFor(async () => (await stats(srv.base)).running === 1, "generation running");
    await page.waitForFunction(() => document.querySelector("#log .msg.assistant .body").textContent.length > 0);
    await page.keyboard.press("Escape");
    await idle(page);
    await serverIdle(srv.base);
    assert.equal(chatRequests[0].body.messages[0].content, "line one\nline two");
    assert.equal(chatRequests[0].body.max_tokens, 3000);
    assert.match(await lastMeta(page), /stopped/);
    assert.ok(await page.evaluate(() => document.documentElement.scrollWidth <= 390), "no horizontal scrolling");
    // Escape closes the list again, back on ☰.
    await tabTo(page, "side-open", "Shift+Tab");
    await page.keyboard.press("Enter");
    assert.equal(await page.isVisible("#side"), true);
    await page.keyboard.press("Escape");
    assert.equal(await page.isVisible("#side"), false);
    assert.equal(await page.evaluate(() => document.activeElement.id), "side-open");
    fs.mkdirSync(ARTIFACTS, { recursive: true });
    await page.screenshot({ path: path.join(ARTIFACTS, "chat-390-keyboard.png") });
    assert.deepEqual(errors, []);
    await context.close();
  }],
];

await run(tests, async () => {
  await browser.close();
  await Promise.all([srv.stop(), locked.stop()]);
});
