// The request log, from the broker's store.

import { call } from "./client";
import type { RequestsPage, RequestsQuery } from "./types";

/** `GET /admin/requests?since=&node=&category=&status=&limit=`: newest first. */
export function listRequests(q: RequestsQuery = {}): Promise<RequestsPage> {
  return call<RequestsPage>("GET", "/admin/requests", { query: { ...q } });
}
