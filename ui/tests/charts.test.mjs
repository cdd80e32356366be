// The Overview's live charts in a real browser against `corral serve` and real sims: an empty
// state before traffic, lines after it, values under the pointer, node toggles, range choice,
// and text a person can read at 1400 px. With CORRAL_SCREENSHOTS=DIR it saves the README's
// screenshot of the charts.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { proc, browser, open, TOKEN } from "./harness.mjs";

const SHOTS = process.env.CORRAL_SCREENSHOTS || "";
const LINE_CHARTS = ["latency", "ttfb", "throughput", "outcomes", "queue"];

/** Three sims that take some time per token (so tokens/s is a real rate) behind `corral serve`. */
async function cluster() {
  const sims = [0, 1, 2].map(() => proc(["sim", "--port", "0", "--tps", "400", "--ttft-ms", "15"]));
  const urls = await Promise.all(sims.map((s) => s.url("simulated Ollama node on")));
  const dir = mkdtempSync(join(tmpdir(), "corral-charts-"));
  let cfg = `[[listeners]]\naddr = "127.0.0.1:0"\n\n[admin]\naddr = "127.0.0.1:0"\n\n[store]\npath = "${dir}/corral.db"\n\n[health]\ninterval_ms = 200\ntimeout_ms = 300\nfailures_to_down = 1\nsuccesses_to_up = 1\nslow_start_ms = 1\n\n`;
  urls.forEach((u, i) => (cfg += `[[nodes]]\nname = "gpu${i}"\nurl = "${u}"\n\n`));
  cfg += `[[categories]]\nname = "default"\naffinity = false\npolicy = "round-robin"\n`;
  const path = join(dir, "corral.toml");
  writeFileSync(path, cfg);
  const serve = proc(["serve", "--config", path], { CORRAL_ADMIN_TOKEN: TOKEN });
  const proxy = await serve.url("serving the Ollama API on");
  const admin = await serve.url("Admin API on");
  return {
    admin,
    async chat() {
      const r = await fetch(proxy + "/api/chat", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ model: "llama3.2", stream: false, messages: [{ role: "user", content: "hi" }] }) });
      await r.text();
      return r.status;
    },
    stop() {
      serve.stop();
      sims.forEach((s) => s.stop());
    },
  };
}

let c, b, page;
before(async () => {
  c = await cluster();
  b = await browser();
  page = await open(b, c);
});
after(async () => {
  await page?.close();
  await b?.close();
  c?.stop();
});

/** Points in a path's `d` ("M x,y L x,y ..."). */
const points = (d) => (d.match(/[ML]/g) ?? []).length;

/** The most points any line of `chart` has. */
async function longest(chart) {
  return page.$$eval(`[data-chart=${chart}] path.line, [data-chart=${chart}] path.band`, (ps) => Math.max(0, ...ps.map((p) => (p.getAttribute("d").match(/[ML]/g) ?? []).length)));
}

test("before any traffic, each request chart says there were none", async () => {
  await page.waitForSelector("[data-testid=charts][data-range='15m']", { timeout: 10000 });
  for (const chart of LINE_CHARTS) {
    const text = await page.textContent(`[data-chart=${chart}] [data-testid=chart-empty]`);
    assert.equal(text, "No requests in the last 15 min", `${chart} shows the empty state`);
  }
  // Health needs no traffic: a line per node in its current state.
  await page.waitForFunction(() => document.querySelectorAll("[data-chart=health] path.band").length >= 3, null, { timeout: 5000 });
  const legend = await page.$$eval("[data-chart=health] [data-legend]", (es) => es.map((e) => e.textContent.trim()));
  assert.deepEqual(legend, ["healthy", "recovering", "down", "draining", "disabled", "unknown"], "every state colour is named");
});

test("switching the range fetches that range's numbers", async () => {
  const asked = page.waitForRequest((r) => r.url().includes("/admin/charts/series?range=5m"), { timeout: 5000 });
  await page.click("[data-testid=charts] button[data-range='5m']");
  await asked;
  await page.waitForSelector("[data-testid=charts][data-range='5m']", { timeout: 5000 });
  assert.equal(await page.getAttribute("button[data-range='5m']", "aria-pressed"), "true");
  assert.match(await page.textContent("[data-chart=latency] [data-testid=chart-empty]"), /last 5 min/);
  // And it keeps polling, every 2 s at most.
  const t0 = Date.now();
  await page.waitForRequest((r) => r.url().includes("range=5m"), { timeout: 3000 });
  assert.ok(Date.now() - t0 <= 2500, "refreshed within 2 s");
});

