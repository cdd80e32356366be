// Live broker state shared by every screen: refreshed from /admin/status whenever the event
// stream says something changed (at most a few times a second), and on a slow timer as a
// safety net.
import { api, events } from "./api";

export const live = $state({
  status: null as any,
  error: "",
  connected: false,
  /** Bumped when charts should be fetched again. */
  tick: 0,
  lastEvent: "",
});

let pending: ReturnType<typeof setTimeout> | null = null;

export async function refresh() {
  try {
    live.status = await api("GET", "/admin/status");
    live.error = "";
  } catch (e: any) {
    live.error = e.message ?? String(e);
  }
}

function soon() {
  if (pending) return;
  pending = setTimeout(() => {
    pending = null;
    refresh();
  }, 250);
}

let lastChart = 0;

export function start() {
  refresh();
  const es = events((kind, data) => {
    live.lastEvent = kind;
    soon();
    const now = Date.now();
    if (kind !== "request" || now - lastChart > 5000) {
      lastChart = now;
      live.tick++;
    }
    if (kind === "fallback_share" && data) {
      live.lastEvent = data.above ? "fallback_share_high" : "fallback_share_normal";
    }
  });
  es.onopen = () => (live.connected = true);
  es.onerror = () => (live.connected = false);
  setInterval(refresh, 5000);
  return es;
}
