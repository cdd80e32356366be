-- Fleet-wide node capacity (issue 18, item 4; the rule is src/fleet/capacity.rs): per node and
-- broker, the smoothed demand, the share taken and what is held (max(in_flight, share)). Under
-- one advisory transaction lock a broker takes at most max_concurrency - sum(others' held) of
-- live brokers; the sum of held never exceeds the node's limit.
CREATE TABLE node_shares (
    node            TEXT NOT NULL,
    broker          TEXT NOT NULL,
    demand          DOUBLE PRECISION NOT NULL DEFAULT 0,
    share           INTEGER NOT NULL DEFAULT 0,
    held            INTEGER NOT NULL DEFAULT 0,
    max_concurrency INTEGER NOT NULL DEFAULT 0,
    updated_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (node, broker)
);
CREATE INDEX node_shares_broker ON node_shares (broker);
