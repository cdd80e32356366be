// How values look on screen: a node state's symbol, label and colour; durations; byte sizes.

import type { NodeState } from "./api";

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
