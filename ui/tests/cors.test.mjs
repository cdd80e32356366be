// CORS in a real browser: pages served from an origin Ollama allows by default
// (http://localhost:<port>), from one the listener's `allowed_origins` names
// (http://127.0.0.3:<port>) and from a foreign one (http://127.0.0.2:<port>) call the proxy with
// a JSON fetch, which Chromium preflights. The allowed pages read the answer; the foreign page's
// fetch fails and no node sees its chat.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { proc, browser, TOKEN } from "./harness.mjs";

let sim, serve, proxy, simUrl, page, b;

/** A page anyone may load: the test drives its `fetch` through `page.evaluate`. */
function pageServer() {
  const server = createServer((_, res) => {
    res.writeHead(200, { "Content-Type": "text/html; charset=utf-8" });
    res.end("<!doctype html><title>cors</title><p>a web page</p>");
  });
  // All addresses, so localhost, 127.0.0.2 and 127.0.0.3 all reach it.
  return new Promise((ok) => server.listen(0, () => ok(server)));
}

before(async () => {
  sim = proc(["sim", "--port", "0", "--tps", "0", "--ttft-ms", "0"]);
  simUrl = await sim.url("simulated Ollama node on");
  const dir = mkdtempSync(join(tmpdir(), "corral-cors-"));
  const cfg =
    `[[listeners]]\naddr = "127.0.0.1:0"\nallowed_origins = ["http://127.0.0.3:*"]\n\n[admin]\naddr = "127.0.0.1:0"\n\n` +
    `[store]\npath = "${dir}/corral.db"\n\n[health]\ninterval_ms = 200\ntimeout_ms = 300\n\n` +
    `[[nodes]]\nname = "gpu0"\nurl = "${simUrl}"\n\n[[categories]]\nname = "default"\n`;
  writeFileSync(join(dir, "corral.toml"), cfg);
  serve = proc(["serve", "--config", join(dir, "corral.toml")], { CORRAL_ADMIN_TOKEN: TOKEN });
  proxy = await serve.url("serving the Ollama API on");
  page = await pageServer();
  b = await browser();
});

after(async () => {
  await b?.close();
  page?.close();
  serve?.stop();
  sim?.stop();
});

async function chatsSeen() {
  const r = await fetch(simUrl + "/_sim/received");
  return (await r.json()).filter((x) => x.path === "/api/chat").length;
}

/** Load the page from `origin` and POST a JSON chat to the proxy from it. */
async function chatFrom(origin) {
  const tab = await b.newPage();
  try {
    await tab.goto(`${origin}/`);
    return await tab.evaluate(async (proxy) => {
      try {
        const r = await fetch(proxy + "/api/chat", {
          method: "POST",
          // A JSON body and a Corral header: both need the preflight to allow them.
          headers: { "Content-Type": "application/json", "X-Corral-Category": "default" },
          body: JSON.stringify({ model: "llama3.2", stream: false, messages: [{ role: "user", content: "hi" }] }),
        });
        const body = await r.json();
        return { status: r.status, done: body.done, content: body.message?.content, node: r.headers.get("x-corral-node") };
      } catch (e) {
        return { failed: String(e) };
      }
    }, proxy);
  } finally {
    await tab.close();
  }
}

test("a page from an origin Ollama allows by default calls the proxy and reads the answer", async () => {
  const r = await chatFrom(`http://localhost:${page.address().port}`);
  assert.equal(r.failed, undefined, `fetch failed: ${r.failed}`);
  assert.equal(r.status, 200);
  assert.equal(r.done, true);
  assert.ok(r.content, "the answer is readable");
  assert.equal(r.node, "gpu0", "Corral's own headers are exposed to the page");
});

test("a page from an origin in the listener's allowed_origins calls the proxy", async () => {
  const r = await chatFrom(`http://127.0.0.3:${page.address().port}`);
  assert.equal(r.failed, undefined, `fetch failed: ${r.failed}`);
  assert.equal(r.status, 200);
  assert.equal(r.done, true);
});

test("a page from a foreign origin cannot call the proxy, and no node sees its request", async () => {
  const before = await chatsSeen();
  const r = await chatFrom(`http://127.0.0.2:${page.address().port}`);
  assert.match(r.failed ?? "", /TypeError|Failed to fetch/, `the browser refused: ${JSON.stringify(r)}`);
  assert.equal(await chatsSeen(), before, "the preflight was refused, so the chat was never sent");
  // The proxy's own answer to that preflight: 403 and no CORS header.
  const pre = await fetch(proxy + "/api/chat", {
    method: "OPTIONS",
    headers: { Origin: `http://127.0.0.2:${page.address().port}`, "Access-Control-Request-Method": "POST" },
  });
  assert.equal(pre.status, 403);
  assert.equal(pre.headers.get("access-control-allow-origin"), null);
});
