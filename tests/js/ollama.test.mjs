// The official ollama-js client (npm `ollama`) against `corral serve` over `corral sim` nodes:
// chat, stream, list, embed, pull with progress, and a pull fanned out to three nodes one of
// which fails. Run with `npm test` here (node --test); CORRAL_BIN names the corral binary.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { Ollama } from "ollama";

const here = dirname(fileURLToPath(import.meta.url));
const BIN = process.env.CORRAL_BIN || join(here, "..", "..", "target", "debug", "corral");
const started = [];

/** Start `corral ...args` and resolve with the first `count` URLs on lines containing `needle`. */
function corral(args, needle, count = 1) {
  const p = spawn(BIN, args, { env: { ...process.env, NO_COLOR: "1", CORRAL_LOG: "info" }, stdio: ["ignore", "pipe", "pipe"] });
  started.push(p);
  return new Promise((resolve, reject) => {
    const found = [];
    let buf = "";
    const timer = setTimeout(() => reject(new Error(`corral ${args[0]} printed no "${needle}" in 30 s`)), 30_000);
    const onData = (d) => {
      buf += d;
      let i;
      while ((i = buf.indexOf("\n")) >= 0) {
        const line = buf.slice(0, i);
        buf = buf.slice(i + 1);
        if (line.includes(needle) && found.length < count) {
          found.push(line.match(/http:\/\/[0-9.:]+/)[0]);
          if (found.length === count) {
            clearTimeout(timer);
            resolve(found);
          }
        }
      }
    };
    p.stdout.on("data", onData);
    p.stderr.on("data", onData);
    p.on("exit", (code) => reject(new Error(`corral ${args[0]} exited with ${code}`)));
  });
}

async function serve(nodes, extra = "") {
  const tmp = mkdtempSync(join(tmpdir(), "corral-js-"));
  let cfg = `[[listeners]]\naddr = "127.0.0.1:0"\n\n[admin]\naddr = "127.0.0.1:0"\n\n[store]\npath = "${tmp}/corral.db"\n\n${extra}`;
  nodes.forEach((url, i) => (cfg += `[[nodes]]\nname = "gpu${i}"\nurl = "${url}"\n\n`));
  writeFileSync(join(tmp, "corral.toml"), cfg);
  const [url] = await corral(["serve", "--config", join(tmp, "corral.toml")], "serving the Ollama API on");
  return url;
}

async function tags(url) {
  const r = await fetch(`${url}/api/tags`);
  return (await r.json()).models.map((m) => m.name);
}

let client;
let uneven;
let unevenSims;
let fanout;
let fanoutSims;

before(async () => {
  const sims = await corral(["sim", "--nodes", "3", "--port", "0", "--tps", "0", "--ttft-ms", "5"], "simulated Ollama node on", 3);
  client = new Ollama({ host: await serve(sims) });
  // One fast node and two slow ones (10 tokens/s: ~1.4 s per pull), so a client that stops at
  // the first node's success is done long before the slow nodes are.
  const [fast] = await corral(["sim", "--port", "0", "--tps", "0", "--ttft-ms", "0"], "simulated Ollama node on");
  const slow = await corral(["sim", "--nodes", "2", "--port", "0", "--tps", "10", "--ttft-ms", "0"], "simulated Ollama node on", 2);
  unevenSims = [fast, ...slow];
  uneven = new Ollama({ host: await serve(unevenSims) });
  // Three nodes for the failing pull: 25 tokens/s, so a pull's 14 lines take ~0.5 s per healthy
  // node; probes far apart, so Corral still counts gpu2 available after it stops listening.
  fanoutSims = await corral(["sim", "--nodes", "3", "--port", "0", "--tps", "25", "--ttft-ms", "0"], "simulated Ollama node on", 3);
  const url = await serve(fanoutSims, "[health]\ninterval_ms = 600000\nfailures_to_down = 100\ndeep_interval_ms = 600000\n\n");
  await tags(url);
  const down = await fetch(`${fanoutSims[2]}/_sim/down`, { method: "POST", body: JSON.stringify({ for_ms: 120_000 }) });
  assert.equal(down.status, 200, "the third sim goes down");
  fanout = new Ollama({ host: url });
});

