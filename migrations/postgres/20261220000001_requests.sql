-- The request store on PostgreSQL, for a fleet of brokers (issue 18): the SQLite schema of
-- migrations/*.sql in one step, plus the broker that handled each request. Metadata only,
-- never prompt or output text.
CREATE TABLE requests (
    id                TEXT PRIMARY KEY NOT NULL,
    broker            TEXT NOT NULL DEFAULT '',  -- store.broker of the broker that handled it
    started_at        BIGINT NOT NULL,           -- unix ms
    finished_at       BIGINT,                    -- unix ms; NULL while running
    endpoint          TEXT NOT NULL,
    category          TEXT NOT NULL DEFAULT '',
    origin            TEXT NOT NULL DEFAULT 'local',
    model             TEXT NOT NULL DEFAULT '',
    node              TEXT,
    attempts          BIGINT NOT NULL DEFAULT 0,
    fallback          TEXT,
    status            TEXT NOT NULL,             -- running | ok | client_error | error | interrupted | cancelled | unknown
    http_status       BIGINT,
    error_code        TEXT,
    queued_ms         BIGINT,
    ttfb_ms           BIGINT,
    total_ms          BIGINT,
    prompt_tokens     BIGINT,
    completion_tokens BIGINT,
    streamed          BOOLEAN NOT NULL DEFAULT FALSE,
    interrupted       BOOLEAN NOT NULL DEFAULT FALSE,
    client_request_id TEXT,
    answered_model    TEXT,
    failed_attempts   TEXT,
    continued_by      TEXT,
    generation_us     BIGINT,
    node_done_ms      BIGINT,
    estimate_ms       BIGINT
);
CREATE INDEX requests_started_at ON requests (started_at);
CREATE INDEX requests_node ON requests (node, started_at);
CREATE INDEX requests_status ON requests (status);
CREATE INDEX requests_broker ON requests (broker, status);

CREATE TABLE node_events (
    id         BIGSERIAL PRIMARY KEY,
    at         BIGINT NOT NULL,
    broker     TEXT NOT NULL DEFAULT '',
    node       TEXT NOT NULL,
    from_state TEXT NOT NULL,
    to_state   TEXT NOT NULL,
    reason     TEXT NOT NULL DEFAULT ''
);
CREATE INDEX node_events_at ON node_events (at);

CREATE TABLE rollups (
    minute            BIGINT NOT NULL,
    node              TEXT NOT NULL,
    requests          BIGINT NOT NULL DEFAULT 0,
    errors            BIGINT NOT NULL DEFAULT 0,
    total_ms_sum      BIGINT NOT NULL DEFAULT 0,
    ttfb_ms_sum       BIGINT NOT NULL DEFAULT 0,
    completion_tokens BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (minute, node)
);

CREATE TABLE dropped_records (
    at     BIGINT NOT NULL,
    broker TEXT NOT NULL DEFAULT '',
    count  BIGINT NOT NULL
);
