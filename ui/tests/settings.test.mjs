// The Settings screen and forms bound both ways, in a real browser against `corral serve` and
// real sims: a refused token leads back to the token form; settings edits land in the config
// file with its comments; client keys are created (shown once) and revoked; a refused value
// goes back to the one in force with a sentence; a Rules draft is not lost silently; Rules fit
// the desktop's minimum window. With CORRAL_SCREENSHOTS=DIR it saves the README's screenshot.
// The client-key test needs a Secret Service (scripts/test runs this file in its keyring session).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { cluster, browser, open, until, TOKEN } from "./harness.mjs";

const SHOTS = process.env.CORRAL_SCREENSHOTS;
/** The desktop window's minimum size (src-tauri/src/main.rs `min_inner_size`). */
const MIN = { width: 760, height: 520 };

let c, b;
before(async () => {
  c = await cluster();
  b = await browser();
});
after(async () => {
  await b?.close();
  c?.stop();
});

/** Wait until the broker has reloaded its file `n` times in all. */
async function reloads(n) {
  for (let i = 0; i < 100; i++) {
    if ((await c.adminApi("GET", "/admin/status")).reload.reloads >= n) return;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`the broker did not reload its config ${n} times`);
}

test("a wrong token leads back to the token form with a sentence, and the right one gets in", async () => {
  const page = await b.newPage({ viewport: { width: 1400, height: 900 } });
  await page.goto(`${c.admin}/ui/#token=wrong-token-0000000000000000000000000`);
  await page.waitForSelector("[data-testid=token-refused]", { timeout: 10000 });
  assert.equal(
    (await page.textContent("[data-testid=token-refused]")).trim(),
    "This token was not accepted — paste the one corral serve printed.",
  );
  assert.equal(await page.$("header nav"), null, "no empty dashboard behind it");
  await page.fill("input[aria-label='admin token']", TOKEN);
  await page.click("[data-testid=token-form] button[type=submit]");
  await page.waitForSelector("[data-node]", { timeout: 10000 });
  assert.equal(await page.$("[data-testid=token-refused]"), null);
  await page.close();
});

test("leaving Rules with a draft asks, and staying keeps the draft", async () => {
  const page = await open(b, c, "rules");
  const prio = "tr[data-category=default] input[aria-label=priority]";
  await page.fill(prio, "7");
  const asked = [];
  page.once("dialog", (d) => {
    asked.push(d.message());
    d.dismiss();
  });
  await page.click("[data-screen=overview]");
  assert.match(asked[0] ?? "", /not applied/, "the person is asked before the draft goes");
  assert.equal(await page.inputValue(prio), "7", "staying keeps the draft");
  page.once("dialog", (d) => d.accept());
  await page.click("[data-screen=overview]");
  await page.waitForSelector("[data-testid=connect]", { timeout: 5000 });
  assert.equal((await c.adminApi("GET", "/admin/categories"))[0].priority, 1, "a draft left behind changed nothing");
  await page.close();
});

test("the Rules table and the Settings screen fit the minimum window without sideways scrolling", async () => {
  const page = await open(b, c, "rules");
  await page.setViewportSize(MIN);
  await page.waitForSelector("[data-testid=rules]");
  const overflow = () =>
    page.evaluate(() => {
      const t = document.querySelector("[data-testid=rules]") ?? document.querySelector("main");
      return { page: document.documentElement.scrollWidth - window.innerWidth, right: t.getBoundingClientRect().right - window.innerWidth };
    });
  const rules = await overflow();
  assert.ok(rules.page <= 0 && rules.right <= 0, `Rules at ${MIN.width} px overflow by ${JSON.stringify(rules)}`);
  await page.click("[data-screen=settings]");
  await page.waitForSelector("[data-section=retry]");
  const settings = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  assert.ok(settings <= 0, `Settings at ${MIN.width} px overflow by ${settings} px`);
  await page.close();
});

