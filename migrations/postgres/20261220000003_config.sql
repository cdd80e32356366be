-- The fleet's shared config (issue 18, item 2; the rules are src/fleet/config.rs): one row per
-- version, numbered without gaps (a broker publishes base + 1; the primary key makes the
-- second of two brokers that edit at once re-read and rebase). `config` is the shared part as
-- TOML text (nodes, categories, providers by name, limits and tuning; never a secret value,
-- never a machine's listeners, admin address, store or telemetry). Every insert notifies
-- channel `corral_config` with the version as payload, in the inserting transaction, so a
-- version typed in by hand reaches the brokers too.
CREATE TABLE config_versions (
    version    BIGINT PRIMARY KEY NOT NULL,
    config     TEXT NOT NULL,
    author     TEXT NOT NULL DEFAULT '',            -- store.broker of the broker that published it
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE FUNCTION corral_config_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('corral_config', NEW.version::text);
    RETURN NEW;
END
$$;

CREATE TRIGGER config_versions_notify AFTER INSERT ON config_versions
    FOR EACH ROW EXECUTE FUNCTION corral_config_notify();
