// The JSON shapes the admin API speaks, written from the Rust that makes them: `node_json` and
// the handlers in src/admin.rs, the Serialize types in src/node.rs, src/breaker.rs,
// src/config.rs, src/store.rs, src/telemetry.rs and src/reload.rs. `Option<T>` on the Rust
// side is `T | null` here; a field the server always sends is never optional.

// ---- nodes (src/node.rs, src/config.rs NodeConfig, admin.rs node_json) ----

/** `NodeKind`, kebab-case. */
export type NodeKind = "ollama" | "openai";

/** `NodeState`: the one state a person sees for a node. */
export type NodeState = "unknown" | "healthy" | "unhealthy" | "recovering" | "draining" | "disabled";

/** `Health`: liveness as probes and passive signals see it. */
export type Health = "unknown" | "healthy" | "unhealthy";

/** `Admin`: what the operator asked of a node. */
export type AdminState = "active" | "draining" | "disabled";

/** `BreakerState`, kebab-case. */
export type BreakerState = "closed" | "open" | "half-open";

/** `LoadedModel`: a model a node reported as loaded in `/api/ps`. */
export interface LoadedModel {
  name: string;
  size: number;
  size_vram: number;
  context_length: number | null;
}

/** A running node, as `GET /admin/nodes`, `GET /admin/status` and the node routes answer it. */
export interface Node {
  name: string;
  url: string;
  kind: NodeKind;
  state: NodeState;
  /** Why the node is in its state: the concrete cause ("connection refused at http://...") or the operator's act. */
  state_reason: string;
  /** Since when (unix ms). */
  state_since: number;
  /** How long, as of this answer (ms): the server's clock, so no skew with the browser's. */
  state_for_ms: number;
  health: Health;
  admin: AdminState;
  breaker: BreakerState;
  weight: number;
  max_concurrency: number;
  in_flight: number;
  served: number;
  /** True while the node is down: `models`, `loaded` and `ttfb_ms` are then last-known, not live. */
  stale: boolean;
  /** Estimated time to first byte as of its last sample, ms (does not fade while idle); null before the node has answered. */
  ttfb_ms: number | null;
  /** Unix ms of the last time-to-first-byte sample. */
  ttfb_as_of: number | null;
  /** 0..1 while the node is in slow start, 1 after. */
  slow_start_share: number;
  /** The models the node lists; null until the first deep probe. */
  models: string[] | null;
  loaded: LoadedModel[];
  /** Unix ms of the `/api/ps` answer `loaded` comes from; null before the first. */
  loaded_as_of: number | null;
  /** Keeps missing first-token deadlines: tried after the other nodes, not failed. */
  slow?: boolean;
  first_token_misses?: number;
  /** The speed model per model, learned from finished answers; a field is null while unknown. */
  speed?: Record<string, Speed>;
}

/** `speed::Speed`: what the node's speed estimate for one model reads now. */
export interface Speed {
  prefill_tps: number | null;
  decode_tps: number | null;
  load_ms: number | null;
  typical_output_tokens: number | null;
  /** 0..1: 1 while fresh, falling towards 0 as the estimate goes stale. */
  confidence: number;
  samples: number;
}

/** `NodeConfig`: the body of `POST /admin/nodes` (omitted fields take the config defaults). */
export interface NodeConfig {
  name: string;
  url: string;
  kind?: NodeKind;
  weight?: number;
  max_concurrency?: number;
  enabled?: boolean;
}

/** `NodePatch`: the fields an operator may change on a running node. */
export interface NodePatch {
  enabled?: boolean;
  draining?: boolean;
  weight?: number;
  max_concurrency?: number;
}

/** `POST /admin/nodes/{name}/test`: one latency test (a ping, or with a model its time to first token). */
export interface NodeTest extends Latency {
  name: string;
}

// ---- drill (src/admin/drill.rs) ----

/** How a drill takes its node out: the runtime drain, or a 500 fault on a simulated node. */
export type DrillTakeOut = "drain" | "fault";

/** The body of `POST /admin/drill`; every field may be left out. */
export interface DrillAsk {
  /** Default: the busiest serving node. */
  node?: string;
  /** Default: every category. */
  category?: string;
  /** Requests per category, 1 to 20; default 3. */
  requests?: number;
  take_out?: DrillTakeOut;
}

