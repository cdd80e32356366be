// How the live charts look: colours (the same as the report's, src/charts/draw.rs), the value
// formats, time ticks and tidy y scales. No network here: Charts.svelte fetches, the chart
// components draw.

/** Node colours by a node's index in the series' `nodes`; no green or red, which say health. */
export const NODE_COLORS = ["#1f77b4", "#ff7f0e", "#9467bd", "#17becf", "#e377c2", "#8c564b", "#bcbd22", "#7f7f7f"];

/** The cluster-wide line. */
export const CLUSTER = { key: "cluster", label: "all nodes", color: "#1d2321" };

/** Node states, in legend order, with the UI's tone colours (app.css). */
export const STATE_COLORS: { state: string; label: string; color: string }[] = [
  { state: "healthy", label: "healthy", color: "#2f7d4f" },
  { state: "recovering", label: "recovering", color: "#b7791f" },
  { state: "unhealthy", label: "down", color: "#c0392b" },
  { state: "draining", label: "draining", color: "#2b6cb0" },
  { state: "disabled", label: "disabled", color: "#8a948e" },
  { state: "unknown", label: "unknown", color: "#c9d1cc" },
];

export function stateColor(state: string): string {
  return (STATE_COLORS.find((s) => s.state === state) ?? STATE_COLORS[STATE_COLORS.length - 1]).color;
}

export function stateLabel(state: string): string {
  return STATE_COLORS.find((s) => s.state === state)?.label ?? state;
}

/** Outcomes, in the broker's order (src/charts.rs OUTCOMES), with their colours and words. */
export const OUTCOME_COLORS: Record<string, { label: string; color: string }> = {
  ok: { label: "ok", color: "#2f7d4f" },
  fallback: { label: "cloud fallback", color: "#2b6cb0" },
  client_error: { label: "client error", color: "#b7791f" },
  error: { label: "error", color: "#c0392b" },
  interrupted: { label: "interrupted", color: "#8e44ad" },
  cancelled: { label: "cancelled", color: "#8a948e" },
  unknown: { label: "unknown", color: "#6b756f" },
};

export function nodeColor(nodes: string[], name: string): string {
  const i = nodes.indexOf(name);
  return NODE_COLORS[(i < 0 ? 0 : i) % NODE_COLORS.length];
}

/** One line to draw. `key` is what a legend toggle hides (a node's name, `cluster`, an outcome). */
export interface Line {
  key: string;
  label: string;
  color: string;
  values: (number | null)[];
  dashed?: boolean;
}

/** One legend entry. */
export interface Entry {
  key: string;
  label: string;
  color: string;
}

/** A range as people say it: "15 min", "1 h". */
export function rangeWords(range: string): string {
  return range.replace(/m$/, " min").replace(/h$/, " h");
}

/** A wall time, "05:49" or, with seconds, "05:49:30". */
export function hhmm(t: number, seconds = false): string {
  return new Date(t).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: seconds ? "2-digit" : undefined, hour12: false });
}

/** Time ticks at a round interval, at most about `most` of them. */
export function timeTicks(from: number, to: number, most = 6): number[] {
  const steps = [10e3, 30e3, 60e3, 120e3, 300e3, 600e3, 900e3, 1800e3, 3600e3, 7200e3, 10800e3, 21600e3];
  const span = Math.max(1, to - from);
  const step = steps.find((s) => span / s <= most) ?? steps[steps.length - 1];
  const out: number[] = [];
  for (let t = Math.ceil(from / step) * step; t <= to && out.length < 50; t += step) out.push(t);
  return out;
}

/** A tidy top for a y axis (steps of 1, 2 or 5 times a power of ten, about `ticks` of them;
 * whole steps for counts) and its ticks. */
export function yScale(max: number, whole = false, ticks = 4): { top: number; ticks: number[] } {
  if (!(max > 0)) return whole ? { top: 1, ticks: [0, 1] } : { top: 1, ticks: [0, 0.5, 1] };
  const raw = max / ticks;
  const p = Math.pow(10, Math.floor(Math.log10(raw)));
  // Counts step by whole numbers.
  const step = Math.max(whole ? 1 : 0, ([1, 2, 5, 10].find((m) => m * p >= raw) ?? 10) * p);
  const top = step * Math.ceil(max / step);
  const out: number[] = [];
  for (let v = 0; v <= top + step / 2; v += step) out.push(v);
  return { top, ticks: out };
}

/** Consecutive buckets with a value: each run is a list of [index, value]. */
export function runs(values: (number | null)[]): [number, number][][] {
  const out: [number, number][][] = [];
  let cur: [number, number][] = [];
  values.forEach((v, i) => {
    if (v === null || v === undefined) {
      if (cur.length) out.push(cur);
      cur = [];
    } else cur.push([i, v]);
  });
  if (cur.length) out.push(cur);
  return out;
}

export const fmt = {
  ms(v: number): string {
    return v >= 1000 ? `${(v / 1000).toFixed(2)} s` : `${Math.round(v)} ms`;
  },
  rate(v: number): string {
    return v >= 100 || v === 0 ? v.toFixed(0) : v.toFixed(1);
  },
  count(v: number): string {
    return Number.isInteger(v) ? String(v) : v.toFixed(1);
  },
};