test("after traffic over a few buckets, every chart draws a line", async () => {
  // 5 s buckets: 3 requests a second for 11 s spans at least two of them.
  for (let i = 0; i < 11; i++) {
    const codes = await Promise.all([c.chat(), c.chat(), c.chat()]);
    assert.deepEqual(codes, [200, 200, 200]);
    await new Promise((r) => setTimeout(r, 1000));
  }
  for (const chart of [...LINE_CHARTS, "health"]) {
    await page.waitForFunction(
      (chart) => [...document.querySelectorAll(`[data-chart=${chart}] path.line, [data-chart=${chart}] path.band`)].some((p) => (p.getAttribute("d").match(/[ML]/g) ?? []).length > 1),
      chart,
      { timeout: 6000 },
    );
    assert.ok((await longest(chart)) > 1, `${chart} has a connected line`);
    assert.equal(await page.$(`[data-chart=${chart}] [data-testid=chart-empty]`), null, `${chart} no longer says empty`);
  }
  const tokens = await page.textContent(".card[data-node=gpu0] dd[title^='output tokens']");
  assert.match(tokens, /^\d+(\.\d)?$/, `the card shows a rate: ${tokens}`);
});

test("chart text is at least 12 px at a 1400 px window", async () => {
  assert.equal(page.viewportSize().width, 1400);
  const sizes = await page.$$eval("[data-testid=charts] svg text, [data-testid=charts] .legend .entry, [data-testid=charts] figcaption", (es) => es.map((e) => parseFloat(getComputedStyle(e).fontSize)));
  assert.ok(sizes.length > 20, `found the chart text (${sizes.length})`);
  assert.ok(Math.min(...sizes) >= 12, `smallest chart text is ${Math.min(...sizes)} px`);
  // Drawn at the size shown, never scaled down.
  const scale = await page.$eval("[data-chart=latency] svg", (s) => s.getBoundingClientRect().width / s.viewBox.baseVal.width);
  assert.ok(Math.abs(scale - 1) < 0.02, `the SVG is drawn 1:1 (${scale})`);
});

test("hovering a line shows the time and each series' value", async () => {
  const svg = await page.$("[data-chart=latency] svg");
  // In the viewport first: a pointer moved to coordinates below the fold hovers nothing.
  await svg.scrollIntoViewIfNeeded();
  const box = await svg.boundingBox();
  // The last point of the cluster line: a bucket that has data.
  const d = await page.$$eval("[data-chart=latency] path.line[data-series=cluster]", (ps) => ps.map((p) => p.getAttribute("d")).pop());
  const [x, y] = d.trim().split(/[ML ]+/).filter(Boolean).pop().split(",").map(Number);
  // From outside the chart, in steps, so the chart sees the pointer enter and move.
  await page.mouse.move(box.x - 5, box.y + y);
  await page.mouse.move(box.x + x, box.y + y, { steps: 5 });
  const tip = await page.waitForSelector("[data-chart=latency] [data-testid=chart-tooltip]", { timeout: 3000 });
  const text = await tip.textContent();
  assert.match(text, /\d\d:\d\d:\d\d–\d\d:\d\d:\d\d/, `the bucket's time: ${text}`);
  assert.match(text, /all nodes p50\s*\d+ ms/, `the cluster's p50: ${text}`);
  assert.match(text, /gpu0 p95/, text);
  if (SHOTS) await page.screenshot({ path: join(SHOTS, "overview-charts.png"), fullPage: true });
  await page.mouse.move(5, 5);
  await page.waitForSelector("[data-chart=latency] [data-testid=chart-tooltip]", { state: "detached", timeout: 3000 });
});

test("a node's legend entry hides and shows its lines in every chart", async () => {
  const count = () => page.$$eval("[data-testid=charts] [data-series=gpu1]", (es) => es.length);
  assert.ok((await count()) > 3, "gpu1 has lines in several charts");
  await page.click("[data-chart=latency] button[data-legend=gpu1]");
  await page.waitForFunction(() => document.querySelectorAll("[data-testid=charts] [data-series=gpu1]").length === 0, null, { timeout: 3000 });
  assert.equal(await page.getAttribute("[data-chart=ttfb] button[data-legend=gpu1]", "aria-pressed"), "false", "every chart's legend says it is hidden");
  assert.ok((await page.$$("[data-testid=charts] [data-series=gpu0]")).length > 0, "other nodes stay");
  await page.click("[data-chart=ttfb] button[data-legend=gpu1]");
  await page.waitForFunction(() => document.querySelectorAll("[data-testid=charts] [data-series=gpu1]").length > 3, null, { timeout: 3000 });
});

test("the 1 h range shows the same traffic in 1 min buckets", async () => {
  const asked = page.waitForRequest((r) => r.url().includes("range=1h"), { timeout: 5000 });
  await page.click("[data-testid=charts] button[data-range='1h']");
  await asked;
  await page.waitForSelector("[data-testid=charts][data-range='1h']", { timeout: 5000 });
  assert.match(await page.textContent("[data-testid=charts] h3"), /Last 1 h/);
  assert.match(await page.textContent("[data-chart=outcomes] figcaption"), /per 60 s/);
});
