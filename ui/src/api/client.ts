// The one place the UI touches the network. Every admin call goes through `call` (JSON),
// `callText` (TOML, SVG, plain text) or `callLines` (NDJSON streams); the event stream gets its
// URL from `streamUrl`. Screens never see a path: they call the typed functions beside this file.
//
// The token comes from the URL fragment (`#token=...`, which never reaches a server) once, then
// lives in sessionStorage. It goes out as `Authorization: Bearer`, except to `EventSource`,
// which cannot set headers and sends it as `?token=` (the broker accepts both).

import type { ErrorBody } from "./types";

/** The admin API is the origin that served the UI (`corral serve`, or the desktop window's). */
const BASE = "";

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

let token = readToken();

export function getToken(): string {
  return token;
}

export function setToken(t: string) {
  token = t.trim();
  sessionStorage.setItem(KEY, token);
}

/** What the UI does when the broker refuses the token (401 from any admin call). */
let rejected: ((why: string) => void) | null = null;

/** Called once per refusal: the token is forgotten first, so the app can ask for another. */
export function onTokenRejected(f: (why: string) => void) {
  rejected = f;
}

/** The sentence shown above the token form after a refusal. */
export const TOKEN_REFUSED = "This token was not accepted — paste the one `corral serve` printed.";

function refused() {
  const had = token !== "";
  token = "";
  sessionStorage.removeItem(KEY);
  if (had) rejected?.(TOKEN_REFUSED);
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
    this.name = "ApiError";
  }
}

/** One path segment (a node, category, provider or secret name), escaped. */
export function seg(name: string): string {
  return encodeURIComponent(name);
}

export type Query = Record<string, string | number | boolean | null | undefined>;

/** `?a=1&b=2` from the set values of `q` (empty strings, null and undefined are left out). */
function search(q?: Query): string {
  if (!q) return "";
  const p = new URLSearchParams();
  for (const [k, v] of Object.entries(q)) {
    if (v === undefined || v === null || v === "") continue;
    p.set(k, String(v));
  }
  const s = p.toString();
  return s ? `?${s}` : "";
}

export type Method = "GET" | "POST" | "PUT" | "PATCH" | "DELETE";

export interface CallOptions {
  query?: Query;
  /** Sent as JSON. */
  json?: unknown;
  /** Sent as text/plain (config TOML, a secret's value). */
  text?: string;
  /** Aborts the call (and, for a stream, closes it: the server sees the client go away). */
  signal?: AbortSignal;
}

async function send(method: Method, path: string, opts: CallOptions): Promise<Response> {
  // Without a token every admin call would be refused: ask for one instead of calling.
  if (!token) throw new ApiError(401, "no admin token: sign in with the one `corral serve` printed", "unauthorized");
  const r = await fetchWith(method, path, opts);
  if (r.status === 401) refused();
  return r;
}

function fetchWith(method: Method, path: string, opts: CallOptions): Promise<Response> {
  const headers: Record<string, string> = { Authorization: `Bearer ${token}` };
  let body: BodyInit | undefined;
  if (opts.text !== undefined) {
    body = opts.text;
    headers["Content-Type"] = "text/plain";
  } else if (opts.json !== undefined) {
    body = JSON.stringify(opts.json);
    headers["Content-Type"] = "application/json";
  }
  return fetch(BASE + path + search(opts.query), { method, headers, body, signal: opts.signal });
}

/** The error a failed answer carries: the server's `{error, code, problems}` when it sent one. */
async function failure(r: Response): Promise<ApiError> {
  const text = await r.text().catch(() => "");
  let body: Partial<ErrorBody> | undefined;
  try {
    body = text ? JSON.parse(text) : undefined;
  } catch {
    body = undefined;
  }
  return new ApiError(r.status, body?.error ?? (text || r.statusText), body?.code ?? "", body?.problems ?? []);
}

/** A JSON answer (`undefined` for an empty one, like 204 No Content). */
export async function call<T>(method: Method, path: string, opts: CallOptions = {}): Promise<T> {
  const r = await send(method, path, opts);
  if (!r.ok) throw await failure(r);
  const text = await r.text();
  return (text ? JSON.parse(text) : undefined) as T;
}

/** A text answer, as sent (TOML, SVG, OpenMetrics). */
export async function callText(method: Method, path: string, opts: CallOptions = {}): Promise<string> {
  const r = await send(method, path, opts);
  if (!r.ok) throw await failure(r);
  return r.text();
}

/** A streamed NDJSON answer, handed over line by line as it arrives. */
export async function callLines<T>(method: Method, path: string, opts: CallOptions, onLine: (v: T) => void): Promise<void> {
  const r = await send(method, path, opts);
  if (!r.ok) throw await failure(r);
  if (!r.body) throw new ApiError(r.status, "the answer has no body", "");
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
      if (line) onLine(JSON.parse(line) as T);
    }
  }
  if (buf.trim()) onLine(JSON.parse(buf) as T);
}

/** The URL of a GET stream for clients that cannot set headers (`EventSource`): token in the query. */
export function streamUrl(path: string, q?: Query): string {
  return BASE + path + search({ ...q, token });
}
