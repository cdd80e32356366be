// Edits made in the UI belong to the config file: a rule, a node weight and a provider edited
// in the browser are in the file afterwards with its comments, survive an unrelated hand edit
// of the file (hot reload) and a restart of `corral serve`.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, writeFileSync, appendFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { proc, browser, open, until, TOKEN } from "./harness.mjs";

let b, sims, urls, dir, path;
const running = [];

async function serve() {
  const s = proc(["serve", "--config", path], { CORRAL_ADMIN_TOKEN: TOKEN });
  running.push(s);
  const proxy = await s.url("serving the Ollama API on");
  const admin = await s.url("Admin API on");
  const api = async (p) => (await fetch(admin + p, { headers: { Authorization: `Bearer ${TOKEN}` } })).json();
  return { s, proxy, admin, api };
}

before(async () => {
  b = await browser();
  sims = [0, 1].map(() => proc(["sim", "--port", "0", "--tps", "0", "--ttft-ms", "0"]));
  urls = await Promise.all(sims.map((s) => s.url("simulated Ollama node on")));
  dir = mkdtempSync(join(tmpdir(), "corral-ui-persist-"));
  path = join(dir, "corral.toml");
  let cfg = `# Our cluster. This comment must survive every UI edit.\n[[listeners]]\naddr = "127.0.0.1:0"\n\n[admin]\naddr = "127.0.0.1:0"\n\n[store]\npath = "${dir}/corral.db"\n\n[health]\ninterval_ms = 200\n\n`;
  urls.forEach((u, i) => (cfg += `# node ${i}: keep me\n[[nodes]]\nname = "gpu${i}"\nurl = "${u}"\n\n`));
  cfg += `[[categories]]\nname = "default"\npolicy = "least-connections" # for now\n`;
  writeFileSync(path, cfg);
});

after(async () => {
  await b?.close();
  running.forEach((s) => s.stop());
  sims?.forEach((s) => s.stop());
});

test("a rule, a weight and a provider edited in the UI are in the file, survive a hand edit and a restart", async () => {
  const first = await serve();
  const page = await open(b, first, "rules");
  const policy = "tr[data-category=default] select[aria-label=policy]";
  await page.waitForSelector(policy);
  // The rules read back after the apply come slowly: once "Applied" shows, no draft is left,
  // so going to another screen asks nothing (a dialog here would be dismissed, and the
  // screen would stay).
  const dialogs = [];
  page.on("dialog", (d) => {
    dialogs.push(d.message());
    d.dismiss();
  });
  await page.route("**/admin/categories", async (route) => {
    if (route.request().method() === "GET") await new Promise((r) => setTimeout(r, 1500));
    await route.continue();
  });
  await page.selectOption(policy, "p2c");
  await page.click("[data-testid=apply-rules]");
  await page.waitForSelector(".good");
  await page.click("[data-screen=nodes]");
  assert.deepEqual(dialogs, [], "nothing asked on leaving a screen whose rules were applied");
  await page.unroute("**/admin/categories");
  const weight = "tr[data-node=gpu0] input[aria-label*=weight]";
  await page.fill(weight, "5");
  await page.press(weight, "Tab");
  await until("the weight is in force", async () => (await first.api("/admin/nodes")).find((n) => n.name === "gpu0")?.weight === 5);
  await page.click("[data-screen=providers]");
  await page.fill("input[aria-label='provider name']", "openai");
  await page.fill("input[aria-label='base url']", "https://api.openai.com/v1");
  await page.fill("input[aria-label='secret name']", "openai-key");
  await page.click("form button.primary");
  await page.waitForSelector("tr[data-provider=openai]");
  await page.close();

  const text = readFileSync(path, "utf8");
  assert.match(text, /^# Our cluster\. This comment must survive every UI edit\./);
  assert.match(text, /# node 0: keep me/);
  assert.match(text, /policy = "p2c"/);
  assert.match(text, /weight = 5/);
  assert.match(text, /name = "openai"/);

  // An unrelated hand edit: once it is in force, all three are still there.
  appendFileSync(path, "# touched by hand\n[queue]\nmax_requests = 321\n");
  await until("the hand edit is reloaded", async () => (await first.api("/admin/status")).queue?.max_requests === 321);
  const check = async (api) => {
    const cats = await api("/admin/categories");
    const nodes = await api("/admin/nodes");
    const providers = await api("/admin/providers");
    assert.equal(cats[0].policy, "p2c");
    assert.equal(nodes.find((n) => n.name === "gpu0").weight, 5);
    assert.ok(providers.some((p) => p.name === "openai" && p.secret === "openai-key"));
  };
  await check(first.api);

  // A restart reads them back from the file.
  first.s.stop();
  const second = await serve();
  await check(second.api);
  assert.equal((await second.api("/admin/status")).queue.max_requests, 321, "the hand edit too");
  assert.match(readFileSync(path, "utf8"), /# touched by hand/);
});
