// The real desktop window (Tauri + WebKitGTK) under Xvfb, driven through tauri-driver and
// WebKitWebDriver: it starts its embedded broker, shows the node cards, and a node toggle in the
// window reaches the broker. Run by scripts/test inside the desktop session; needs DISPLAY,
// TAURI_DRIVER (the tauri-driver binary) and CORRAL_DESKTOP (the app binary).
// With CORRAL_SCREENSHOTS=DIR it also saves the README's screenshots of the window.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn, execFileSync } from "node:child_process";
import { mkdtempSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { proc, TOKEN } from "./harness.mjs";

const APP = process.env.CORRAL_DESKTOP;
const DRIVER = process.env.TAURI_DRIVER;
const SHOTS = process.env.CORRAL_SCREENSHOTS;
const skip = !APP || !DRIVER || !process.env.DISPLAY ? "needs CORRAL_DESKTOP, TAURI_DRIVER and DISPLAY (scripts/test sets them)" : false;

function freePort() {
  return new Promise((ok) => {
    const s = createServer();
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => ok(port));
    });
  });
}

/** A minimal W3C WebDriver client over fetch. */
function webdriver(base) {
  let sid = null;
  const call = async (method, path, body) => {
    const r = await fetch(`${base}${path}`, { method, headers: { "Content-Type": "application/json" }, body: body ? JSON.stringify(body) : undefined });
    const j = await r.json();
    if (!r.ok) throw new Error(`${method} ${path}: ${JSON.stringify(j.value ?? j)}`);
    return j.value;
  };
  const el = (v) => v["element-6066-11e4-a23d-4a4d69c6b9c7"] ?? v.ELEMENT ?? Object.values(v)[0];
  return {
    async start(app, env) {
      const v = await call("POST", "/session", { capabilities: { alwaysMatch: { browserName: "wry", "tauri:options": { application: app, env } } } });
      sid = v.sessionId;
    },
    async stop() {
      if (sid) await call("DELETE", `/session/${sid}`).catch(() => {});
      sid = null;
    },
    async all(css) {
      return (await call("POST", `/session/${sid}/elements`, { using: "css selector", value: css })).map(el);
    },
    async one(css, timeoutMs = 15000) {
      const until = Date.now() + timeoutMs;
      for (;;) {
        const found = await this.all(css);
        if (found.length) return found[0];
        if (Date.now() > until) throw new Error(`no element ${css}`);
        await new Promise((r) => setTimeout(r, 100));
      }
    },
    async click(css) {
      await call("POST", `/session/${sid}/element/${await this.one(css)}/click`, {});
    },
    async text(css) {
      return call("GET", `/session/${sid}/element/${await this.one(css)}/text`);
    },
    async type(css, text) {
      await call("POST", `/session/${sid}/element/${await this.one(css)}/value`, { text });
    },
    async script(js, args = []) {
      return call("POST", `/session/${sid}/execute/sync`, { script: js, args });
    },
    async paint() {
      return call("POST", `/session/${sid}/execute/async`, {
        script: "const done = arguments[arguments.length - 1]; requestAnimationFrame(() => requestAnimationFrame(() => done(true)));",
        args: [],
      });
    },
  };
}

