// A real `corral serve` in front of real `corral sim` processes, and Debian's Chromium driven
// by playwright-core: what a user of the UI meets, with nothing mocked.
import { spawn } from "node:child_process";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { chromium } from "playwright-core";

const here = new URL(".", import.meta.url).pathname;
export const BIN = process.env.CORRAL_BIN || resolve(here, "../../target/debug/corral");
export const TOKEN = "ui-test-token-5be0c3f18a7d2946e1";
const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";

/** Poll `check` every 100 ms until it holds; fail after `ms` naming `what` and what `seen` reads then. Bounded, no sleeps. */
export async function until(what, check, ms = 10000, seen = async () => "") {
  const end = Date.now() + ms;
  for (;;) {
    if (await check()) return;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}; seen: ${await seen().catch((e) => String(e))}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** A child process whose output is scanned for a line; killed by `stop()`. */
export function proc(args, env = {}) {
  const child = spawn(BIN, args, { env: { ...process.env, NO_COLOR: "1", CORRAL_LOG: "info", ...env }, stdio: ["ignore", "pipe", "pipe"] });
  let seen = "";
  const waiters = [];
  const feed = (b) => {
    seen += b.toString();
    for (const w of [...waiters]) w();
  };
  child.stdout.on("data", feed);
  child.stderr.on("data", feed);
  return {
    child,
    /** The first http://host:port on a line containing `needle`. */
    url(needle, timeoutMs = 30000) {
      return new Promise((ok, fail) => {
        const timer = setTimeout(() => fail(new Error(`no line with ${needle} in: ${seen}`)), timeoutMs);
        const check = () => {
          // Complete lines only: output arrives in chunks that may end mid-URL.
          const line = seen.split("\n").slice(0, -1).find((l) => l.includes(needle) && /http:\/\/[0-9.:]+/.test(l));
          if (line) {
            clearTimeout(timer);
            waiters.splice(waiters.indexOf(check), 1);
            ok(line.match(/http:\/\/[0-9.:]+/)[0]);
          }
        };
        waiters.push(check);
        check();
      });
    },
    stop() {
      child.kill("SIGKILL");
    },
  };
}

/** Three sim processes (one per node) and `corral serve` with a fast probe; `health` adds
 * lines to the `[health]` section (say, `deep_interval_ms = 200`). */
export async function cluster({ health = "" } = {}) {
  const sims = [0, 1, 2].map(() => proc(["sim", "--port", "0", "--tps", "0", "--ttft-ms", "0"]));
  const urls = await Promise.all(sims.map((s) => s.url("simulated Ollama node on")));
  const dir = mkdtempSync(join(tmpdir(), "corral-ui-"));
  let cfg = `[[listeners]]\naddr = "127.0.0.1:0"\n\n[admin]\naddr = "127.0.0.1:0"\n\n[store]\npath = "${dir}/corral.db"\n\n[health]\ninterval_ms = 200\ntimeout_ms = 300\nfailures_to_down = 1\nsuccesses_to_up = 1\nslow_start_ms = 1\n${health ? health + "\n" : ""}\n`;
  urls.forEach((u, i) => (cfg += `[[nodes]]\nname = "gpu${i}"\nurl = "${u}"\n\n`));
  cfg += `[[categories]]\nname = "default"\naffinity = false\n`;
  const path = join(dir, "corral.toml");
  writeFileSync(path, cfg);
  const serve = proc(["serve", "--config", path], { CORRAL_ADMIN_TOKEN: TOKEN });
  const proxy = await serve.url("serving the Ollama API on");
  const admin = await serve.url("Admin API on");
  return {
    sims,
    urls,
    proxy,
    admin,
    configPath: path,
    async adminApi(method, p, body) {
      const r = await fetch(admin + p, { method, headers: { Authorization: `Bearer ${TOKEN}`, "Content-Type": "application/json" }, body: body === undefined ? undefined : typeof body === "string" ? body : JSON.stringify(body) });
      const text = await r.text();
      try {
        return JSON.parse(text);
      } catch {
        return text;
      }
    },
    async chat(model = "llama3.2") {
      const r = await fetch(proxy + "/api/chat", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ model, stream: false, messages: [{ role: "user", content: "hi" }] }) });
      await r.text();
      return r;
    },
    async received(i) {
      const r = await fetch(urls[i] + "/_sim/received");
      return (await r.json()).filter((x) => x.path === "/api/chat").length;
    },
    stop() {
      serve.stop();
      sims.forEach((s) => s.stop());
    },
  };
}

export async function browser() {
  return chromium.launch({
    executablePath: CHROMIUM,
    // Loopback only: never through a proxy the environment may name.
    args: ["--no-sandbox", "--no-proxy-server", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"],
  });
}

/** A page logged in to the UI (token in the URL fragment, as `corral serve` prints it). */
export async function open(b, c, screen = "") {
  const page = await b.newPage({ acceptDownloads: true, viewport: { width: 1400, height: 900 } });
  const log = [];
  page.on("console", (m) => log.push(`console: ${m.text()}`));
  page.on("pageerror", (e) => log.push(`page error: ${e.message}`));
  page.on("requestfailed", (r) => log.push(`request failed: ${r.url()} ${r.failure()?.errorText}`));
  await page.goto(`${c.admin}/ui/#token=${TOKEN}`);
  try {
    await page.waitForSelector("[data-node]", { timeout: 10000 });
  } catch (e) {
    throw new Error(`the UI showed no node: ${e.message}\n${log.join("\n")}\npage: ${(await page.content()).slice(0, 2000)}`);
  }
  if (screen) await page.click(`[data-screen=${screen}]`);
  return page;
}
