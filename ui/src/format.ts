// How values look on screen: a node state's symbol, label and colour; why and since when;
// durations; byte sizes.

import type { Node, NodeState } from "./api";

export interface StateLook {
  symbol: string;
  label: string;
  /** The CSS tone class: ok, warn, bad, info, idle. */
  tone: string;
}

export const STATES: Record<NodeState, StateLook> = {
  healthy: { symbol: "●", label: "healthy", tone: "ok" },
  recovering: { symbol: "◐", label: "recovering", tone: "warn" },
  unhealthy: { symbol: "✖", label: "down", tone: "bad" },
  unknown: { symbol: "?", label: "unknown", tone: "idle" },
  draining: { symbol: "⇣", label: "draining", tone: "info" },
  disabled: { symbol: "⊘", label: "disabled", tone: "idle" },
};

/** A node state's look; unknown for a state this UI does not know yet. */
export function stateLook(state: string): StateLook {
  return STATES[state as NodeState] ?? STATES.unknown;
}

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

/** How long, as people say it: "45 s", "3 min", "2 h 5 min", "3 d 4 h" (as `corral status`). */
export function duration(msLong: number): string {
  const s = Math.max(0, Math.floor(msLong / 1000));
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min`;
  if (s < 86400) return s % 3600 < 60 ? `${Math.floor(s / 3600)} h` : `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
  return `${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`;
}

/** A wall time in the viewer's zone: "05:49", with the date when not today. */
export function clock(unixMs: number): string {
  const t = new Date(unixMs);
  const hm = t.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", hour12: false });
  return t.toDateString() === new Date().toDateString() ? hm : `${t.toLocaleDateString()} ${hm}`;
}

/** The server's "now" for a node answer: ages are taken on its clock, never the browser's. */
function serverNow(n: Node): number {
  return n.state_since + n.state_for_ms;
}

/** "down since 05:49 (3 min)". */
export function since(n: Node): string {
  return `${stateLook(n.state).label} since ${clock(n.state_since)} (${duration(n.state_for_ms)})`;
}

/** "3 min ago" for a time the node reported something, on the server's clock. */
export function ago(n: Node, unixMs: number | null | undefined): string {
  return unixMs ? `${duration(serverNow(n) - unixMs)} ago` : "at an unknown time";
}

/** Whether a node could take a request now (unknown is routable: a fresh broker serves at once). */
export function serving(n: Pick<Node, "state">): boolean {
  return n.state === "healthy" || n.state === "recovering" || n.state === "unknown";
}