/** One drill request as its client saw it. */
export interface DrillShot {
  category: string;
  n: number;
  model: string;
  /** HTTP status; null when no answer came at all. */
  status: number | null;
  /** The node that served it, or `cloud:<provider>`; null unless it was served. */
  served_by: string | null;
  fallback: string | null;
  degraded: string | null;
  attempts: number | null;
  ms: number;
  /** Corral's error code, `http_<status>`, `client_timeout` or `no_answer`. */
  code: string | null;
  error: string | null;
}

/** One category's drill requests, summed up; `skipped` says why a category sent none. */
export interface DrillCategory {
  category: string;
  sent: number;
  served: number;
  skipped?: string;
  model?: string;
  by?: Record<string, number>;
  p50_ms?: number | null;
  max_ms?: number | null;
  errors?: { code: string; count: number }[];
}

/** `POST /admin/drill`: what clients saw while the node was out. */
export interface DrillReport {
  node: string;
  taken_out: DrillTakeOut;
  /** The node's state after it was put back. */
  restored: NodeState;
  breaker: BreakerState;
  other_serving_nodes: number;
  /** Set when the node was the only serving one. */
  note: string | null;
  /** Set when putting the node back failed. */
  restore_error: string | null;
  took_ms: number;
  results: DrillShot[];
  per_category: DrillCategory[];
}

// ---- categories (src/config.rs CategoryConfig) ----

export type Policy = "round-robin" | "weighted" | "least-connections" | "least-latency" | "p2c" | "priority" | "sticky" | "fastest-finish";

/** `CloudPermission`, kebab-case. */
export type CloudPermission = "never" | "on-failure";

/** `CategoryConfig`: one request category's rules. */
export interface Category {
  name: string;
  policy: Policy;
  priority: number;
  queue_timeout_ms: number;
  cloud: CloudPermission;
  providers: string[];
  redact: boolean;
  models: string[];
  affinity: boolean;
  /** For `policy = "priority"`: node names, most preferred first. */
  order: string[];
  /** 0: off; else a node with no first token by then is given up on (nothing sent yet). */
  first_token_timeout_ms: number;
  /** Longest silence mid-stream before the stream ends with the error line. */
  stream_idle_timeout_ms: number;
  /** A broken stream is continued on another node as one answer. */
  continue_on_cut: boolean;
  /** With `redact`: most text one request may have redacted. */
  redact_max_bytes?: number;
}

// ---- providers and secrets (src/config.rs ProviderConfig, admin.rs list_providers) ----

/** `ProviderConfig`: an OpenAI-compatible endpoint categories may fall back to. */
export interface Provider {
  name: string;
  base_url: string;
  /** Keyring entry holding the API key; empty for a server that takes no key. */
  secret: string;
  model_map: Record<string, string>;
  connect_timeout_ms: number;
  first_byte_timeout_ms: number;
}

/** Whether a provider's key is in the keyring (`none`: the provider names no key). */
export type SecretState = "set" | "missing" | "unknown" | "none" | "unbound" | "wrong_purpose";

/** A provider as `GET /admin/providers` lists it: its config and whether its key is set. */
export interface ListedProvider extends Provider {
  secret_state: SecretState;
  /** `scheme://host:port` of `base_url`: where its key would be sent. */
  origin?: string | null;
  /** The origins its key is bound to (`unbound`: not this provider's). */
  bound_origins?: string[];
}

/** `POST /admin/providers/{name}/test`: one token asked of the provider with its key. */
export type ProviderTest =
  | { name: string; ok: true; ms: number; model: string }
  | { name: string; ok: false; ms: number; error: string };

/** `GET /admin/secrets`: stored names, and for each secret the config names, set or missing. */
export interface Secrets {
  stored: string[];
  needed: Record<string, "set" | "missing">;
}

// ---- status (admin.rs status and recent_stats) ----

/** Per node (and `cluster`, `cloud:<provider>`, `none`) over the last 15 minutes. */
export interface Stats {
  requests: number;
  errors: number;
  p50_ms: number | null;
  p95_ms: number | null;
  ttfb_p50_ms: number | null;
  tokens_per_s: number | null;
}

export interface Queue {
  depth: number;
  bytes: number;
  max_requests: number;
  max_bytes: number;
}

/** `ReloadStatus`: what the last config file reload did. */
export interface Reload {
  reloads: number;
  last_error: string | null;
  /** Keys changed in the config file that take effect only at the next restart. */
  pending_restart: string[];
}

