// The built-in chat page in headless Chromium (Debian `chromium`, npm playwright-core): it
// loads, shows the model name, sends a message, shows a streamed reply, and Stop works.
import assert from "node:assert/strict";

import { makeModel, requireJs, run, startServer, stats, waitFor } from "./e2e_common.mjs";

const { chromium } = requireJs("playwright-core");
const model = makeModel();
const srv = await startServer(model);
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run"],
});

const tests = [
  ["page loads, streams a reply, stop button cancels", async () => {
    const page = await browser.newPage();
    const errors = [];
    page.on("pageerror", (e) => errors.push(String(e)));
    await page.goto(srv.base + "/");
    await page.waitForFunction(() => document.getElementById("model").textContent === "tiny");
    await page.fill("#max_tokens", "12");
    await page.fill("#input", "Hello from the browser");
    await page.click("#send");
    await page.waitForSelector(".msg.assistant[data-done='1']", { timeout: 120000 });
    const reply = await page.textContent(".msg.assistant");
    assert.ok(reply.length > 0);
    assert.match(reply, /12 completion tokens, finish: length/);
    assert.equal(await page.textContent(".msg.user"), "Hello from the browser");
    // A long reply, stopped halfway: the request is cancelled server-side.
    await page.fill("#max_tokens", "3000");
    await page.fill("#input", "Keep going");
    await page.click("#send");
    await waitFor(async () => (await stats(srv.base)).running === 1, "generation running");
    await page.waitForFunction(() => document.querySelectorAll(".msg.assistant")[1].textContent.length > 0);
    await page.click("#stop");
    await page.waitForSelector(".msg.assistant:nth-of-type(4)[data-done='1']");
    assert.match(await page.textContent(".msg.assistant:nth-of-type(4)"), /stopped/);
    await waitFor(async () => { const s = await stats(srv.base); return s.running === 0 && s.kv_pages_used === 0; }, "cancelled");
    assert.deepEqual(errors, []);
  }],
];

await run(tests, async () => {
  await browser.close();
  await srv.stop();
});
