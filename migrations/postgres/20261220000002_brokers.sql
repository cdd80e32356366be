-- Fleet membership (issue 18, item 3): one row per broker, heartbeated every second with the
-- database's own clock (`now()`), so brokers' clocks do not matter. A broker whose last_seen is
-- more than 5 s old is gone; the keeper (pg_try_advisory_lock) marks its running requests unknown.
CREATE TABLE brokers (
    name           TEXT PRIMARY KEY NOT NULL,   -- store.broker, else the host name
    instance       TEXT NOT NULL DEFAULT '',    -- random per process: two live brokers of one name are told apart
    admin_url      TEXT NOT NULL DEFAULT '',
    proxy_url      TEXT NOT NULL DEFAULT '',
    version        TEXT NOT NULL DEFAULT '',    -- Corral's version
    config_version BIGINT,                      -- the shared config version in force; NULL when none
    started_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    last_seen      TIMESTAMPTZ NOT NULL DEFAULT now(),
    in_flight      BIGINT NOT NULL DEFAULT 0,
    queued         BIGINT NOT NULL DEFAULT 0,
    keeper         BOOLEAN NOT NULL DEFAULT FALSE
);