export interface Fallback {
  /** Share of recent requests answered by a cloud provider, 0..1. */
  share: number;
  requests: number;
  window_ms: number;
  alert_share: number;
  providers: { name: string; base_url: string; secret: string }[];
}

/** `GET /admin/status`: everything the screens show live. */
export interface Status {
  nodes: Node[];
  /** Empty when the request store is disabled. */
  stats: Record<string, Stats>;
  queue: Queue;
  categories: Category[];
  reload: Reload;
  accepting: boolean;
  fallback: Fallback;
  /** Where to point clients, as bound. */
  connect: Connect;
}

/** `connect` in `/admin/status`: the proxy as clients should reach it. */
export interface Connect {
  ollama: string;
  openai: string;
  /** `OLLAMA_HOST=...`, for the ollama CLI and clients that read it. */
  env: string;
  listeners: string[];
  /** The nodes are simulated (`corral demo`). */
  demo: boolean;
  /** A first request, ready to paste: the official Python clients (ollama, openai) and curl. */
  snippets: { python: string; openai: string; curl: string };
  /** The file UI edits are written to; null: they last until the broker stops. */
  config_file: string | null;
}

/** `GET`/`PUT /admin/accepting`. */
export interface Accepting {
  accepting: boolean;
}

// ---- requests (src/store.rs RequestRow, admin.rs requests) ----

/** How a request ended, as the store records it (`running` until it ends; `unknown`: cut off by a crash). */
export type RequestStatus = "ok" | "client_error" | "error" | "interrupted" | "cancelled" | "unknown" | "running";

/** `RequestRow`: everything known when a request ends. Times are unix ms. */
export interface RequestRow {
  id: string;
  started_at: number;
  finished_at: number | null;
  endpoint: string;
  category: string;
  origin: string;
  model: string;
  node: string | null;
  attempts: number;
  /** The cloud provider that answered, if one did. */
  fallback: string | null;
  status: RequestStatus;
  http_status: number | null;
  error_code: string | null;
  queued_ms: number | null;
  ttfb_ms: number | null;
  total_ms: number | null;
  prompt_tokens: number | null;
  completion_tokens: number | null;
  streamed: boolean;
  interrupted: boolean;
  /** The `X-Request-Id` the client sent, if any. */
  client_request_id?: string | null;
  /** The model that answered, when it is not the one asked for (a cloud provider's). */
  answered_model?: string | null;
  /** The attempts that failed before the answer (or before giving up), in order. */
  failed_attempts?: FailedAttempt[];
  /** The node that continued the answer after its stream broke. */
  continued_by?: string | null;
  /** When the node was done (ms after arrival); before `total_ms` when a slow client was still reading. */
  node_done_ms?: number | null;
  /** fastest-finish's estimate of the time to the end (ms after arrival), when it chose the node. */
  estimate_ms?: number | null;
}

/** One attempt that did not answer (store `FailedAttempt`). */
export interface FailedAttempt {
  node: string;
  /** An outcome name: `failed`, `silent`, `busy`, `connect_failed`, `timed_out`... */
  outcome: string;
  detail: string;
}

/** Filters of `GET /admin/requests`; empty values are left out. */
export interface RequestsQuery {
  /** A duration back from now (`15m`, `2h`, `7d`, `30s`) or unix ms. */
  since?: string;
  node?: string;
  category?: string;
  status?: RequestStatus;
  /** The model asked for or the one that answered. */
  model?: string;
  /** A request id or its start: Corral's id or the client's `X-Request-Id`. */
  id?: string;
  /** `next_before` of the page before: the page after it. */
  before?: string;
  /** Rows per page (default 1000). */
  limit?: number;
}

export interface RequestsPage {
  /** Newest first. */
  requests: RequestRow[];
  /** Rows matching the filters on every page together. */
  total: number;
  /** Whether older rows match too. */
  more: boolean;
  /** Give it back as `before` for the next page; null on the last one. */
  next_before: string | null;
  /** The page size applied. */
  limit: number;
  /** Records the store had to drop because it fell behind. */
  dropped_records: number;
}

/** One try at answering a request (store `Attempt`), in the order they happened. */
export interface RequestAttempt {
  /** 1 for the first. */
  n: number;
  node: string | null;
  /** The cloud provider it went to. */
  provider: string | null;
  /** The model that answered, when it is not the one asked for. */
  model: string | null;
  /** An outcome name for a failed one, the request's status for the one that ended it, `cut` for a stream another node continued. */
  outcome: string;
  detail: string | null;
  http_status: number | null;
  error_code: string | null;
  ttfb_ms: number | null;
  total_ms: number | null;
}

