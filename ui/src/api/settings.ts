// Settings: listeners, the admin address, probes, breaker, queue, retry and retention, and
// client keys. Changes are validated as a whole and written into the config file; keys bound at
// start (addresses, retention) answer in `restart_needed` instead of pretending to apply.

import { call, seg } from "./client";

export interface ListenerSettings {
  addr: string;
  origin: "local" | "remote";
  allowed_origins: string[];
  api_keys: string[];
  /** The URL this listener is bound to now (null when it is not bound yet). */
  bound: string | null;
  /** Not loopback: reachable from other machines. */
  exposed: boolean;
}

export type Section = Record<string, number | string | boolean | string[] | null>;

export interface ClientKeyInfo {
  name: string;
  /** Listener indexes that ask for this key. */
  listeners: number[];
  /** Whether its value is in the keyring (null when the keyring could not be read). */
  stored: boolean | null;
  /** Unix ms of its last use since the broker started. */
  last_used: number | null;
  /** A fleet key: its verifier is in the fleet's database (works on every broker). */
  fleet?: boolean;
  /** In a fleet: its use summed over every broker. */
  usage?: { requests: number; prompt_tokens: number; output_tokens: number };
  /** Its `[[quotas]]` window, once it has one. */
  quota?: {
    used: { requests: number; tokens: number };
    requests: number;
    tokens: number;
    window_s: number;
    window_ends_s: number;
  } | null;
}

export interface Settings {
  /** The config file edits go to; null without one. */
  file: string | null;
  listeners: ListenerSettings[];
  admin: { addr: string; exposed: boolean };
  health: Section;
  breaker: Section;
  queue: Section;
  retry: Section;
  store: Section;
  pending_restart: string[];
  client_keys: { keys: ClientKeyInfo[]; keyring_error: string | null; fleet_error?: string | null };
  /** On a PUT's answer. */
  saved_to?: string | null;
  restart_needed?: string[];
}

export interface SettingsPatch {
  listeners?: { addr?: string; origin?: "local" | "remote"; allowed_origins?: string[] }[];
  admin?: { addr?: string };
  health?: Section;
  breaker?: Section;
  queue?: Section;
  retry?: Section;
  store?: Section;
}

export interface NewClientKey {
  name: string;
  /** The key itself: shown once, never again. */
  key: string;
  listeners: number[];
  saved_to: string | null;
  restart_needed: boolean;
}

/** `GET /admin/settings`. */
export function getSettings(): Promise<Settings> {
  return call<Settings>("GET", "/admin/settings");
}

/** `PUT /admin/settings`: any subset of sections and keys; answers the settings after it. */
export function saveSettings(patch: SettingsPatch): Promise<Settings> {
  return call<Settings>("PUT", "/admin/settings", { json: patch });
}

/** `POST /admin/client-keys`: a new key for the listeners given (default: all). */
export function createClientKey(name: string, listeners?: number[]): Promise<NewClientKey> {
  return call<NewClientKey>("POST", "/admin/client-keys", { json: listeners ? { name, listeners } : { name } });
}

/** `DELETE /admin/client-keys/{name}`: the key stops working within a second. */
export function revokeClientKey(name: string): Promise<{ name: string; revoked: boolean; kept_on: number[] }> {
  return call("DELETE", `/admin/client-keys/${seg(name)}`);
}
