// The real desktop window (Tauri + WebKitGTK) under Xvfb, driven through tauri-driver and
// WebKitWebDriver: `--config FILE` (and its errors), the embedded broker's node cards, a node
// toggle in the window reaching the broker, single instance, the tray's menu and icon, a
// notification's "open node" action, and exports through the save dialog. Run by scripts/test
// inside the desktop session (Xvfb, a private D-Bus, dunst); needs DISPLAY, TAURI_DRIVER (the
// tauri-driver binary) and CORRAL_DESKTOP (the app binary).
//
// The app's test hooks (README "Desktop app and UI"): CORRAL_DESKTOP_STATE=FILE makes it keep
// FILE up to date with the tray (icon, tooltip, menu labels), the clipboard, second launches and
// saves, and allows the `test_tray_click` command (a tray item by id, as a click); with
// CORRAL_DESKTOP_SAVE_TO=DIR the save dialog answers DIR/<name>. There is no tray host under
// Xvfb, so the tray is checked through that file.
// With CORRAL_SCREENSHOTS=DIR it also saves the README's screenshots of the window.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn, spawnSync, execFileSync } from "node:child_process";
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
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
    async start(app, args = []) {
      const v = await call("POST", "/session", { capabilities: { alwaysMatch: { browserName: "wry", "tauri:options": { application: app, args } } } });
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
    /** Invoke one of the app's Tauri commands from the window; "ok" or the error's text. */
    async invoke(cmd, payload) {
      return call("POST", `/session/${sid}/execute/async`, {
        script: "const done = arguments[arguments.length - 1]; window.__TAURI_INTERNALS__.invoke(arguments[0], arguments[1]).then(() => done('ok'), (e) => done(String(e)));",
        args: [cmd, payload],
      });
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

let sims, driver, wd, admin, proxy, dir, cfgPath, envCfgPath, saveDir, stateFile, env;
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
  cfgPath = join(dir, "corral.toml");
  writeFileSync(cfgPath, cfg);
  // What CORRAL_CONFIG names: the flag must win over it.
  envCfgPath = join(dir, "from-env.toml");
  writeFileSync(envCfgPath, `[admin]\naddr = "127.0.0.1:${await freePort()}"\n\n[[listeners]]\naddr = "127.0.0.1:${await freePort()}"\n\n[[nodes]]\nname = "from-env"\nurl = "${urls[0]}"\n`);
  saveDir = join(dir, "saved");
  mkdirSync(saveDir);
  stateFile = join(dir, "desktop-state.json");
  const port = await freePort();
  env = {
    ...process.env,
    CORRAL_CONFIG: envCfgPath,
    CORRAL_ADMIN_TOKEN: TOKEN,
    CORRAL_MUTE: "1",
    TAURI_WEBVIEW_AUTOMATION: "true",
    CORRAL_DESKTOP_SAVE_TO: saveDir,
    CORRAL_DESKTOP_STATE: stateFile,
  };
  driver = spawn(DRIVER, ["--port", String(port)], { env, stdio: "ignore" });
  wd = webdriver(`http://127.0.0.1:${port}`);
  await eventually("tauri-driver", async () => fetch(`http://127.0.0.1:${port}/status`).then((r) => r.ok, () => false));
});
after(async () => {
  await wd?.stop();
  driver?.kill("SIGKILL");
  sims?.forEach((s) => s.stop());
});