after(() => {
  for (const p of started) p.kill("SIGKILL");
});

test("chat", async () => {
  const r = await client.chat({ model: "llama3.2", messages: [{ role: "user", content: "hello" }], options: { num_predict: 5 } });
  assert.equal(r.done, true);
  assert.equal(r.message.role, "assistant");
  assert.ok(r.message.content);
  assert.equal(r.eval_count, 5);
});

test("chat stream", async () => {
  const parts = [];
  for await (const p of await client.chat({ model: "llama3.2", messages: [{ role: "user", content: "hi" }], stream: true, options: { num_predict: 6 } })) {
    parts.push(p);
  }
  assert.ok(parts.length >= 2);
  assert.equal(parts.at(-1).done, true);
  assert.equal(parts.at(-1).eval_count, 6);
  assert.ok(parts.map((p) => p.message.content).join(""));
});

test("generate stream", async () => {
  const parts = [];
  for await (const p of await client.generate({ model: "llama3.2", prompt: "x", stream: true, options: { num_predict: 3 } })) parts.push(p);
  assert.equal(parts.at(-1).done, true);
  assert.ok(parts.map((p) => p.response).join(""));
});

test("list", async () => {
  const names = (await client.list()).models.map((m) => m.model);
  assert.ok(names.includes("llama3.2:latest"), `merged list: ${names}`);
  assert.ok(names.includes("nomic-embed-text:latest"));
});

test("embed", async () => {
  const r = await client.embed({ model: "nomic-embed-text", input: ["one", "two"] });
  assert.equal(r.embeddings.length, 2);
  assert.ok(r.embeddings[0].length > 0);
});

test("show and ps", async () => {
  assert.ok((await client.show({ model: "llama3.2" })).details.family);
  await client.generate({ model: "llama3.2", prompt: "warm", options: { num_predict: 1 } });
  assert.ok((await client.ps()).models.some((m) => m.model === "llama3.2:latest"));
});

test("pull with progress", async () => {
  const seen = [];
  for await (const p of await client.pull({ model: "corral-js-pulled", stream: true })) seen.push(p);
  assert.equal(seen.at(-1).status, "success");
  assert.ok(seen.some((p) => p.total && p.completed !== undefined), "layer progress carries total / completed");
});

test("pull to three healthy nodes: every node has the model when the client is done", async () => {
  for await (const _ of await uneven.pull({ model: "corral-js-everywhere", stream: true }));
  for (const sim of unevenSims) {
    assert.ok((await tags(sim)).includes("corral-js-everywhere:latest"), `${sim} has the model`);
  }
});

test("pull to three nodes, one failing: the client reads to the end and reports the failing node", async () => {
  const seen = [];
  let error;
  try {
    for await (const p of await fanout.pull({ model: "corral-fanout-js", stream: true })) seen.push(p);
  } catch (e) {
    error = e; // a last {"error": "..."} line is Ollama's own way to end a failed pull
  }
  const text = error ? error.message : seen.map((p) => p.status).join(" ");
  assert.ok(!text.includes("[object Object]"), `the error is text: ${text}`);
  assert.ok(text.includes("gpu2"), `the failing node is named in what the client reports: ${text}`);
  assert.ok(seen.some((p) => p.total), "layer progress from the healthy nodes came first");
  for (const healthy of fanoutSims.slice(0, 2)) {
    assert.ok((await tags(healthy)).includes("corral-fanout-js:latest"),
      `the client read to the end, so the pull on ${healthy} finished (it saw ${seen.length} lines, then ${JSON.stringify(text)})`);
  }
});
