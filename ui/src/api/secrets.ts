// API keys in the operating system's keyring. Values go in and never come back out.

import { call, seg } from "./client";
import type { Secrets } from "./types";

/** `GET /admin/secrets`: stored names, and whether each secret the config names is set. */
export function listSecrets(): Promise<Secrets> {
  return call<Secrets>("GET", "/admin/secrets");
}

/** `PUT /admin/secrets/{name}`: store `value` (sent as plain text). */
export function setSecret(name: string, value: string): Promise<void> {
  return call<void>("PUT", `/admin/secrets/${seg(name)}`, { text: value });
}

/** `DELETE /admin/secrets/{name}`. */
export function deleteSecret(name: string): Promise<void> {
  return call<void>("DELETE", `/admin/secrets/${seg(name)}`);
}

/** `POST /admin/secrets/{name}/bind`: a person confirms the key may go to `provider`'s origin. */
export function bindSecret(name: string, provider: string): Promise<{ name: string; bound: string; origins: string[] }> {
  return call("POST", `/admin/secrets/${seg(name)}/bind`, { json: { provider } });
}
