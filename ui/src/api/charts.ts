// Charts of the recent past: the bucketed numbers the live charts draw, and the same charts
// drawn by the broker as SVG (what `corral report` draws too).

import { call, callText, seg } from "./client";
import type { ChartName, ChartParams, ChartRange, ChartSeries } from "./types";

export const CHARTS: readonly ChartName[] = ["latency", "ttfb", "throughput", "outcomes", "queue", "health"];

export const RANGES: readonly ChartRange[] = ["5m", "15m", "1h", "24h"];

/** `GET /admin/charts/series?range=`: every chart's numbers per bucket, per node and cluster-wide. */
export function chartSeries(range: ChartRange): Promise<ChartSeries> {
  return call<ChartSeries>("GET", "/admin/charts/series", { query: { range } });
}

/** `GET /admin/charts/{name}.svg?window=&width=&height=`: the SVG text, to inline. */
export function chartSvg(name: ChartName, params: ChartParams = {}): Promise<string> {
  return callText("GET", `/admin/charts/${seg(name)}.svg`, { query: { ...params } });
}
