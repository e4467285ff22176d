// The dashboard page in headless Chromium (Debian `chromium`, npm playwright-core) against a
// live `astrai dashboard` over three runs whose metrics.jsonl the test writes: a pretraining
// run (loss + val_loss, lr, grad_norm, tokens/s), a DPO run and a GRPO run. Checks that the
// panels of the metrics present appear, that overlaid runs have a legend entry each, and that
// lines appended to a metrics.jsonl (one of them written in two parts) show up without a reload.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import fs from "node:fs";
import path from "node:path";

import { BIN, requireJs, run, tempDir } from "../serve/e2e_common.mjs";

const { chromium } = requireJs("playwright-core");

const root = tempDir("astrai-dashboard-");
const dirs = { pretrain: path.join(root, "pretrain"), dpo: path.join(root, "dpo"), grpo: path.join(root, "grpo") };
for (const d of Object.values(dirs)) fs.mkdirSync(d);
const line = (rec) => JSON.stringify(rec) + "\n";
const seqRecord = (step) => ({ step, loss: 4 / step, lr: 1e-3, grad_norm: 1 + 1 / step, tokens_per_s: 900 + step, step_seconds: 0.2,
                               ...(step % 5 === 0 ? { val_loss: 4.2 / step } : {}) });
fs.writeFileSync(path.join(dirs.pretrain, "metrics.jsonl"), Array.from({ length: 10 }, (_, i) => line(seqRecord(i + 1))).join(""));
fs.writeFileSync(path.join(dirs.dpo, "metrics.jsonl"), Array.from({ length: 6 }, (_, i) => line({
  step: i + 1, loss: 0.69 - 0.05 * i, lr: 1e-4, grad_norm: 0.5, tokens_per_s: 300, rewards_chosen: 0.1 * i,
  rewards_rejected: -0.1 * i, rewards_margin: 0.2 * i, rewards_accuracy: 0.5 + 0.05 * i })).join(""));
fs.writeFileSync(path.join(dirs.grpo, "metrics.jsonl"), Array.from({ length: 4 }, (_, i) => line({
  step: i + 1, loss: 0.01, lr: 1e-5, grad_norm: 0.1, tokens_per_s: 50, reward_mean: 0.25 * i, kl: 0.001 * i,
  clip_fraction: 0 })).join(""));

const proc = spawn(BIN, ["dashboard", dirs.pretrain, dirs.dpo, dirs.grpo, "--port", "0"], { stdio: ["ignore", "ignore", "pipe"] });
let log = "";
const base = await new Promise((resolve, reject) => {
  const timer = setTimeout(() => reject(new Error("dashboard did not start:\n" + log)), 30000);
  proc.stderr.on("data", (d) => {
    log += d.toString();
    const m = log.match(/listening on (http:\/\/127\.0\.0\.1:\d+\/)/);
    if (m) { clearTimeout(timer); resolve(m[1]); }
  });
  proc.on("exit", (code) => reject(new Error(`dashboard exited with ${code}:\n${log}`)));
});
const exited = new Promise((resolve) => proc.on("exit", (code, signal) => resolve({ code, signal })));

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run"],
});

const legend = (page, panel) => page.$$eval(`.panel[data-panel='${panel}'] .legend .item`,
  (items) => items.map((i) => `${i.dataset.run}:${i.dataset.key}`));

const tests = [
  ["panels of the metrics present, legends per run, live updates without reload", async () => {
    const page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
    const errors = [];
    page.on("pageerror", (e) => errors.push(String(e)));
    await page.goto(base);
    await page.waitForSelector(".panel[data-panel='loss'][data-points]");
    await page.waitForFunction(() => document.querySelectorAll(".panel").length >= 10);
    const panels = await page.$$eval(".panel", (els) => els.map((e) => e.dataset.panel));
    assert.deepEqual(panels, ["loss", "lr", "grad_norm", "tokens_per_s", "step_seconds", "rewards_margin",
                              "rewards_accuracy", "rewards_chosen", "reward_mean", "kl", "clip_fraction"]);
    assert.deepEqual(await legend(page, "loss"), ["pretrain:loss", "pretrain:val_loss", "dpo:loss", "grpo:loss"]);
    assert.deepEqual(await legend(page, "lr"), ["pretrain:lr", "dpo:lr", "grpo:lr"]);
    assert.deepEqual(await legend(page, "rewards_margin"), ["dpo:rewards_margin"]);
    assert.deepEqual(await legend(page, "kl"), ["grpo:kl"]);
    assert.equal(await page.textContent(".panel[data-panel='lr'] .legend .item:nth-child(2)"), "dpo (6)");
    // The canvas was drawn on: some pixels are not blank.
    const inked = await page.$eval(".panel[data-panel='loss'] canvas", (c) =>
      c.getContext("2d").getImageData(0, 0, c.width, c.height).data.some((v, i) => i % 4 === 3 && v > 0));
    assert.ok(inked, "loss canvas has ink");
    assert.equal(await page.getAttribute(".panel[data-panel='loss']", "data-last-step"), "10");
    assert.match(await page.textContent(".run[data-run='pretrain'] .count"), /10 records/);

    await page.evaluate(() => { window.notReloaded = true; });
    const file = path.join(dirs.pretrain, "metrics.jsonl");
    const next = line(seqRecord(11));
    fs.appendFileSync(file, next.slice(0, 9));  // a partly written line: not shown yet
    await new Promise((r) => setTimeout(r, 1500));
    assert.equal(await page.getAttribute(".panel[data-panel='loss']", "data-last-step"), "10");
    fs.appendFileSync(file, next.slice(9) + line(seqRecord(12)) + line(seqRecord(13)) + line(seqRecord(14)) + line(seqRecord(15)));
    await page.waitForFunction(() => document.querySelector(".panel[data-panel='loss']").dataset.lastStep === "15",
      null, { timeout: 10000 });
    assert.ok(await page.evaluate(() => window.notReloaded === true), "the page was not reloaded");
    assert.equal(await page.textContent(".panel[data-panel='loss'] .legend .item:nth-child(2)"), "pretrain val_loss (3)");
    assert.match(await page.textContent(".run[data-run='pretrain'] .count"), /15 records/);
    // Log scale for a positive panel redraws without errors.
    await page.check(".panel[data-panel='loss'] input.log");
    if (process.env.ASTRAI_DASHBOARD_SCREENSHOT) await page.screenshot({ path: process.env.ASTRAI_DASHBOARD_SCREENSHOT, fullPage: true });
    assert.deepEqual(errors, []);
  }],
];

await run(tests, async () => {
  await browser.close();
  proc.kill("SIGTERM");
  const { code } = await exited;
  assert.equal(code, 0, "dashboard exits 0 on SIGTERM");
});
