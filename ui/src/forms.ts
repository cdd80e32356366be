// Forms bound both ways: what the broker refused becomes a sentence under the field it is
// about, in words a person uses ("Weight must be greater than 0."), never a config path like
// `nodes[1].weight`. The admin API sends each problem as "path: message" (see
// src/config/validate.rs); this is the one place that turns them into per-field sentences.

import type { ApiError } from "./api";

/** What each config key is called on screen. */
const LABELS: Record<string, string> = {
  weight: "Weight",
  name: "The name",
  order: "The order",
  queue_timeout_ms: "The queue timeout",
  first_token_timeout_ms: "The first-token timeout",
  stream_idle_timeout_ms: "The stream idle timeout",
  providers: "Providers",
  models: "Model patterns",
  max_concurrency: "Max concurrency",
  addr: "The address",
  allowed_origins: "Allowed origins",
  interval_ms: "The probe interval",
  timeout_ms: "The probe timeout",
  failures_to_down: "Failures to mark down",
  successes_to_up: "Successes to bring back",
  deep_interval_ms: "The model scan interval",
  slow_start_ms: "Slow start",
  failures_to_open: "Failures to trip",
  cooldown_ms: "The cooldown",
  trial_requests: "Trial requests",
  max_requests: "Most waiting requests",
  max_bytes: "Most waiting bytes",
  remote_share: "The remote share",
  remote_max_wait_ms: "The longest remote wait",
  max_model_ops: "Most model operations",
  max_attempts: "Attempts",
  backoff_base_ms: "The first backoff",
  backoff_cap_ms: "The longest backoff",
  budget_ratio: "The retry budget",
  budget_min_per_sec: "Retries always allowed",
  max_age_days: "The longest kept",
  max_rows: "Most records kept",
  retention_interval_ms: "The clean-up interval",
};

/** The last key of a path: `nodes[1].weight` -> `weight`, `listeners[0].allowed_origins[2]` -> `allowed_origins`. */
export function keyOf(path: string): string {
  const parts = path.replace(/\[\d+\]/g, "").split(".");
  return parts[parts.length - 1] ?? path;
}

/** The label of a key, lower-cased for use mid-sentence. */
function inline(key: string): string {
  const l = LABELS[key] ?? key.replace(/_/g, " ");
  return l.startsWith("The ") ? "the " + l.slice(4) : l.toLowerCase();
}

/** "must be greater than 0" about `weight` -> "Weight must be greater than 0." */
export function sentence(key: string, message: string): string {
  const label = LABELS[key] ?? key.replace(/_/g, " ").replace(/^./, (c) => c.toUpperCase());
  // Paths inside the message (`retry.backoff_base_ms`) read as their labels too.
  const words = message.replace(/\b[a-z_]+(?:\[\d+\])?\.([a-z_]+)\b/g, (_m, k) => inline(k));
  const joined = /^(must|is|may|are|has|cannot|should)\b/.test(words) ? `${label} ${words}` : `${label}: ${words}`;
  return /[.!?]$/.test(joined) ? joined : `${joined}.`;
}

export interface FieldProblem {
  /** The config path the broker named (`health.interval_ms`, `listeners[0].addr`). */
  path: string;
  key: string;
  sentence: string;
}

/** Each problem of a refused change, as a sentence about its field. */
export function fieldProblems(e: unknown): FieldProblem[] {
  const problems: string[] = (e as ApiError)?.problems ?? [];
  return problems.map((p) => {
    const m = /^([a-z_]+(?:\[\d+\])?(?:\.[a-z_]+(?:\[\d+\])?)*): (.*)$/s.exec(p);
    if (!m) return { path: "", key: "", sentence: p };
    const key = keyOf(m[1]);
    return { path: m[1], key, sentence: sentence(key, m[2]) };
  });
}

/** The sentence for one field of a refused change: its own problem, else the error in words. */
export function problemFor(e: unknown, key: string): string {
  const mine = fieldProblems(e).find((p) => p.key === key);
  if (mine) return mine.sentence;
  const err = e as ApiError;
  if (err?.code === "malformed_json") return sentence(key, "must be a whole number of 1 or more");
  return err?.message ?? String(e);
}
