// Charts of the recent past, drawn by the broker as SVG from its store.

import { callText, seg } from "./client";
import type { ChartName, ChartParams } from "./types";

export const CHARTS: readonly ChartName[] = ["latency", "ttfb", "throughput", "outcomes", "queue", "health"];

/** `GET /admin/charts/{name}.svg?window=&width=&height=`: the SVG text, to inline. */
export function chartSvg(name: ChartName, params: ChartParams = {}): Promise<string> {
  return callText("GET", `/admin/charts/${seg(name)}.svg`, { query: { ...params } });
}
