// The broker's one event stream (Server-Sent Events): what changed (a node's state, a finished
// request, a config reload, the cloud share crossing its alert). The UI then re-fetches what it
// shows: push, then pull.

import { streamUrl } from "./client";
import type { BrokerEvent, EventKind } from "./types";

const KINDS: readonly EventKind[] = ["node_state", "request", "config_reload", "fallback_share"];

export interface EventHandlers {
  /** `data` is null when an event's payload was not JSON. */
  onEvent: (kind: EventKind, data: BrokerEvent | null) => void;
  onOpen?: () => void;
  /** The connection dropped; the browser reconnects by itself. */
  onError?: () => void;
}

export interface Subscription {
  close(): void;
}

/** `GET /admin/events` (token in the query: `EventSource` cannot send headers). */
export function subscribeEvents(h: EventHandlers): Subscription {
  const es = new EventSource(streamUrl("/admin/events"));
  for (const kind of KINDS) {
    es.addEventListener(kind, (e) => {
      let data: BrokerEvent | null = null;
      try {
        data = JSON.parse((e as MessageEvent).data);
      } catch {
        data = null;
      }
      h.onEvent(kind, data);
    });
  }
  if (h.onOpen) es.onopen = h.onOpen;
  if (h.onError) es.onerror = h.onError;
  return { close: () => es.close() };
}