/** `GET /admin/requests/{id}`. */
export interface RequestDetail {
  request: RequestRow;
  attempts: RequestAttempt[];
}

export type SummaryBy = "model" | "node";

/** Counts, errors, latency and tokens of one model or node (admin `Group`). */
export interface SummaryGroup {
  /** The model or node (`cloud:<provider>` for a provider); null when nothing answered. */
  key: string | null;
  requests: number;
  /** Neither `ok` nor `client_error`. */
  errors: number;
  client_errors: number;
  p50_ms: number | null;
  p95_ms: number | null;
  prompt_tokens: number;
  completion_tokens: number;
  tokens: number;
}

/** `GET /admin/requests/summary?range=&by=`: requests that started in the range and ended. */
export interface RequestsSummary {
  range: string;
  /** Unix ms the range starts at. */
  since: number;
  by: SummaryBy;
  /** The busiest first. */
  groups: SummaryGroup[];
  all: SummaryGroup;
}

// ---- charts (src/admin/charts.rs, src/charts.rs) ----

/** The ranges the live charts offer (`GET /admin/charts/series?range=`). */
export type ChartRange = "5m" | "15m" | "1h" | "24h";

/** A named line: one value per bucket, `null` where there is no data (drawn as a gap). */
export interface ChartLine {
  name: string;
  values: (number | null)[];
}

/** One measure for the whole cluster and per node. */
export interface ChartMetric {
  cluster: (number | null)[];
  nodes: ChartLine[];
}

/** A state a node held over `[from, to)` (unix ms). */
export interface HealthBand {
  from: number;
  to: number;
  state: string;
}

/** `GET /admin/charts/series`: every chart's numbers, bucketed (src/charts.rs `Snapshot`). */
export interface ChartSeries {
  range: ChartRange;
  ranges: ChartRange[];
  from_ms: number;
  /** The end of the data: now. */
  to_ms: number;
  bucket_ms: number;
  /** Each bucket's start; every `values` list is aligned to it. */
  buckets: number[];
  /** Every node named, sorted: a node's colour is its index here. */
  nodes: string[];
  /** Requests that ended in the window. */
  requests: number;
  latency_p50: ChartMetric;
  latency_p95: ChartMetric;
  ttfb_p50: ChartMetric;
  /** Output tokens / generation time, per bucket: total tokens / total generation seconds. */
  tokens_per_s: ChartMetric;
  /** Requests per bucket by outcome (ok, fallback, client_error, error, interrupted, ...). */
  outcomes: ChartLine[];
  /** The most requests waiting at once in each bucket. */
  queue_depth: (number | null)[];
  health: { node: string; bands: HealthBand[] }[];
}

export type ChartName = "latency" | "ttfb" | "throughput" | "outcomes" | "queue" | "health";

export interface ChartParams {
  /** How far back, like `15m` or `1h` (server default 15m). */
  window?: string;
  /** Pixels, clamped by the server to 200..4000 (default 640). */
  width?: number;
  /** Pixels, clamped by the server to 150..4000 (default 320). */
  height?: number;
}

// ---- config import (src/config.rs ImportMode, Change; admin.rs import_config) ----

export type ImportMode = "merge" | "replace";

/** One line of an import preview. */
export interface Change {
  action: "added" | "changed" | "removed";
  kind: "node" | "category" | "provider" | "section";
  name: string;
  /** Every changed field, old -> new, as TOML values. */
  fields: { field: string; old: string; new: string }[];
}

/** A change that moves trust (a URL, cloud permission, redaction, a key, where traffic goes). */
export interface TrustChange {
  id: string;
  kind: string;
  name: string;
  field: string;
  message: string;
  accepted: boolean;
}

export interface ImportResult {
  mode: ImportMode;
  dry_run: boolean;
  changes: Change[];
  /** Applied only when accepted by id; the others are `held_back`. */
  trust: TrustChange[];
  held_back: string[];
  notes: string[];
  /** Keyring entries the resulting config names. */
  secrets_needed: string[];
}

// ---- model pull (src/proxy/fanout.rs model_op) ----