async function eventually(what, f, timeoutMs = 15000) {
  const until = Date.now() + timeoutMs;
  for (;;) {
    if (await f()) return;
    if (Date.now() > until) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** Capture the X screen once WebKit has painted the current DOM (two animation frames, then a
 * short settle: Xvfb is only as fresh as WebKit's last paint). Docs only, never an assertion. */
async function screenshot(name) {
  if (!SHOTS) return;
  await wd.paint();
  await new Promise((r) => setTimeout(r, 700));
  execFileSync("import", ["-window", "root", join(SHOTS, name)]);
}

let sims, driver, wd, admin, proxy, dir;
before(async () => {
  if (skip) return;
  sims = [0, 1].map(() => proc(["sim", "--port", "0", "--tps", "0", "--ttft-ms", "0"]));
  const urls = await Promise.all(sims.map((s) => s.url("simulated Ollama node on")));
  dir = mkdtempSync(join(tmpdir(), "corral-desktop-"));
  const adminPort = await freePort();
  const proxyPort = await freePort();
  admin = `http://127.0.0.1:${adminPort}`;
  proxy = `http://127.0.0.1:${proxyPort}`;
  let cfg = `[[listeners]]\naddr = "127.0.0.1:${proxyPort}"\n\n[admin]\naddr = "127.0.0.1:${adminPort}"\n\n[store]\npath = "${dir}/corral.db"\n\n[health]\ninterval_ms = 200\ntimeout_ms = 300\nfailures_to_down = 1\nsuccesses_to_up = 1\n\n`;
  urls.forEach((u, i) => (cfg += `[[nodes]]\nname = "gpu${i}"\nurl = "${u}"\n\n`));
  cfg += `[[categories]]\nname = "default"\n\n[[categories]]\nname = "hr"\npriority = 0\n\n`;
  cfg += `[[categories]]\nname = "support"\npolicy = "p2c"\npriority = 2\ncloud = "on-failure"\nproviders = ["openai"]\nredact = true\nqueue_timeout_ms = 5000\n\n`;
  cfg += `[[categories]]\nname = "embedding"\npolicy = "round-robin"\nmodels = ["*embed*"]\n\n`;
  cfg += `[[providers]]\nname = "openai"\nbase_url = "https://api.openai.com/v1"\nsecret = "openai"\nmodel_map = { "*" = "gpt-4o-mini" }\n`;
  writeFileSync(join(dir, "corral.toml"), cfg);
  const port = await freePort();
  const env = { ...process.env, CORRAL_CONFIG: join(dir, "corral.toml"), CORRAL_ADMIN_TOKEN: TOKEN, CORRAL_MUTE: "1", TAURI_WEBVIEW_AUTOMATION: "true" };
  driver = spawn(DRIVER, ["--port", String(port)], { env, stdio: "ignore" });
  wd = webdriver(`http://127.0.0.1:${port}`);
  await eventually("tauri-driver", async () => fetch(`http://127.0.0.1:${port}/status`).then((r) => r.ok, () => false));
  await wd.start(APP, env);
});
after(async () => {
  await wd?.stop();
  driver?.kill("SIGKILL");
  sims?.forEach((s) => s.stop());
});

const adminApi = async (method, path, body) => {
  const r = await fetch(admin + path, { method, headers: { Authorization: `Bearer ${TOKEN}` }, body });
  return r.json();
};

test("the window starts its broker and shows a card per node", { skip }, async () => {
  await wd.one(".card[data-node=gpu0][data-state=healthy]");
  await wd.one(".card[data-node=gpu1][data-state=healthy]");
  assert.match(await wd.text("[data-testid=summary]"), /2\/2 up/);
});

test("a node toggle in the window disables the node in the broker", { skip }, async () => {
  await wd.click("[data-screen=nodes]");
  await wd.click("tr[data-node=gpu0] input[aria-label=enabled]");
  await eventually("gpu0 disabled", async () => (await adminApi("GET", "/admin/nodes/gpu0")).state === "disabled");
  await wd.click("tr[data-node=gpu0] input[aria-label=enabled]");
  await eventually("gpu0 back", async () => (await adminApi("GET", "/admin/nodes/gpu0")).state !== "disabled");
});

test("screens for the README: a node down, the rules editor, an import preview", { skip }, async () => {
  await wd.click("[data-screen=overview]");
  for (let i = 0; i < 24; i++) {
    const r = await fetch(`${proxy}/api/chat`, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ model: "llama3.2", stream: i % 2 === 0, messages: [{ role: "user", content: `q${i}` }] }) });
    await r.text();
  }
  sims[1].stop();
  await wd.one(".card[data-node=gpu1][data-state=unhealthy]");
  await eventually("charts drawn", async () => (await wd.all(".chart svg")).length >= 4);
  await eventually("stats shown", async () => !/–/.test(await wd.text(".card[data-node=gpu0] dl")));
  await screenshot("desktop-overview-node-down.png");
  await wd.click("[data-screen=rules]");
  await wd.one("tr[data-category=hr]");
  await screenshot("desktop-rules.png");
  await wd.click("[data-screen=share]");
  const file = join(dir, "team.toml");
  writeFileSync(file, `[[nodes]]\nname = "gpu7"\nurl = "http://10.0.0.7:11434"\n\n[[providers]]\nname = "qwen"\nbase_url = "https://dashscope.aliyuncs.com/compatible-mode/v1"\nsecret = "dashscope"\nmodel_map = { "*" = "qwen-plus" }\n\n[[categories]]\nname = "public"\ncloud = "on-failure"\nproviders = ["qwen"]\nredact = true\n`);
  await wd.type("[data-testid=import-file]", file);
  await wd.one("[data-testid=import-preview]");
  assert.match(await wd.text("[data-testid=import-preview]"), /node gpu7 added/);
  await screenshot("desktop-import-preview.png");
});
