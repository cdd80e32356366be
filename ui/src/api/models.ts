// Models on the nodes: pulling one onto some or all of them, with each node's progress.

import { callLines } from "./client";
import type { PullLine } from "./types";

/**
 * `POST /admin/models/pull`: pull `name` onto `nodes` (every serving node when empty), calling
 * `onLine` for each NDJSON progress line as it arrives. Resolves when the stream ends.
 */
export function pullModel(name: string, nodes: string[], onLine: (line: PullLine) => void): Promise<void> {
  return callLines<PullLine>("POST", "/admin/models/pull", { json: { name, nodes } }, onLine);
}