test("a weight the broker refuses goes back to the one in force, with a sentence", async () => {
  const page = await open(b, c, "nodes");
  const box = "tr[data-node=gpu0] input[aria-label=weight]";
  await page.fill(box, "0");
  await page.press(box, "Tab");
  await page.waitForSelector("tr[data-node=gpu0] [data-testid=weight-msg]", { timeout: 5000 });
  const said = await page.textContent("tr[data-node=gpu0] [data-testid=weight-msg]");
  assert.match(said, /^Weight must be greater than 0\. Still 1\.$/, said);
  assert.doesNotMatch(said, /nodes\[/, "no config path");
  assert.equal(await page.inputValue(box), "1", "the field shows the weight in force");
  assert.match(await page.getAttribute(box, "class"), /field-error/);
  assert.equal((await c.adminApi("GET", "/admin/nodes")).find((n) => n.name === "gpu0").weight, 1);
  await page.fill(box, "3");
  await page.press(box, "Tab");
  // The message goes as soon as the field is typed in; the PATCH lands a moment later.
  await until("weight 3 in force", async () => (await c.adminApi("GET", "/admin/nodes")).find((n) => n.name === "gpu0").weight === 3);
  assert.equal(await page.$("tr[data-node=gpu0] [data-testid=weight-msg]"), null, "no message once accepted");
  await page.close();
});

test("Settings edits a retry and a queue value; both are in the config file with its comments", async () => {
  const before = (await c.adminApi("GET", "/admin/status")).reload.reloads;
  const hand = `# My cluster, written by hand.\n${readFileSync(c.configPath, "utf8")}\n[retry]\n# two tries are plenty here\nmax_attempts = 3\n`;
  writeFileSync(c.configPath, hand);
  await reloads(before + 1);
  const page = await open(b, c, "settings");
  await page.waitForSelector("[data-section=retry]");
  await page.fill("[data-section=retry] input[data-key=max_attempts]", "2");
  await page.click("[data-testid=save-retry]");
  await page.waitForSelector("[data-testid=notice-retry]");
  assert.match(await page.textContent("[data-testid=notice-retry]"), new RegExp(`Saved to ${c.configPath.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")}\\. In force now\\.`));
  await page.fill("[data-section=queue] input[data-key=max_requests]", "500");
  await page.click("[data-testid=save-queue]");
  await page.waitForSelector("[data-testid=notice-queue]");
  const file = readFileSync(c.configPath, "utf8");
  assert.ok(file.startsWith("# My cluster, written by hand.\n"), file);
  assert.match(file, /# two tries are plenty here\nmax_attempts = 2\n/, "the comment stays above the edited key");
  assert.match(file, /\[queue\]\nmax_requests = 500\n/, file);
  const s = await c.adminApi("GET", "/admin/settings");
  assert.equal(s.retry.max_attempts, 2, "in force now");
  assert.equal(s.queue.max_requests, 500);
  if (SHOTS) {
    await page.evaluate(() => scrollTo(0, 0));
    await page.screenshot({ path: join(SHOTS, "settings.png"), fullPage: true });
  }
  await page.close();
});

test("saving one group keeps what was typed, not saved, in another", async () => {
  const page = await open(b, c, "settings");
  const queue = "[data-section=queue] input[data-key=max_requests]";
  await page.waitForSelector(queue);
  const inForce = (await c.adminApi("GET", "/admin/settings")).queue.max_requests;
  await page.fill(queue, String(inForce + 123));
  await page.fill("[data-section=retry] input[data-key=max_attempts]", "3");
  await page.click("[data-testid=save-retry]");
  await page.waitForSelector("[data-testid=notice-retry]");
  assert.equal((await c.adminApi("GET", "/admin/settings")).retry.max_attempts, 3);
  assert.equal(await page.inputValue(queue), String(inForce + 123), "the unsaved edit is still there");
  assert.equal((await c.adminApi("GET", "/admin/settings")).queue.max_requests, inForce, "and still not saved");
  await page.close();
});

test("a retry value the broker refuses goes back to the one in force, with a sentence", async () => {
  const page = await open(b, c, "settings");
  const cap = "[data-section=retry] input[data-key=backoff_cap_ms]";
  await page.waitForSelector(cap);
  await page.fill(cap, "1");
  await page.click("[data-testid=save-retry]");
  await page.waitForSelector("[data-section=retry] .field-msg");
  const said = await page.textContent("[data-section=retry] .field-msg");
  assert.equal(said, "The longest backoff must not be smaller than the first backoff. Back to 1000 ms, the value in force.");
  assert.equal(await page.inputValue(cap), "1000");
  assert.equal((await c.adminApi("GET", "/admin/settings")).retry.backoff_cap_ms, 1000);
  await page.close();
});

test("a LAN address warns who can reach it, and saving says a restart is needed", async () => {
  const page = await open(b, c, "settings");
  const addr = "[data-listener='0'] input[aria-label='proxy address']";
  await page.waitForSelector(addr);
  assert.equal(await page.$("[data-testid=lan-warning]"), null, "loopback: no warning");
  await page.fill(addr, "0.0.0.0:0");
  const warning = await page.textContent("[data-testid=lan-warning]");
  assert.match(warning, /reachable from other machines/);
  assert.match(warning, /Turn on client keys/);
  await page.click("[data-testid=save-listeners]");
  await page.waitForSelector("[data-testid=listeners-notice]");
  assert.match(await page.textContent("[data-testid=listeners-notice]"), /Restart corral serve/);
  assert.match(readFileSync(c.configPath, "utf8"), /addr = "0\.0\.0\.0:0"/);
  assert.equal((await fetch(`${c.proxy}/api/version`)).status, 200, "the bound listener keeps serving until the restart");
  await page.fill(addr, "not an address");
  await page.click("[data-testid=save-listeners]");
  await page.waitForSelector("[data-listener='0'] .field-msg");
  assert.match(await page.textContent("[data-listener='0'] .field-msg"), /^The address/);
  assert.equal(await page.inputValue(addr), "0.0.0.0:0", "back to the saved address");
  await page.close();
});

test("a client key is created (shown once) and revoked", { skip: process.env.DBUS_SESSION_BUS_ADDRESS ? false : "needs a Secret Service (scripts/test runs it in its keyring session)" }, async () => {
  const page = await open(b, c, "settings");
  await page.waitForSelector("[data-testid=client-keys]");
  await page.fill("input[aria-label='new key name']", "laptop-anna");
  await page.click("[data-testid=create-key]");
  await page.waitForSelector("[data-testid=new-key-value]", { timeout: 10000 });
  const key = await page.textContent("[data-testid=new-key-value]");
  assert.match(key, /^ck-[0-9a-f]{64}$/);
  assert.match(await page.textContent("[data-testid=new-key]"), /shown only this once/);
  assert.match(readFileSync(c.configPath, "utf8"), /api_keys = \["laptop-anna"\]/, "the listener asks for it from the next start");
  await page.waitForSelector("tr[data-key=laptop-anna]");
  assert.match(await page.textContent("tr[data-key=laptop-anna]"), /yes/);
  const keys = (await c.adminApi("GET", "/admin/settings")).client_keys.keys;
  assert.ok(!JSON.stringify(keys).includes(key), "the value is never read back");
  page.once("dialog", (d) => d.accept());
  await page.click("tr[data-key=laptop-anna] button.danger");
  await page.waitForFunction(() => document.querySelector("tr[data-key=laptop-anna]")?.textContent?.includes("revoked"), null, { timeout: 5000 });
  assert.equal(await page.$("[data-testid=new-key-value]"), null, "the key is not shown again");
  const after = (await c.adminApi("GET", "/admin/settings")).client_keys.keys.find((k) => k.name === "laptop-anna");
  assert.equal(after.stored, false, "the value left the keyring");
  await page.close();
});
