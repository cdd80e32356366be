// Nodes: the Ollama (or OpenAI-compatible) servers behind the broker. Adding, editing and
// removing one goes draft -> validate -> swap on the server; draining is a runtime action.

import { call, seg } from "./client";
import type { DrillAsk, DrillReport, Node, NodeConfig, NodePatch, NodeTest } from "./types";

/** `GET /admin/nodes`. */
export function listNodes(): Promise<Node[]> {
  return call<Node[]>("GET", "/admin/nodes");
}

/** `GET /admin/nodes/{name}`. */
export function getNode(name: string): Promise<Node> {
  return call<Node>("GET", `/admin/nodes/${seg(name)}`);
}

/** `POST /admin/nodes`: the node as it now runs (409 `conflict` if the name is taken). */
export function addNode(node: NodeConfig): Promise<Node> {
  return call<Node>("POST", "/admin/nodes", { json: node });
}

/** `PATCH /admin/nodes/{name}`: enable, drain, reweight; answers the node after the change. */
export function patchNode(name: string, patch: NodePatch): Promise<Node> {
  return call<Node>("PATCH", `/admin/nodes/${seg(name)}`, { json: patch });
}

/** `DELETE /admin/nodes/{name}`: requests running on it finish first. */
export function deleteNode(name: string): Promise<void> {
  return call<void>("DELETE", `/admin/nodes/${seg(name)}`);
}

/** `POST /admin/nodes/{name}/test`: one timed liveness probe, or with `model` its time to first token. */
export function testNode(name: string, model?: string): Promise<NodeTest> {
  return call<NodeTest>("POST", `/admin/nodes/${seg(name)}/test`, model ? { json: { model } } : {});
}

/** `POST /admin/drill`: take a node out, send a small batch per category, put it back; what
 * clients saw. 409 `drill_running` while another drill runs. */
export function drill(ask: DrillAsk = {}): Promise<DrillReport> {
  return call<DrillReport>("POST", "/admin/drill", { json: ask });
}