/**
 * One NDJSON line of `POST /admin/models/pull`: a node's own `/api/pull` progress tagged with
 * `node`, that node's end (`status` "success" or "failed", with `error`), and finally one
 * summary line without `node` (`{status: "success", nodes}` or `{error, code}`).
 */
// ---- models (src/admin/models.rs) and the latency test (src/admin/latency.rs) ----

/** A node as `GET /admin/models` shows it: whether it was asked and answered. */
export interface MatrixNode {
  name: string;
  state: NodeState;
  state_reason: string;
  /** Not known to be down: asked now, and offered as a pull target. */
  reachable: boolean;
  /** It answered `/api/tags` now. */
  answered: boolean;
  /** Its models are last-known, not live. */
  stale: boolean;
}

/** One node's copy of a model. */
export interface ModelCell {
  loaded: boolean;
  /** Last known (the node did not answer): no digest, never shown as loaded. */
  stale: boolean;
  digest?: string | null;
  size?: number | null;
  modified_at?: string | null;
}

/** One model across the nodes; facts from the first node that listed it. */
export interface ModelRow {
  name: string;
  size?: number | null;
  family?: string | null;
  parameter_size?: string | null;
  quantization_level?: string | null;
  format?: string | null;
  /** The digest most nodes hold. */
  digest: string | null;
  /** Two nodes hold different builds under this name. */
  digests_differ: boolean;
  /** By node name; a node without the model has no cell. */
  cells: Record<string, ModelCell>;
}

/** `GET /admin/models`: the node x model matrix. */
export interface ModelMatrix {
  nodes: MatrixNode[];
  models: ModelRow[];
}

/** One node's result of a delete or copy. */
export interface ModelOpResult {
  node: string;
  ok: boolean;
  http_status: number;
  error: string | null;
  code?: string | null;
}

/** `POST /admin/models/delete|copy` when every node succeeded (else an ApiError naming each node). */
export interface ModelOpAnswer {
  status: "success";
  results: ModelOpResult[];
}

/** One latency test: time to first token of `model`, or a ping (`model` null). */
export interface Latency {
  node: string;
  model: string | null;
  kind: "ttft" | "ping";
  ok: boolean;
  /** Time to first token or round trip, ms (of a failure: how long it took to fail). */
  ms: number;
  head_ms: number | null;
  timeout_ms: number;
  /** Why it failed, in the probe's words ("connection refused at http://..."); null when ok. */
  error: string | null;
  /** Unix ms it was taken (the broker's clock). */
  at: number;
  /** Age on the broker's clock, in `GET /admin/latency`. */
  age_ms?: number;
}

/** `GET /admin/latency`: the last result per node and model. */
export interface LatencyList {
  /** The broker's clock (unix ms), for ages. */
  now: number;
  results: Latency[];
}

/** The body of `POST /admin/latency`: no models, a ping; no nodes, every node (that has the model). */
export interface LatencyAsk {
  models?: string[];
  nodes?: string[];
}

export interface PullLine {
  node?: string;
  status?: string;
  digest?: string;
  completed?: number;
  total?: number;
  error?: string;
  code?: string;
  nodes?: string[];
}

// ---- events (src/telemetry.rs Event, tagged by `type`) ----

export type BrokerEvent =
  | { type: "node_state"; node: string; from: NodeState; to: NodeState; reason: string; at: number }
  | ({ type: "request" } & RequestRow)
  | { type: "config_reload"; ok: boolean; error: string | null }
  | { type: "fallback_share"; share: number; requests: number; threshold: number; above: boolean };

export type EventKind = BrokerEvent["type"];

// ---- errors (admin.rs AdminError, src/error.rs) ----

/** The body of every error the admin API answers. */
export interface ErrorBody {
  error: string;
  /** Stable snake_case code, listed in docs/errors.md. */
  code: string;
  /** For `invalid_config`: each problem, as `path: message`. */
  problems?: string[];
}

/** One broker of a fleet, as `GET /admin/brokers` lists it. */
export interface Broker {
  name: string;
  admin_url: string;
  proxy_url: string;
  version: string;
  config_version: number | null;
  started_at_ms: number;
  last_seen_ms: number;
  last_seen_ms_ago: number;
  in_flight: number;
  queued: number;
  keeper: boolean;
  gone: boolean;
}

/** `GET /admin/brokers`: the fleet as this broker last read it (alone: itself). */
export interface Brokers {
  fleet: boolean;
  this: string;
  read_ms_ago: number | null;
  error: string | null;
  brokers: Broker[];
}
