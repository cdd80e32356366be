// The broker as a whole: live status, the pause switch, and the self-descriptions
// (`/help` for people and agents, `/metrics` for Prometheus).

import { call, callText } from "./client";
import type { Accepting, Status } from "./types";

/** `GET /admin/status`: nodes, recent stats, queue, categories, reloads, fallback share. */
export function getStatus(): Promise<Status> {
  return call<Status>("GET", "/admin/status");
}

/** `GET /admin/accepting`: whether new requests are taken (false: paused, they get 503). */
export function getAccepting(): Promise<Accepting> {
  return call<Accepting>("GET", "/admin/accepting");
}

/** `PUT /admin/accepting`: pause (false) or resume (true); running requests finish either way. */
export function setAccepting(accepting: boolean): Promise<Accepting> {
  return call<Accepting>("PUT", "/admin/accepting", { json: { accepting } });
}

/** `GET /help`: the broker's self-description (endpoints, headers, rules, limits). */
export function getHelp(): Promise<Record<string, unknown>> {
  return call<Record<string, unknown>>("GET", "/help");
}

/** `GET /metrics`: OpenMetrics text. */
export function getMetrics(): Promise<string> {
  return callText("GET", "/metrics");
}
