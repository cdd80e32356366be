// The Models screen in a real browser against `corral serve` and real sims: the node x model
// matrix, a pull with visible % onto two nodes with one cancelled (the sim's own counters say its
// download stopped), and the time-to-first-token grid, run and sorted.
// With CORRAL_SCREENSHOTS=DIR it also saves the README's screenshot of the screen.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { join } from "node:path";
import { cluster, browser, open, until } from "./harness.mjs";

const SHOTS = process.env.CORRAL_SCREENSHOTS;
let c, b;

async function sim(i, path, body) {
  const r = await fetch(c.urls[i] + path, body === undefined ? {} : { method: "POST", body: JSON.stringify(body) });
  const text = await r.text();
  return text ? JSON.parse(text) : null;
}

before(async () => {
  c = await cluster();
  b = await browser();
  // Pulls take a few seconds, so % moves and Cancel can be pressed; gpu1 is slower to a first token.
  await sim(0, "/_sim/faults", { pull_ms: 4000 });
  await sim(1, "/_sim/faults", { pull_ms: 4000, ttft_ms: 300 });
});
after(async () => {
  await b?.close();
  c?.stop();
});

test("the matrix shows each model's size, family, quantisation and where it is", async () => {
  const page = await open(b, c, "models");
  const row = "[data-testid=model-matrix] tr[data-model='llama3.2:latest']";
  await page.waitForSelector(row, { timeout: 10000 });
  const text = await page.textContent(row);
  for (const want of ["llama", "3.2B", "Q4_K_M", "GB"]) assert.ok(text.includes(want), `${want} in: ${text}`);
  for (const n of ["gpu0", "gpu1", "gpu2"]) {
    assert.match(await page.textContent(`${row} td[data-cell=${n}]`), /on disk|loaded/, `${n} has llama3.2`);
  }
  assert.match(await page.textContent(`${row} td:nth-child(6)`), /^[0-9a-f]{12}$/, "a short digest, the same build everywhere");
  await page.close();
});

test("a pull onto two nodes shows % and speed, and Cancel stops one node's download", async () => {
  const page = await open(b, c, "models");
  await page.fill("input[aria-label='model to pull']", "qwen2.5:7b");
  await page.check("form label:has-text('gpu0') input");
  await page.check("form label:has-text('gpu1') input");
  await page.click("form button.primary");
  const pct = (n) => page.textContent(`[data-progress=${n}] [data-testid=pct]`).catch(() => "");
  await until("gpu1 part way", async () => /^([1-9]|[1-8][0-9])%$/.test(await pct("gpu1")));
  assert.match(await page.textContent("[data-progress=gpu1]"), /MB \/ 4\.\d GB/, "bytes done of the total");
  await until("a speed", async () => /\/s/.test(await page.textContent("[data-progress=gpu1]")));
  await page.click("[data-progress=gpu1] [data-testid=cancel-pull]");
  await page.waitForSelector("[data-progress=gpu1][data-state=cancelled]", { timeout: 5000 });
  await until("gpu1's sim to stop pulling", async () => (await sim(1, "/_sim/stats")).pulling === 0);
  if (SHOTS) await page.screenshot({ path: join(SHOTS, "ui-models-pull.png") });
  const stats = await sim(1, "/_sim/stats");
  assert.equal(stats.pulls_cancelled, 1, "the node saw its client go away");
  await page.waitForSelector("[data-progress=gpu0][data-state=success]", { timeout: 15000 });
  assert.equal(await pct("gpu0"), "100%");
  assert.equal(await page.$("[data-progress=gpu2]"), null, "gpu2 was not ticked");
  const tags = async (i) => (await sim(i, "/api/tags")).models.map((m) => m.name);
  assert.ok((await tags(0)).includes("qwen2.5:7b"), "gpu0 has it");
  assert.ok(!(await tags(1)).includes("qwen2.5:7b"), "gpu1's pull was cancelled");
  await page.waitForSelector("tr[data-model='qwen2.5:7b'] td[data-cell=gpu0] .tag", { timeout: 5000 });
  await page.close();
});

test("the time-to-first-token grid runs per node and model, sorts by a column, re-runs a cell", async () => {
  const page = await open(b, c, "models");
  await page.waitForSelector("[data-testid=latency-grid] [data-testid=ttft-all]");
  await page.click("[data-testid=ttft-all]");
  const cell = (n, col) => `tr[data-latency-node=${n}] td[data-col='${col}']`;
  await until("every llama3.2 cell timed", async () => {
    for (const n of ["gpu0", "gpu1", "gpu2"]) if (!(await page.$(`${cell(n, "llama3.2:latest")} [data-testid=ms]`))) return false;
    return true;
  }, 20000, () => page.textContent("[data-testid=latency-grid] tbody"));
  const msOf = async (n) => {
    const t = await page.textContent(`${cell(n, "llama3.2:latest")} [data-testid=ms]`);
    return t.endsWith(" s") ? parseFloat(t) * 1000 : parseFloat(t);
  };
  assert.ok((await msOf("gpu1")) >= 300, `gpu1 waits 300 ms for its first token: ${await msOf("gpu1")}`);
  assert.match(await page.textContent(cell("gpu0", "llama3.2:latest")), /ago/, "each result says its age");
  await page.waitForSelector("tr[data-model='llama3.2:latest'] td[data-cell=gpu0] .tag.hot", { timeout: 5000 });
  const order = () => page.$$eval("[data-testid=latency-grid] tbody tr", (trs) => trs.map((t) => t.getAttribute("data-latency-node")));
  await page.click("button[data-sort='llama3.2:latest']");
  assert.equal((await order()).at(-1), "gpu1", "ascending: the slowest last");
  await page.click("button[data-sort='llama3.2:latest']");
  assert.equal((await order())[0], "gpu1", "descending: the slowest first");
  const before = (await sim(0, "/_sim/received")).filter((r) => r.path === "/api/generate").length;
  await page.click(`${cell("gpu0", "llama3.2:latest")} button[aria-label^=test]`);
  await until("gpu0's cell re-run", async () => (await sim(0, "/_sim/received")).filter((r) => r.path === "/api/generate").length === before + 1);
  if (SHOTS) await page.screenshot({ path: join(SHOTS, "ui-models.png"), fullPage: true });
  await page.close();
});

test("a down node is not offered for a pull, says why, and its ping fails with the probe's reason", async () => {
  c.sims[2].stop();
  const page = await open(b, c, "models");
  await page.waitForSelector("form label:has-text('gpu2 (down)') input:disabled", { timeout: 5000 });
  assert.match(await page.getAttribute("form label:has-text('gpu2 (down)')", "title"), /connection refused at http:\/\/127\.0\.0\.1:\d+/);
  await page.click(`button[aria-label='test ping on gpu2']`);
  await page.waitForFunction(() => document.querySelector("tr[data-latency-node=gpu2] td[data-col=ping]")?.textContent?.includes("failed"), null, { timeout: 5000 });
  assert.match(await page.textContent("tr[data-latency-node=gpu2] td[data-col=ping] .reason"), /^connection refused at http:\/\/127\.0\.0\.1:\d+$/);
  await page.close();
});
