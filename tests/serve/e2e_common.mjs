// Shared helpers of the server's end-to-end tests: a small random-weight model with the real
// Qwen3 tokenizer, a live `astrai serve` on a free loopback port, independent token counts
// from `astrai chat-template` + `astrai tokenize`, and a tiny test runner.
import { spawn, execFileSync } from "node:child_process";
import { createRequire } from "node:module";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";

export const BIN = process.env.ASTRAI_BIN || "astrai";
export const ASSETS = process.env.ASTRAI_ASSETS || path.resolve(import.meta.dirname, "../../assets");
export const PYTHON = process.env.ASTRAI_PYTHON || "/usr/bin/python3";
export const requireJs = createRequire(path.join(ASSETS, "js/package.json"));

// A fresh directory under the system temp dir, removed when the test process exits.
const tempDirs = [];
process.on("exit", () => {
  for (const d of tempDirs) fs.rmSync(d, { recursive: true, force: true });
});
export function tempDir(prefix) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), prefix));
  tempDirs.push(dir);
  return dir;
}

export function makeModel() {
  const dir = tempDir("astrai-serve-");
  execFileSync(PYTHON, [path.join(import.meta.dirname, "make_model.py"), path.join(dir, "tiny")], {
    env: { ...process.env, ASTRAI_ASSETS: ASSETS },
  });
  return path.join(dir, "tiny");
}

// Starts `astrai serve --port 0 ...`, waits for its "listening on" line and a healthy /health.
export async function startServer(modelDir, extra = []) {
  const proc = spawn(BIN, ["serve", "--model", modelDir, "--port", "0", "--model-name", "tiny", ...extra], {
    stdio: ["ignore", "ignore", "pipe"],
    env: { ...process.env, OMP_NUM_THREADS: process.env.OMP_NUM_THREADS || "2" },
  });
  let log = "";
  const port = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("server did not start:\n" + log)), 120000);
    proc.stderr.on("data", (d) => {
      log += d.toString();
      const m = log.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m) {
        clearTimeout(timer);
        resolve(Number(m[1]));
      }
    });
    proc.on("exit", (code) => reject(new Error(`server exited with ${code}:\n${log}`)));
  });
  const base = `http://127.0.0.1:${port}`;
  for (let i = 0; i < 1200; i++) {
    const r = await fetch(base + "/health").catch(() => null);
    if (r && r.status === 200) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  const exited = new Promise((resolve) => proc.on("exit", (code, signal) => resolve({ code, signal })));
  return {
    port, base, proc, exited,
    log: () => log,
    async stop() {
      if (proc.exitCode === null) proc.kill("SIGTERM");
      return exited;
    },
  };
}

// Prompt tokens the way an independent path counts them: render with `astrai chat-template`,
// encode with `astrai tokenize` (no extra special tokens: the template holds them).
export function countChatTokens(modelDir, messages, tools) {
  const dir = tempDir("astrai-count-");
  fs.writeFileSync(path.join(dir, "m.json"), JSON.stringify(messages));
  const args = ["chat-template", "--tokenizer", modelDir, "--messages", path.join(dir, "m.json"), "--add-generation-prompt"];
  if (tools) {
    fs.writeFileSync(path.join(dir, "t.json"), JSON.stringify(tools));
    args.push("--tools", path.join(dir, "t.json"));
  }
  fs.writeFileSync(path.join(dir, "prompt.txt"), execFileSync(BIN, args));
  return countTextTokens(modelDir, path.join(dir, "prompt.txt"), true);
}

export function countTextTokens(modelDir, file, noSpecial = false) {
  const args = ["tokenize", "--tokenizer", modelDir, "--file", file, "--json"];
  if (noSpecial) args.push("--no-special");
  return JSON.parse(execFileSync(BIN, args).toString()).ids.length;
}

export async function stats(base, headers = {}) {
  return (await fetch(base + "/stats", { headers })).json();
}

export async function waitFor(fn, what, tries = 600) {
  for (let i = 0; i < tries; i++) {
    if (await fn()) return;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error("timed out waiting for " + what);
}

// Runs named async tests in order; exits non-zero if any failed.
export async function run(tests, cleanup) {
  let failed = 0;
  for (const [name, fn] of tests) {
    const t0 = Date.now();
    try {
      await fn();
      console.log(`ok   ${name} (${Date.now() - t0} ms)`);
    } catch (e) {
      failed++;
      console.log(`FAIL ${name}: ${e.stack || e}`);
    }
  }
  if (cleanup) await cleanup();
  console.log(failed ? `${failed} of ${tests.length} failed` : `all ${tests.length} passed`);
  process.exit(failed ? 1 : 0);
}
