-- Client keys fleet-wide (issue 18, item 5; the rules are src/fleet/keys.rs). The database
-- holds each key's verifier, the SHA-256 of the key in lowercase hex, never the key itself:
-- a key created on one broker is checked on every broker by hashing the bearer. Every change
-- notifies channel `corral_keys` (in the changing transaction), so a created or revoked key
-- reaches every broker at once; brokers also re-read every second.
CREATE TABLE client_keys (
    name       TEXT PRIMARY KEY NOT NULL,
    verifier   TEXT NOT NULL CHECK (verifier ~ '^[0-9a-f]{64}$'),
    created_by TEXT NOT NULL DEFAULT '',             -- store.broker of the broker that made it
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Per-key usage, one row per key and broker, added to about once a second by each broker;
-- the fleet's total is the sum over brokers. Kept when a key is revoked (it was used).
CREATE TABLE key_usage (
    name          TEXT NOT NULL,
    broker        TEXT NOT NULL,
    requests      BIGINT NOT NULL DEFAULT 0,
    prompt_tokens BIGINT NOT NULL DEFAULT 0,
    output_tokens BIGINT NOT NULL DEFAULT 0,
    updated_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (name, broker)
);

CREATE FUNCTION corral_keys_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('corral_keys', '');
    RETURN NULL;
END
$$;

CREATE TRIGGER client_keys_notify AFTER INSERT OR UPDATE OR DELETE ON client_keys
    FOR EACH STATEMENT EXECUTE FUNCTION corral_keys_notify();

-- Quota windows (`[[quotas]]`, src/quota.rs): each broker's own count of a key's requests and
-- tokens in one fixed window, written as absolute values (a repeated write never counts
-- twice) about once a second; a broker reads the others' rows for the current windows.
CREATE TABLE quota_use (
    name         TEXT NOT NULL,
    window_s     BIGINT NOT NULL,
    window_start BIGINT NOT NULL,                   -- unix seconds
    broker       TEXT NOT NULL,
    requests     BIGINT NOT NULL DEFAULT 0,
    tokens       BIGINT NOT NULL DEFAULT 0,
    updated_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (name, window_s, window_start, broker)
);
CREATE INDEX quota_use_window ON quota_use (window_start);
