// The Requests screen in a real browser against `corral serve` and real sims: totals per model
// and per node, honest paging ("showing the newest 100 of 108", Load more), search by request
// id, and a row's detail with every attempt. With CORRAL_SCREENSHOTS=DIR it also saves the
// README's screenshot of an open request (ui-requests-detail.png).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { join } from "node:path";
import { cluster, browser, open } from "./harness.mjs";

const SHOTS = process.env.CORRAL_SCREENSHOTS;

let c, b;
/** The request that failed over (its Corral id), and the one no node has the model for. */
let failedOver, missing;

/** A sim's fault control: `script` answers chats with these statuses first; `{}` clears it. */
async function faults(i, body) {
  const r = await fetch(c.urls[i] + "/_sim/faults", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
  assert.ok(r.ok, `sim ${i} takes faults: ${r.status}`);
}

before(async () => {
  c = await cluster();
  b = await browser();
  // More than a page of answered chats, fifteen at a time.
  for (let i = 0; i < 105; i += 15) {
    const batch = await Promise.all(Array.from({ length: 15 }, () => c.chat()));
    batch.forEach((r) => assert.equal(r.status, 200));
  }
  // Two of three nodes answer 500: a chat that meets one first fails over.
  await faults(0, { script: [{ status: 500, times: 1000000 }] });
  await faults(1, { script: [{ status: 500, times: 1000000 }] });
  for (let i = 0; i < 10 && !failedOver; i++) {
    const r = await c.chat();
    if (Number(r.headers.get("x-corral-attempts") ?? 1) >= 2) failedOver = r.headers.get("x-corral-request-id");
  }
  assert.ok(failedOver, "one of ten chats met a failing node first");
  await faults(0, {});
  await faults(1, {});
  const r = await c.chat("nope-model:1b");
  assert.equal(r.status, 404);
  missing = r.headers.get("x-corral-request-id");
  // Until the store's writer has every row, ended.
  for (let i = 0; i < 100; i++) {
    const page = await c.adminApi("GET", "/admin/requests?limit=1&status=running");
    const all = await c.adminApi("GET", "/admin/requests?limit=1");
    if (page.total === 0 && all.requests[0]?.id === missing) break;
    await new Promise((ok) => setTimeout(ok, 50));
  }
});
after(async () => {
  await b?.close();
  c?.stop();
});

test("the list says how many match and loads the rest on request", async () => {
  const { total } = await c.adminApi("GET", "/admin/requests?since=15m&limit=1");
  assert.ok(total > 100, `more than a page recorded: ${total}`);
  const page = await open(b, c, "requests");
  const counted = page.locator("[data-testid=requests-count]");
  await counted.filter({ hasText: `showing the newest 100 of ${total}` }).waitFor({ timeout: 10000 });
  assert.equal(await page.locator("[data-testid=requests] tbody tr[data-request]").count(), 100);
  await page.click("[data-testid=load-more]");
  await counted.filter({ hasText: `showing all ${total}` }).waitFor({ timeout: 10000 });
  assert.equal(await page.locator("[data-testid=requests] tbody tr[data-request]").count(), total, "every row, none twice");
  assert.equal(await page.locator("[data-testid=load-more]").count(), 0, "nothing more to load");
  await page.close();
});

test("totals per model and per node agree with the summary the API computes", async () => {
  const page = await open(b, c, "requests");
  const byModel = await c.adminApi("GET", "/admin/requests/summary?range=1h&by=model");
  const llama = byModel.groups.find((g) => g.key === "llama3.2");
  assert.ok(llama && llama.requests > 100, JSON.stringify(byModel));
  const row = page.locator("[data-testid=requests-summary] tr[data-group='llama3.2']");
  await row.filter({ hasText: llama.requests.toLocaleString("en-US") }).waitFor({ timeout: 10000 });
  await page.selectOption("[data-testid=requests-summary] select[aria-label='group by']", "node");
  await page.waitForSelector("[data-testid=requests-summary] tr[data-group=gpu2]", { timeout: 10000 });
  const byNode = await c.adminApi("GET", "/admin/requests/summary?range=1h&by=node");
  const served = byNode.groups.filter((g) => g.key).reduce((n, g) => n + g.requests, 0);
  assert.equal(served + (byNode.groups.find((g) => g.key === null)?.requests ?? 0), byNode.all.requests, "the groups add up");
  const refused = page.locator("[data-testid=requests-summary] tr[data-group='']");
  assert.match(await refused.textContent(), /no node/, "the request no node answered has its own line");
  await page.click("[data-testid=requests-summary] [data-range='5m']");
  await page.waitForSelector("[data-testid=requests-summary] h3:has-text('last 5m')");
  await page.close();
});

test("a request found by its id opens with every attempt; Esc and Close shut it", async () => {
  const page = await open(b, c, "requests");
  // Ids are UUIDv7: they begin with their millisecond, then a counter, so a short start names
  // every request of that minute. The start a person copies is the id less its random tail.
  const start = failedOver.slice(0, 30);
  await page.fill("[data-testid=request-search]", start);
  const rows = page.locator("[data-testid=requests] tbody tr[data-request]");
  await page.locator(`tr[data-request='${failedOver}']`).waitFor({ timeout: 10000 });
  await page.waitForFunction(() => document.querySelectorAll("[data-testid=requests] tbody tr[data-request]").length === 1, null, { timeout: 10000 });
  assert.equal(await rows.count(), 1, "only the request with that id");

  await page.click(`tr[data-request='${failedOver}'] td:nth-child(3)`);
  const dialog = page.locator("dialog[data-testid=request-detail]");
  await dialog.waitFor({ state: "visible" });
  assert.equal(await dialog.locator("[data-testid=detail-id]").textContent(), failedOver);
  const attempts = dialog.locator("[data-testid=attempts] tbody tr");
  await attempts.first().waitFor({ timeout: 10000 });
  const n = await attempts.count();
  assert.ok(n >= 2, `the failed attempt and what came after: ${n}`);
  const first = await attempts.nth(0).textContent();
  assert.match(first, /gpu[01]/, "the first went to a failing node");
  assert.doesNotMatch(await attempts.nth(0).locator("td:nth-child(3)").textContent(), /^ok$/);
  assert.match(first, /500/, `it says what the node answered: ${first}`);
  assert.match(await dialog.textContent(), /queue wait/);
  if (SHOTS) await page.screenshot({ path: join(SHOTS, "ui-requests-detail.png") });

  // At the desktop window's smallest size the dialog still fits across.
  await page.setViewportSize({ width: 760, height: 520 });
  const box = await dialog.boundingBox();
  assert.ok(box && box.x >= 0 && box.x + box.width <= 760, `the dialog fits: ${JSON.stringify(box)}`);
  await page.keyboard.press("Escape");
  await dialog.waitFor({ state: "hidden" });

  await page.click(`tr[data-request='${failedOver}'] button.link`);
  await dialog.waitFor({ state: "visible" });
  await page.click("[data-testid=detail-close]");
  await dialog.waitFor({ state: "hidden" });

  // The request no node could take: found by its whole id, not sent anywhere.
  await page.fill("[data-testid=request-search]", missing);
  await page.locator(`tr[data-request='${missing}']`).click({ timeout: 10000 });
  await dialog.locator("[data-testid=no-attempts]").waitFor({ timeout: 10000 });
  assert.match(await dialog.locator("[data-testid=detail-status]").textContent(), /client_error · HTTP 404 · model_not_found/);
  await page.keyboard.press("Escape");
  await page.fill("[data-testid=request-search]", "no-such-request");
  await page.waitForSelector("[data-testid=requests] td:has-text('No request id starts with')", { timeout: 10000 });
  assert.match(await page.textContent("[data-testid=requests-count]"), /no request matches/);
  await page.close();
});
