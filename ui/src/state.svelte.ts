// Live broker state shared by every screen: refreshed from the status endpoint whenever the
// event stream says something changed (at most a few times a second), and on a slow timer as a
// safety net.
import { getStatus, subscribeEvents, type Status, type Subscription } from "./api";

export const live = $state({
  status: null as Status | null,
  error: "",
  connected: false,
  /** Bumped when charts should be fetched again. */
  tick: 0,
  lastEvent: "",
});

let pending: ReturnType<typeof setTimeout> | null = null;

export async function refresh() {
  try {
    live.status = await getStatus();
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

let running: { sub: Subscription; timer: ReturnType<typeof setInterval> } | null = null;

/** Stop listening (the token was refused): no stream, no timer, until `start` again. */
export function stop() {
  running?.sub.close();
  if (running) clearInterval(running.timer);
  running = null;
  live.connected = false;
  live.status = null;
}

export function start(): Subscription {
  stop();
  refresh();
  const sub = subscribeEvents({
    onEvent(kind, data) {
      live.lastEvent = kind;
      soon();
      const now = Date.now();
      if (kind !== "request" || now - lastChart > 5000) {
        lastChart = now;
        live.tick++;
      }
      if (data?.type === "fallback_share") {
        live.lastEvent = data.above ? "fallback_share_high" : "fallback_share_normal";
      }
    },
    onOpen: () => (live.connected = true),
    onError: () => (live.connected = false),
  });
  running = { sub, timer: setInterval(refresh, 5000) };
  return sub;
}
