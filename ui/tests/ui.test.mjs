// Every screen of the UI in a real browser against `corral serve` and real sims.
import { test, describe, before, after } from "node:test";
import assert from "node:assert/strict";
import { readFileSync, writeFileSync, mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { cluster, browser, open, proc, TOKEN } from "./harness.mjs";

/** With CORRAL_SCREENSHOTS=DIR, the README's screenshots of these screens are saved there. */
const SHOTS = process.env.CORRAL_SCREENSHOTS;

let c, b;
before(async () => {
  c = await cluster();
  b = await browser();
});
after(async () => {
  await b?.close();
  c?.stop();
});

test("the overview shows a card per node, and a killed node's card turns red", async () => {
  const page = await open(b, c);
  for (const n of ["gpu0", "gpu1", "gpu2"]) {
    await page.waitForSelector(`.card[data-node=${n}][data-state=healthy]`, { timeout: 10000 });
  }
  c.sims[1].stop();
  // The probe runs every 200 ms; one failure takes it down; the event stream refreshes the page.
  await page.waitForSelector(`.card[data-node=gpu1][data-state=unhealthy]`, { timeout: 5000 });
  const cls = await page.getAttribute(".card[data-node=gpu1]", "class");
  assert.match(cls, /\bbad\b/, "the down card is drawn in the alarm colour");
  assert.match(await page.textContent(".card[data-node=gpu1] .state"), /✖ down/);
  assert.match(await page.textContent("[data-testid=summary]"), /2\/3 up · 1 down/);
  await page.close();
});

test("a node card shows the speed it learned per model once it has answered", async () => {
  const r = await c.chat("llama3.2");
  const node = r.headers.get("x-corral-node");
  assert.ok(node, "answered by a node");
  const page = await open(b, c);
  const line = `.card[data-node=${node}] [data-speed='llama3.2:latest']`;
  await page.waitForSelector(line, { timeout: 10000 });
  assert.match(await page.textContent(line), /llama3\.2:latest \d+ tok\/s · prefill \d+\/s/);
  await page.close();
});

test("the overview says where to point clients, as bound", async () => {
  const page = await open(b, c);
  await page.waitForSelector("[data-testid=connect]", { timeout: 10000 });
  const text = await page.textContent("[data-testid=connect]");
  assert.ok(text.includes(c.proxy), `the proxy URL ${c.proxy} is shown: ${text}`);
  assert.ok(text.includes(`${c.proxy}/v1`) && text.includes(`OLLAMA_HOST=${c.proxy}`), text);
  assert.equal(await page.$("[data-testid=demo]"), null, "serve with real config is not marked demo");
  const saved = await page.textContent("[data-testid=config-file]");
  assert.ok(saved.includes(`saved to ${c.configPath}`), `says where edits go: ${saved}`);
  await page.close();
});

test("the connect panel's snippets name this proxy and a model it serves, and Copy puts the shown one on the clipboard", async () => {
  const page = await open(b, c);
  await page.context().grantPermissions(["clipboard-read", "clipboard-write"], { origin: c.admin });
  await page.waitForSelector("[data-testid=snippet]", { timeout: 10000 });
  const expect = { python: ["from ollama import Client", `Client(host="${c.proxy}")`], openai: ["from openai import OpenAI", `base_url="${c.proxy}/v1"`], curl: [`curl ${c.proxy}/api/chat`, '"stream": false'] };
  for (const [tab, parts] of Object.entries(expect)) {
    await page.click(`[data-snippet=${tab}]`);
    const shown = await page.textContent("[data-testid=snippet]");
    for (const p of parts) assert.ok(shown.includes(p), `${tab} snippet has ${p}: ${shown}`);
    assert.match(shown, /model"?[=:] ?"llama3\.2"/, `${tab} asks a model the nodes serve: ${shown}`);
    await page.click("[data-testid=copy-snippet]");
    assert.equal(await page.evaluate(() => navigator.clipboard.readText()), shown, `Copy took the ${tab} snippet as shown`);
  }
  await page.close();
});

test("corral demo: the header says demo cluster (simulated nodes), and Save as my config writes a file edits then go to", async () => {
  const home = mkdtempSync(join(tmpdir(), "corral-ui-demo-"));
  const demo = proc(["demo", "--port", "0", "--admin-port", "0", "--db", join(home, "demo.db")], { CORRAL_ADMIN_TOKEN: TOKEN, XDG_CONFIG_HOME: home, XDG_DATA_HOME: home });
  try {
    const admin = await demo.url("Admin API:");
    const page = await open(b, { admin });
    await page.waitForSelector("[data-testid=demo]", { timeout: 10000 });
    assert.equal((await page.textContent("[data-testid=demo]")).trim(), "demo cluster (simulated nodes)");
    const before = await page.textContent("[data-testid=config-file]");
    assert.match(before, /last until the broker stops/, before);
    await page.click("[data-testid=save-config]");
    const saved = join(home, "corral", "corral.toml");
    await page.waitForFunction((p) => document.querySelector("[data-testid=config-file]")?.textContent?.includes(`saved to ${p}`), saved, { timeout: 5000 });
    assert.match(readFileSync(saved, "utf8"), /\[\[nodes\]\]/, "the file holds the running nodes");
    await page.close();
  } finally {
    demo.stop();
  }
});

test("disabling a node in the UI stops its traffic", async () => {
  const page = await open(b, c, "nodes");
  await page.uncheck("tr[data-node=gpu0] input[aria-label=enabled]");
  await page.waitForSelector(".card, tr[data-node=gpu0]");
  await page.waitForFunction(() => document.querySelector("tr[data-node=gpu0] td.state")?.textContent?.includes("disabled"), null, { timeout: 5000 });
  const before = await c.received(0);
  for (let i = 0; i < 12; i++) assert.equal((await c.chat()).status, 200);
  assert.equal(await c.received(0), before, "gpu0 got nothing while disabled");
  await page.check("tr[data-node=gpu0] input[aria-label=enabled]");
  await page.waitForFunction(() => !document.querySelector("tr[data-node=gpu0] td.state")?.textContent?.includes("disabled"), null, { timeout: 5000 });
  await page.close();
});

test("test latency colours each node's result", async () => {
  const page = await open(b, c, "nodes");
  await page.click("[data-testid=test-all]");
  await page.waitForFunction(() => [...document.querySelectorAll("[data-testid=latency]")].every((td) => td.textContent && td.textContent !== "…"), null, { timeout: 5000 });
  assert.match(await page.getAttribute("tr[data-node=gpu0] [data-testid=latency]", "class"), /\bok\b/);
  assert.match(await page.textContent("tr[data-node=gpu1] [data-testid=latency]"), /failed/, "gpu1 is still down");
  if (SHOTS) await page.screenshot({ path: join(SHOTS, "ui-nodes.png"), fullPage: true });
  await page.close();
});

test("a drill from the Nodes screen shows what clients saw, a table per category", async () => {
  const page = await open(b, c, "nodes");
  await page.click("tr[data-node=gpu0] [data-testid=drill]");
  await page.waitForSelector("[data-testid=drill-report]", { timeout: 20000 });
  assert.match(await page.textContent("[data-testid=drill-report] h3"), /gpu0 taken out \(drain\)/);
  const servedBy = await page.$$eval("[data-testid=drill-report] table[data-category=default] tbody tr td:nth-child(3)", (tds) => tds.map((td) => td.textContent));
  assert.equal(servedBy.length, 3, "three requests in the default category");
  assert.ok(servedBy.every((n) => n && n !== "gpu0" && n !== "–"), `the other nodes served all of them: ${servedBy}`);
  assert.match(await page.textContent("[data-testid=drill-summary]"), /^3\/3 served/);
  const nodes = await c.adminApi("GET", "/admin/nodes");
  assert.equal(nodes.find((n) => n.name === "gpu0").admin, "active", "the node is put back");
  await page.close();
});

test("a rule edit changes routing, and a bad one points at the field and changes nothing", async () => {
  const page = await open(b, c, "rules");
  const row = "tr[data-category=default]";
  await page.selectOption(`${row} select[aria-label=policy]`, "priority");
  await page.fill(`${row} input[aria-label=order]`, "gpu2, gpu0");
  await page.click("[data-testid=apply-rules]");
  await page.waitForSelector(".good");
  const before = await c.received(2);
  for (let i = 0; i < 6; i++) await c.chat();
  assert.equal(await c.received(2), before + 6, "priority sends everything to gpu2 first");

  await page.fill(`${row} input[aria-label=order]`, "gpu9");
  await page.click("[data-testid=apply-rules]");
  await page.waitForSelector(`${row} .field-msg`);
  assert.match(await page.textContent(`${row} .field-msg`), /no node named "gpu9"/);
  const cats = await c.adminApi("GET", "/admin/categories");
  assert.deepEqual(cats[0].order, ["gpu2", "gpu0"], "the running rules are untouched");
  await page.close();
});

test("failover rules are edited in place and rules the editor does not show survive an apply", async () => {
  const cats = await c.adminApi("GET", "/admin/categories");
  cats[0].redact_max_bytes = 4096;
  await c.adminApi("PUT", "/admin/categories", cats);
  const page = await open(b, c, "rules");
  const row = "tr[data-category=default]";
  await page.fill(`${row} input[aria-label="first token timeout"]`, "5000");
  await page.check(`${row} input[aria-label="continue on cut"]`);
  await page.click("[data-testid=apply-rules]");
  await page.waitForSelector(".good");
  const after = (await c.adminApi("GET", "/admin/categories"))[0];
  assert.equal(after.first_token_timeout_ms, 5000);
  assert.equal(after.continue_on_cut, true);
  assert.equal(after.stream_idle_timeout_ms, 30000);
  assert.equal(after.redact_max_bytes, 4096, "a rule the editor does not show is kept");
  await page.fill(`${row} input[aria-label="stream idle timeout"]`, "5");
  await page.click("[data-testid=apply-rules]");
  await page.waitForSelector(`${row} .field-msg`);
  assert.match(await page.textContent(`${row} .field-msg`), /at least 100/);
  await page.close();
});

test("an edit made while an apply reads the rules back is kept, not undone", async () => {
  const page = await open(b, c, "rules");
  const row = "tr[data-category=default]";
  // A value no earlier test set, so the draft differs from the rules in force.
  await page.fill(`${row} input[aria-label="first token timeout"]`, "6000");
  // Hold the read-back that follows the apply until the next edit is typed.
  let release;
  const held = new Promise((r) => (release = r));
  await page.route("**/admin/categories", async (route) => {
    if (route.request().method() === "GET") await held;
    await route.continue();
  });
  const asked = page.waitForRequest((r) => r.url().endsWith("/admin/categories") && r.method() === "GET");
  await page.click("[data-testid=apply-rules]");
  await asked;
  await page.waitForSelector(".good");
  await page.fill(`${row} input[aria-label="stream idle timeout"]`, "4500");
  // The read-back decides on the draft before it asks for the providers.
  const readBack = page.waitForResponse((r) => r.url().endsWith("/admin/providers") && r.request().method() === "GET");
  release();
  await readBack;
  assert.equal(await page.inputValue(`${row} input[aria-label="stream idle timeout"]`), "4500");
  assert.equal(await page.isEnabled("[data-testid=apply-rules]"), true, "the kept edit is a draft to apply");
  assert.match(await page.textContent("[data-testid=rules-draft]"), /Draft: not applied yet/);
  assert.equal((await c.adminApi("GET", "/admin/categories"))[0].stream_idle_timeout_ms, 30000, "not applied by itself");
  await page.unroute("**/admin/categories");
  await page.close();
});

test("export then import round-trips, with a preview of what changes", async () => {
  const page = await open(b, c, "share");
  const [download] = await Promise.all([page.waitForEvent("download"), page.click("[data-testid=export]")]);
  const exported = readFileSync(await download.path(), "utf8");
  assert.match(exported, /name = "gpu0"/);
  // Someone removes a node; importing the shared file (merge) brings it back.
  assert.equal(await c.adminApi("DELETE", "/admin/nodes/gpu1"), "");
  const dir = mkdtempSync(join(tmpdir(), "corral-ui-share-"));
  const file = join(dir, "team.toml");
  writeFileSync(file, exported);
  await page.setInputFiles("[data-testid=import-file]", file);
  await page.waitForSelector("[data-testid=import-preview]");
  assert.match(await page.textContent("[data-testid=import-preview]"), /\+ node gpu1 added/);
  // A node the file adds would receive prompts: a trust change, applied only when ticked.
  assert.match(await page.textContent("[data-testid=trust-changes]"), /new node gpu1 would receive requests/);
  await page.check("[data-trust-id='node:gpu1:added']");
  await page.click("[data-testid=apply-import]");
  await page.waitForSelector(".good");
  const nodes = await c.adminApi("GET", "/admin/nodes");
  assert.deepEqual(nodes.map((n) => n.name).sort(), ["gpu0", "gpu1", "gpu2"]);
  await page.close();
});

test("a pasted import previews field by field, section keys in a merge too, and a re-pointed URL as a trust change", async () => {
  const page = await open(b, c, "share");
  const exported = await c.adminApi("GET", "/admin/config/export");
  assert.doesNotMatch(exported, /\[admin\]|\[\[listeners\]\]|^addr =/m, "machine-local keys are not shared");
  await page.click("text=…or paste a config");
  await page.fill("[data-testid=import-paste]", `[[nodes]]\nname = "gpu0"\nurl = "http://10.9.9.9:11434"\n\n[retry]\nbackoff_base_ms = 7\n`);
  await page.click("[data-testid=preview-paste]");
  await page.waitForSelector("[data-testid=import-preview]");
  const preview = await page.textContent("[data-testid=import-preview]");
  assert.match(preview, /~ node gpu0 changed/);
  assert.match(preview, /url: "http:\/\/127\.0\.0\.1:\d+" → "http:\/\/10\.9\.9\.9:11434"/);
  assert.match(preview, /~ section retry changed\s*backoff_base_ms: \d+ → 7/);
  assert.match(await page.textContent("[data-testid=trust-changes]"), /gpu0/);
  await page.close();
});

test("a bad import file shows its problems and changes nothing", async () => {
  const page = await open(b, c, "share");
  const before = await c.adminApi("GET", "/admin/config/export");
  const dir = mkdtempSync(join(tmpdir(), "corral-ui-bad-"));
  const file = join(dir, "broken.toml");
  writeFileSync(file, `[[nodes]]\nname = "x"\nurl = "ftp://nowhere"\nweight = 0\n`);
  await page.setInputFiles("[data-testid=import-file]", file);
  await page.waitForSelector("[data-testid=import-problems]");
  const text = await page.textContent("[data-testid=import-problems]");
  assert.match(text, /nothing was changed/);
  assert.match(text, /nodes\[0\]\.url/);
  assert.match(text, /nodes\[0\]\.weight/);
  assert.equal(await page.$("[data-testid=apply-import]"), null, "no way to apply it");
  assert.equal(await c.adminApi("GET", "/admin/config/export"), before);
  await page.close();
});

test("models: a pull lands on the ticked node only, with progress", async () => {
  const page = await open(b, c, "models");
  await page.fill("input[aria-label='model to pull']", "qwen3:4b");
  await page.check("label:has-text('gpu0') input");
  await page.click("form button.primary");
  await page.waitForFunction(() => document.querySelector("[data-progress=gpu0]")?.textContent?.includes("success"), null, { timeout: 10000 });
  assert.equal(await page.$("[data-progress=gpu2]"), null);
  const tags = await (await fetch(c.urls[0] + "/api/tags")).json();
  assert.ok(tags.models.some((m) => m.name.startsWith("qwen3:4b")));
  const other = await (await fetch(c.urls[2] + "/api/tags")).json();
  assert.ok(!other.models.some((m) => m.name.startsWith("qwen3:4b")), "gpu2 was not ticked");
  await page.close();
});

test("providers: add one, see its key missing; requests list and CSV export", async () => {
  const page = await open(b, c, "providers");
  await page.fill("input[aria-label='provider name']", "openai");
  await page.fill("input[aria-label='secret name']", "openai-key");
  await page.click("form button.primary");
  await page.waitForSelector("tr[data-provider=openai]");
  assert.match(await page.textContent("tr[data-provider=openai]"), /\* → gpt-4o-mini/);
  const providers = await c.adminApi("GET", "/admin/providers");
  assert.equal(providers[0].secret, "openai-key");
  if (SHOTS) await page.screenshot({ path: join(SHOTS, "ui-providers.png"), fullPage: true });

  await page.click("[data-screen=requests]");
  await page.waitForSelector("[data-testid=requests] tbody tr td:has-text('/api/chat')");
  const [download] = await Promise.all([page.waitForEvent("download"), page.click("text=Export CSV")]);
  const csv = readFileSync(await download.path(), "utf8");
  assert.match(csv.split("\n")[0], /^id,started_at,endpoint/);
  assert.ok(csv.split("\n").length > 10, "the rows are there");
  await page.close();
});

// A cluster of its own: these take nodes down, out and back, which the tests above must not see.
describe("node state with reason and since, and the safety rails", () => {
  let d;
  before(async () => {
    d = await cluster({ health: "deep_interval_ms = 200" });
  });
  after(() => d?.stop());

  test("a down card says why and since when, and shows what it last reported as last-known", async () => {
    const page = await open(b, d);
    await page.waitForSelector(".card[data-node=gpu0][data-state=healthy]", { timeout: 10000 });
    assert.match(await page.textContent(".card[data-node=gpu0] [data-testid=state-reason]"), /healthy since \d\d:\d\d \(\d+ (s|min)\)/);
    // Until gpu0 has answered a chat (and so has the model loaded), then let the deep probe see it.
    for (let i = 0; i < 30 && (await d.received(0)) === 0; i++) assert.equal((await d.chat()).status, 200);
    assert.ok((await d.received(0)) > 0, "gpu0 answered a chat");
    await page.waitForSelector(".card[data-node=gpu0] .tag.hot", { timeout: 5000 });

    d.sims[0].stop();
    await page.waitForSelector(".card[data-node=gpu0][data-state=unhealthy]", { timeout: 5000 });
    const reason = await page.textContent(".card[data-node=gpu0] [data-testid=state-reason]");
    assert.match(reason, /down since \d\d:\d\d \(\d+ s\): connection refused at http:\/\/127\.0\.0\.1:\d+/, reason);
    assert.ok(reason.includes(`connection refused at ${d.urls[0]}`), `the node's own address: ${reason}`);
    assert.equal(await page.$(".card[data-node=gpu0] .tag.hot"), null, "a dead node's models are not shown as loaded");
    assert.match(await page.textContent(".card[data-node=gpu0] [data-testid=last-known]"), /last known \d+ s ago, not live/);
    assert.match(await page.textContent(".card[data-node=gpu0] .tag.stale"), /llama3\.2.* · was in VRAM/);
    const ttfb = ".card[data-node=gpu0] [data-testid=ttfb]";
    assert.match(await page.getAttribute(ttfb, "class"), /\bstale\b/, "first token greyed");
    assert.match(await page.textContent(ttfb), /ms · last known \d+ s ago/);

    await page.click("[data-screen=nodes]");
    assert.match(await page.textContent("tr[data-node=gpu0] [data-testid=state-reason]"), /down since \d\d:\d\d \(\d+ s\): connection refused at http/);
    await page.click("tr[data-node=gpu0] button:has-text('Test')");
    await page.waitForFunction(() => document.querySelector("tr[data-node=gpu0] [data-testid=latency]")?.textContent?.startsWith("failed"), null, { timeout: 5000 });
    assert.match(await page.textContent("tr[data-node=gpu0] [data-testid=latency]"), /^failed: connection refused at http:\/\/127\.0\.0\.1:\d+/);
    await page.close();
  });

  test("taking out the last serving node asks first; cancelling changes nothing", async () => {
    const page = await open(b, d, "nodes");
    await page.waitForSelector("tr[data-node=gpu0] td.state:has-text('down')", { timeout: 5000 });
    // gpu2 still serves, so draining gpu1 needs no confirmation.
    await page.click("tr[data-node=gpu1] button:has-text('Drain')");
    await page.waitForSelector("tr[data-node=gpu1] td.state:has-text('draining')", { timeout: 5000 });
    assert.equal(await page.isVisible("[data-testid=confirm]"), false, "no dialog while another node serves");

    await page.click("tr[data-node=gpu2] button:has-text('Drain')");
    await page.waitForSelector("[data-testid=confirm]", { timeout: 5000 });
    assert.match(await page.textContent("[data-testid=confirm]"), /Drain gpu2, the last serving node\?.*gpu0 is down, gpu1 is draining/s);
    await page.click("[data-testid=confirm-cancel]");
    assert.equal(await page.isVisible("[data-testid=confirm]"), false);
    assert.equal((await d.adminApi("GET", "/admin/nodes/gpu2")).state, "healthy", "cancel leaves it serving");

    await page.uncheck("tr[data-node=gpu2] input[aria-label=enabled]");
    await page.waitForSelector("[data-testid=confirm]", { timeout: 5000 });
    assert.match(await page.textContent("[data-testid=confirm]"), /Disable gpu2, the last serving node\?/);
    await page.click("[data-testid=confirm-cancel]");
    assert.equal(await page.isChecked("tr[data-node=gpu2] input[aria-label=enabled]"), true, "the box goes back");
    assert.equal((await d.adminApi("GET", "/admin/nodes/gpu2")).admin, "active");

    await page.click("tr[data-node=gpu2] button:has-text('Drain')");
    await page.click("[data-testid=confirm-ok]");
    await page.waitForSelector("tr[data-node=gpu2] td.state:has-text('draining')", { timeout: 5000 });
    await page.close();
  });

  test("with no serving capacity every screen says so, and Resume brings the nodes back", async () => {
    const page = await open(b, d);
    await page.waitForSelector("[data-testid=capacity-banner]", { timeout: 5000 });
    assert.match(await page.textContent("[data-testid=capacity-banner]"), /No serving capacity.*gpu0 down · gpu1 draining · gpu2 draining/s);
    await page.click("[data-screen=rules]");
    assert.ok(await page.isVisible("[data-testid=capacity-banner]"), "on every screen");
    await page.click("[data-testid=resume-nodes]");
    await page.waitForSelector("[data-testid=capacity-banner]", { state: "detached", timeout: 5000 });
    await page.click("[data-screen=overview]");
    for (const n of ["gpu1", "gpu2"]) await page.waitForSelector(`.card[data-node=${n}][data-state=healthy]`, { timeout: 5000 });
    const nodes = await d.adminApi("GET", "/admin/nodes");
    assert.deepEqual(nodes.map((n) => n.admin), ["active", "active", "active"]);
    assert.equal((await d.chat()).status, 200, "it serves again");
    await page.close();
  });

  test("a paused broker shows a banner on every screen with Resume", async () => {
    const page = await open(b, d);
    assert.deepEqual(await d.adminApi("PUT", "/admin/accepting", { accepting: false }), { accepting: false });
    await page.waitForSelector("[data-testid=paused-banner]", { timeout: 7000 });
    await page.click("[data-screen=models]");
    assert.match(await page.textContent("[data-testid=paused-banner]"), /Paused\..*503/s);
    await page.click("[data-testid=resume]");
    await page.waitForSelector("[data-testid=paused-banner]", { state: "detached", timeout: 5000 });
    assert.deepEqual(await d.adminApi("GET", "/admin/accepting"), { accepting: true });
    await page.close();
  });
});
