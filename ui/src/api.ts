// The admin API, the only thing the UI talks to (so it runs the same in the desktop window and
// in a browser against `corral serve`). The token comes from the URL fragment (`#token=...`,
// which never reaches a server) once, then lives in sessionStorage.

const KEY = "corral-admin-token";

function readToken(): string {
  const hash = new URLSearchParams(location.hash.slice(1));
  const fromUrl = hash.get("token");
  if (fromUrl) {
    sessionStorage.setItem(KEY, fromUrl);
    history.replaceState(null, "", location.pathname + location.search);
    return fromUrl;
  }
  return sessionStorage.getItem(KEY) ?? "";
}

export let token = readToken();

export function setToken(t: string) {
  token = t.trim();
  sessionStorage.setItem(KEY, token);
}

/** An error the admin API answered, with its stable code and, for config changes, each problem. */
export class ApiError extends Error {
  constructor(
    public status: number,
    message: string,
    public code: string = "",
    public problems: string[] = [],
  ) {
    super(message);
  }
}

export async function api<T = any>(method: string, path: string, body?: unknown): Promise<T> {
  const headers: Record<string, string> = { Authorization: `Bearer ${token}` };
  let payload: BodyInit | undefined;
  if (typeof body === "string") {
    payload = body;
    headers["Content-Type"] = "text/plain";
  } else if (body !== undefined) {
    payload = JSON.stringify(body);
    headers["Content-Type"] = "application/json";
  }
  const r = await fetch(path, { method, headers, body: payload });
  const text = await r.text();
  let json: any = undefined;
  try {
    json = text ? JSON.parse(text) : undefined;
  } catch {
    json = undefined;
  }
  if (!r.ok) {
    throw new ApiError(r.status, json?.error ?? (text || r.statusText), json?.code ?? "", json?.problems ?? []);
  }
  return (json ?? text) as T;
}

/** A streamed NDJSON answer, line by line. */
export async function lines(path: string, body: unknown, onLine: (v: any) => void): Promise<void> {
  const r = await fetch(path, {
    method: "POST",
    headers: { Authorization: `Bearer ${token}`, "Content-Type": "application/json" },
    body: JSON.stringify(body),
  });
  if (!r.ok || !r.body) {
    const j = await r.json().catch(() => ({}));
    throw new ApiError(r.status, j.error ?? r.statusText, j.code ?? "");
  }
  const reader = r.body.getReader();
  const dec = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let nl;
    while ((nl = buf.indexOf("\n")) >= 0) {
      const line = buf.slice(0, nl).trim();
      buf = buf.slice(nl + 1);
      if (line) onLine(JSON.parse(line));
    }
  }
  if (buf.trim()) onLine(JSON.parse(buf));
}

/** Server-Sent Events from the broker: node states, requests, reloads, fallback share. */
export function events(onEvent: (kind: string, data: any) => void): EventSource {
  const es = new EventSource(`/admin/events?token=${encodeURIComponent(token)}`);
  for (const kind of ["node_state", "request", "config_reload", "fallback_share"]) {
    es.addEventListener(kind, (e) => {
      let data: any = null;
      try {
        data = JSON.parse((e as MessageEvent).data);
      } catch {
        data = null;
      }
      onEvent(kind, data);
    });
  }
  return es;
}

/** Save `text` as a file: through the desktop shell when there is one, else a download. */
export async function saveFile(name: string, text: string, type = "text/plain") {
  const tauri = (window as any).__TAURI_INTERNALS__;
  if (tauri?.invoke) {
    await tauri.invoke("save_file", { name, text });
    return;
  }
  const url = URL.createObjectURL(new Blob([text], { type }));
  const a = document.createElement("a");
  a.href = url;
  a.download = name;
  document.body.appendChild(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

export const STATES: Record<string, { symbol: string; label: string; tone: string }> = {
  healthy: { symbol: "●", label: "healthy", tone: "ok" },
  recovering: { symbol: "◐", label: "recovering", tone: "warn" },
  unhealthy: { symbol: "✖", label: "down", tone: "bad" },
  unknown: { symbol: "?", label: "unknown", tone: "idle" },
  draining: { symbol: "⇣", label: "draining", tone: "info" },
  disabled: { symbol: "⊘", label: "disabled", tone: "idle" },
};

export function ms(v: number | null | undefined): string {
  if (v === null || v === undefined) return "–";
  return v >= 1000 ? `${(v / 1000).toFixed(2)} s` : `${Math.round(v)} ms`;
}

export function bytes(n: number | null | undefined): string {
  if (!n) return "0";
  const u = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  let v = n;
  while (v >= 1024 && i < u.length - 1) {
    v /= 1024;
    i++;
  }
  return `${v.toFixed(v >= 10 || i === 0 ? 0 : 1)} ${u[i]}`;
}
