// The request log, from the broker's store.

import { call, seg } from "./client";
import type { RequestDetail, RequestsPage, RequestsQuery, RequestsSummary, SummaryBy } from "./types";

/** `GET /admin/requests?since=&node=&category=&status=&model=&id=&before=&limit=`: one page,
 * newest first, with how many match in all and where the next page starts. */
export function listRequests(q: RequestsQuery = {}): Promise<RequestsPage> {
  return call<RequestsPage>("GET", "/admin/requests", { query: { ...q } });
}

/** `GET /admin/requests/{id}`: one request with every attempt in order. */
export function getRequest(id: string): Promise<RequestDetail> {
  return call<RequestDetail>("GET", `/admin/requests/${seg(id)}`);
}

/** `GET /admin/requests/summary?range=1h&by=model|node`: per model or node over a range. */
export function requestsSummary(range: string, by: SummaryBy): Promise<RequestsSummary> {
  return call<RequestsSummary>("GET", "/admin/requests/summary", { query: { range, by } });
}
