// Models on the nodes: the node x model matrix, pulling (with each node's progress, cancelled by
// aborting), deleting and copying; and the latency test (time to first token, or a ping).

import { call, callLines } from "./client";
import type { Latency, LatencyAsk, LatencyList, ModelMatrix, ModelOpAnswer, PullLine } from "./types";

/** `GET /admin/models`: which node has which model (size, family, quantisation, digest), loaded or on disk. */
export function listModels(): Promise<ModelMatrix> {
  return call<ModelMatrix>("GET", "/admin/models");
}

/**
 * `POST /admin/models/pull`: pull `name` onto `nodes` (every serving node when empty), calling
 * `onLine` for each NDJSON progress line as it arrives. Resolves when the stream ends; aborting
 * `signal` closes the stream, which cancels the pull on the nodes.
 */
export function pullModel(name: string, nodes: string[], onLine: (line: PullLine) => void, signal?: AbortSignal): Promise<void> {
  return callLines<PullLine>("POST", "/admin/models/pull", { json: { name, nodes }, signal }, onLine);
}

/** `POST /admin/models/delete`: Ollama's delete on each of `nodes`; a failure names each node and why. */
export function deleteModel(name: string, nodes: string[]): Promise<ModelOpAnswer> {
  return call<ModelOpAnswer>("POST", "/admin/models/delete", { json: { name, nodes } });
}

/** `POST /admin/models/copy`: Ollama's copy `source` -> `destination` on each of `nodes`. */
export function copyModel(source: string, destination: string, nodes: string[]): Promise<ModelOpAnswer> {
  return call<ModelOpAnswer>("POST", "/admin/models/copy", { json: { source, destination, nodes } });
}

/** `GET /admin/latency`: the last latency result per node and model, with when. */
export function listLatency(): Promise<LatencyList> {
  return call<LatencyList>("GET", "/admin/latency");
}

/** `POST /admin/latency`: time to first token of each model on each node (a ping without models). */
export function testLatency(ask: LatencyAsk): Promise<Latency[]> {
  return call<Latency[]>("POST", "/admin/latency", { json: ask });
}
