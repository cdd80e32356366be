-- One row per request: metadata only, never prompt or output text.
CREATE TABLE requests (
    id                TEXT PRIMARY KEY NOT NULL,
    started_at        INTEGER NOT NULL,          -- unix ms
    finished_at       INTEGER,                   -- unix ms; NULL while running
    endpoint          TEXT NOT NULL,
    category          TEXT NOT NULL DEFAULT '',
    origin            TEXT NOT NULL DEFAULT 'local',
    model             TEXT NOT NULL DEFAULT '',
    node              TEXT,
    attempts          INTEGER NOT NULL DEFAULT 0,
    fallback          TEXT,                      -- cloud provider that answered, if any
    status            TEXT NOT NULL,             -- running | ok | client_error | error | interrupted | cancelled | unknown
    http_status       INTEGER,
    error_code        TEXT,
    queued_ms         INTEGER,
    ttfb_ms           INTEGER,
    total_ms          INTEGER,
    prompt_tokens     INTEGER,
    completion_tokens INTEGER,
    streamed          INTEGER NOT NULL DEFAULT 0,
    interrupted       INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX requests_started_at ON requests (started_at);
CREATE INDEX requests_node ON requests (node, started_at);
CREATE INDEX requests_status ON requests (status);

-- Node state changes, with the reason.
CREATE TABLE node_events (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    at       INTEGER NOT NULL,                   -- unix ms
    node     TEXT NOT NULL,
    from_state TEXT NOT NULL,
    to_state TEXT NOT NULL,
    reason   TEXT NOT NULL DEFAULT ''
);
CREATE INDEX node_events_at ON node_events (at);

-- Per-minute, per-node rollups for long-range charts.
CREATE TABLE rollups (
    minute            INTEGER NOT NULL,          -- unix ms / 60000
    node              TEXT NOT NULL,
    requests          INTEGER NOT NULL DEFAULT 0,
    errors            INTEGER NOT NULL DEFAULT 0,
    total_ms_sum      INTEGER NOT NULL DEFAULT 0,
    ttfb_ms_sum       INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (minute, node)
);

-- Records the request path could not hand to the writer (channel full).
CREATE TABLE dropped_records (
    at    INTEGER NOT NULL,
    count INTEGER NOT NULL
);
