// Unsaved drafts: a screen that holds one registers a guard; leaving the screen (the nav) or
// the page (reload, close) asks first instead of losing the draft silently.

const guards = new Set<() => string | null>();

/** Register `why` (a sentence while there is a draft, else null); returns the unregister. */
export function guardLeaving(why: () => string | null): () => void {
  guards.add(why);
  return () => guards.delete(why);
}

/** The first reason not to leave, if any screen has a draft. */
export function draftWarning(): string | null {
  for (const g of guards) {
    const w = g();
    if (w) return w;
  }
  return null;
}

/** Whether the person agrees to leave (asked only when there is a draft). */
export function mayLeave(): boolean {
  const w = draftWarning();
  return !w || confirm(w);
}

addEventListener("beforeunload", (e) => {
  if (draftWarning()) e.preventDefault();
});
