// Safety rails: the UI asks before an operator takes the last serving node out (the admin API
// itself still does what it is told, so scripts keep working), and says loudly when nothing can
// serve or the broker is paused. `ask` opens the page's one confirmation dialog (Confirm.svelte)
// and resolves with the answer.

import type { Node } from "../api";
import { serving, stateLook } from "../format";

export const dialog = $state({
  open: false,
  title: "",
  message: "",
  /** The label of the button that goes ahead. */
  action: "",
  resolve: null as ((ok: boolean) => void) | null,
});

/** Open the confirmation dialog; true when the person goes ahead. */
export function ask(title: string, message: string, action: string): Promise<boolean> {
  dialog.resolve?.(false);
  return new Promise((resolve) => {
    Object.assign(dialog, { open: true, title, message, action, resolve });
  });
}

export function answer(ok: boolean) {
  const r = dialog.resolve;
  Object.assign(dialog, { open: false, resolve: null });
  r?.(ok);
}

/** Whether `name` is the only node that can serve now. */
export function lastServing(nodes: Node[], name: string): boolean {
  const n = nodes.find((x) => x.name === name);
  return !!n && serving(n) && !nodes.some((o) => o.name !== name && serving(o));
}

/** Before disabling or draining `name`: asks when it is the last serving node; true to go ahead. */
export async function confirmTakeOut(nodes: Node[], name: string, verb: "disable" | "drain"): Promise<boolean> {
  if (!lastServing(nodes, name)) return true;
  const others = nodes.filter((o) => o.name !== name).map((o) => `${o.name} is ${stateLook(o.state).label}`);
  const rest = others.length ? ` (${others.join(", ")})` : "";
  return ask(
    `${verb === "disable" ? "Disable" : "Drain"} ${name}, the last serving node?`,
    `No other node can serve${rest}. New requests will wait in the queue and then get 503 until a node is back.`,
    verb === "disable" ? "Disable anyway" : "Drain anyway",
  );
}