/** The app started directly (not through the driver): its output, and its exit. */
function launch(args, extraEnv = {}) {
  const child = spawn(APP, args, { env: { ...env, NO_COLOR: "1", ...extraEnv }, stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  child.stdout.on("data", (b) => (out += b));
  child.stderr.on("data", (b) => (out += b));
  const exited = new Promise((ok) => child.on("exit", (code, signal) => ok({ code, signal })));
  return { child, out: () => out, exited };
}

const readState = (file = stateFile) => {
  try {
    return JSON.parse(readFileSync(file, "utf8"));
  } catch {
    return null;
  }
};

/** Run a tray menu item by id through the test hook, as a click would. */
async function trayClick(id) {
  assert.equal(await wd.invoke("test_tray_click", { id }), "ok");
}

const adminApi = async (method, path, body) => {
  const r = await fetch(admin + path, { method, headers: { Authorization: `Bearer ${TOKEN}` }, body });
  return r.json();
};

test("--config with a missing file: an error window that names it, and no demo cluster", { skip }, async () => {
  const errState = join(dir, "err-state.json");
  const missing = join(dir, "missing.toml");
  const app = launch(["--config", missing], { CORRAL_DESKTOP_STATE: errState });
  try {
    await eventually("the error on stderr", async () => app.out().includes("error: Corral cannot start"), 30000);
    assert.match(app.out(), /missing\.toml \(given by --config\) does not exist/);
    assert.doesNotMatch(app.out(), /broker started|source=the demo cluster/);
    assert.match(readState(errState)?.error ?? "", /missing\.toml \(given by --config\) does not exist/);
    // The message is a window of its own, titled so (no window manager: read X's tree).
    await eventually("the error window", async () => execFileSync("xwininfo", ["-root", "-tree"]).toString().includes('"Corral cannot start"'));
    if (SHOTS) {
      // No WebDriver session yet (nothing to ask about paints): give GTK a moment to draw.
      await new Promise((r) => setTimeout(r, 1000));
      execFileSync("import", ["-window", "root", "-crop", "520x170+0+0", join(SHOTS, "desktop-config-error.png")]);
    }
  } finally {
    app.child.kill("SIGKILL");
    await app.exited;
  }
});

test("--config with an invalid file: the error says what is wrong, and the app stops", { skip }, async () => {
  const bad = join(dir, "bad.toml");
  writeFileSync(bad, `[[nodes]]\nname = "gpu9"\nurl = "not a url"\n`);
  const app = launch(["--config", bad]);
  try {
    await eventually("the error on stderr", async () => app.out().includes("error: Corral cannot start"), 30000);
    assert.match(app.out(), /bad\.toml \(given by --config\) is not a valid config/);
    assert.match(app.out(), /url/);
    assert.doesNotMatch(app.out(), /broker started/);
  } finally {
    app.child.kill("SIGKILL");
    await app.exited;
  }
});

test("the window starts on the --config file's nodes (not CORRAL_CONFIG's, not the demo)", { skip }, async () => {
  await wd.start(APP, ["--config", cfgPath]);
  await wd.one(".card[data-node=gpu0][data-state=healthy]");
  await wd.one(".card[data-node=gpu1][data-state=healthy]");
  assert.match(await wd.text("[data-testid=summary]"), /2\/2 up/);
  assert.equal((await wd.all(".card[data-node=from-env]")).length, 0);
  assert.equal((await wd.all("[data-testid=demo]")).length, 0);
});

test("a node toggle in the window disables the node in the broker", { skip }, async () => {
  await wd.click("[data-screen=nodes]");
  await wd.click("tr[data-node=gpu0] input[aria-label=enabled]");
  await eventually("gpu0 disabled", async () => (await adminApi("GET", "/admin/nodes/gpu0")).state === "disabled");
  await wd.click("tr[data-node=gpu0] input[aria-label=enabled]");
  await eventually("gpu0 back", async () => (await adminApi("GET", "/admin/nodes/gpu0")).state !== "disabled");
});

test("a second launch hands over to the first and exits at once; the first stays", { skip }, async () => {
  const before = readState()?.second_launches ?? 0;
  const started = Date.now();
  const second = launch(["--config", cfgPath]);
  const timeout = new Promise((ok) => setTimeout(() => ok({ code: "timeout" }), 20000));
  const { code } = await Promise.race([second.exited, timeout]);
  if (code === "timeout") second.child.kill("SIGKILL");
  assert.equal(code, 0, `the second launch did not exit: ${second.out()}`);
  assert.ok(Date.now() - started < 15000);
  assert.doesNotMatch(second.out(), /broker started/);
  await eventually("the first saw it", async () => (readState()?.second_launches ?? 0) > before);
  // The first still serves and its window still answers.
  assert.equal((await adminApi("GET", "/admin/nodes/gpu0")).name, "gpu0");
  await wd.click("[data-screen=overview]");
  await wd.one(".card[data-node=gpu0]");
});

test("the tray: status line, every item, a ticked entry per node; its own icon while paused", { skip }, async () => {
  await eventually("the tray's state", async () => readState()?.icon === "healthy" && readState().menu.includes("2/2 nodes up · 0 in flight"));
  const s = readState();
  for (const label of ["Open Corral", "Nodes", "  gpu0 (up)", "  gpu1 (up)", "Connect", `  Copy endpoint: ${proxy}`, `  Copy OpenAI URL: ${proxy}/v1`, `  Copy OLLAMA_HOST=${proxy}`, "Open UI in browser", "Open config folder", "Open logs folder", "Pause (new requests get 503)", "Mute notifications", "Quit (let requests finish)"]) {
    assert.ok(s.menu.includes(label), `menu has ${JSON.stringify(label)}: ${JSON.stringify(s.menu)}`);
  }
  assert.deepEqual(s.nodes, [["gpu0", true], ["gpu1", true]]);
  const healthyIcon = readFileSync(join(dir, "tray-icon.png"));
  if (SHOTS) copyFileSync(join(dir, "tray-icon.png"), join(SHOTS, "desktop-tray-healthy.png"));

  await trayClick("pause");
  await eventually("the paused look", async () => readState()?.icon === "paused");
  assert.equal((await adminApi("GET", "/admin/accepting")).accepting, false);
  assert.ok(readState().menu.includes("Resume accepting requests"));
  assert.match(readState().tooltip, /· paused$/);
  assert.notDeepEqual(readFileSync(join(dir, "tray-icon.png")), healthyIcon, "the icon file changed");
  if (SHOTS) copyFileSync(join(dir, "tray-icon.png"), join(SHOTS, "desktop-tray-paused.png"));
  await trayClick("pause");
  await eventually("healthy again", async () => readState()?.icon === "healthy");
  assert.equal((await adminApi("GET", "/admin/accepting")).accepting, true);

  await trayClick("node:gpu0");
  await eventually("gpu0 disabled", async () => (await adminApi("GET", "/admin/nodes/gpu0")).state === "disabled");
  await eventually("its entry unticked", async () => readState()?.menu.includes("  gpu0 (disabled)") && readState().nodes[0][1] === false);
  await trayClick("node:gpu0");
  await eventually("gpu0 back", async () => (await adminApi("GET", "/admin/nodes/gpu0")).state !== "disabled");

  await trayClick("copy");
  await eventually("the endpoint on the clipboard", async () => readState()?.copied === proxy);
  await trayClick("copy-openai");
  await eventually("the /v1 URL on the clipboard", async () => readState()?.copied === `${proxy}/v1`);
  await trayClick("copy-env");
  await eventually("the OLLAMA_HOST line on the clipboard", async () => readState()?.copied === `OLLAMA_HOST=${proxy}`);
  assert.equal(readState().muted, true, "CORRAL_MUTE");
  await trayClick("mute");
  await eventually("unmuted", async () => readState()?.muted === false);
});

test("a node's notification has an action that opens the window on the Nodes screen", { skip }, async (t) => {
  const dunst = spawnSync("dunstctl", ["count", "displayed"]);
  if (dunst.status !== 0) return t.skip("needs dunst (scripts/test starts it)");
  execFileSync("dunstctl", ["close-all"]);
  await wd.click("[data-screen=overview]");
  sims[1].stop();
  await wd.one(".card[data-node=gpu1][data-state=unhealthy]");
  await eventually("the degraded icon", async () => readState()?.icon === "degraded" && readState().menu.includes("  gpu1 (down)"));
  if (SHOTS) copyFileSync(join(dir, "tray-icon.png"), join(SHOTS, "desktop-tray-degraded.png"));
  await eventually("the notice shown", async () => Number(execFileSync("dunstctl", ["count", "displayed"]).toString().trim()) > 0);
  // dunst's "action": the notice's default action, which Corral names "Open node".
  execFileSync("dunstctl", ["action", "0"]);
  await eventually("the Nodes screen", async () => (await wd.all("nav button.active[data-screen=nodes]")).length === 1);
  assert.equal(readState().screen_opened, "nodes:gpu1");
  await wd.one("tr[data-node=gpu1]");
  await screenshot("desktop-nodes-from-notification.png");
  await trayClick("mute");
  execFileSync("dunstctl", ["close-all"]);
});

test("Share → Export and the Requests CSV go through the save dialog; a failed write is shown", { skip }, async () => {
  for (let i = 0; i < 3; i++) {
    const r = await fetch(`${proxy}/api/chat`, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ model: "llama3.2", stream: false, messages: [{ role: "user", content: `e${i}` }] }) });
    await r.text();
  }
  await wd.click("[data-screen=share]");
  await wd.click("[data-testid=export]");
  const config = join(saveDir, "corral-config.toml");
  await eventually("the config written", async () => existsSync(config));
  assert.match(readFileSync(config, "utf8"), /name = "gpu0"/);
  await eventually("the notice", async () => /Saved to .*corral-config\.toml/.test(await wd.text("[data-testid=save-notice]")));
  assert.equal(readState().saved, config);
  await wd.click("[data-screen=requests]");
  await wd.click('button[title$=" rows shown"]');
  const csv = join(saveDir, "corral-requests.csv");
  await eventually("the CSV written", async () => existsSync(csv));
  assert.match(readFileSync(csv, "utf8"), /^id,started_at,endpoint/);
  // The dialog's answer points at a folder that is gone: the person is told, nothing is silent.
  rmSync(saveDir, { recursive: true });
  await wd.click("[data-screen=share]");
  await wd.click("[data-testid=export]");
  await eventually("the error", async () => /Could not save corral-config\.toml: cannot write .*No such file/.test(await wd.text("[data-testid=save-notice][role=alert]")));
  await screenshot("desktop-save-error.png");
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
