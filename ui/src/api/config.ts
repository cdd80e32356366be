// The whole setup as one TOML file: export it for the team, import someone's (merge or replace),
// with a dry run that previews what would change.

import { call, callText } from "./client";
import type { ImportMode, ImportResult } from "./types";

/** `GET /admin/config/export`: TOML; providers name their keyring entry, never a key. */
export function exportConfig(): Promise<string> {
  return callText("GET", "/admin/config/export");
}

/**
 * `POST /admin/config/import?mode=...&dry_run=...`: the changes and the keys needed; unless a
 * dry run, also the swap. A file that would not validate fails with its `problems`. Trust
 * changes apply only when their ids are in `accept`; the answer lists those `held_back`.
 */
export function importConfig(
  toml: string,
  mode: ImportMode,
  opts: { dryRun?: boolean; accept?: string[] } = {},
): Promise<ImportResult> {
  const accept = opts.accept?.length ? opts.accept.join(",") : undefined;
  return call<ImportResult>("POST", "/admin/config/import", {
    query: { mode, dry_run: opts.dryRun ? true : undefined, accept },
    text: toml,
  });
}

/** `POST /admin/config/save`: with no config file yet, write the running config as this machine's. */
export function saveAsMyConfig(): Promise<{ saved_to: string; new: boolean }> {
  return call("POST", "/admin/config/save");
}
