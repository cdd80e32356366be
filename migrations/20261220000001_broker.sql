-- The broker that handled each record (issue 18): `store.broker`, else the host name. On
-- SQLite it is this one broker's, the same column the PostgreSQL schema has for a fleet's
-- records (migrations/postgres/), so the queries are one text for both engines.
ALTER TABLE requests ADD COLUMN broker TEXT NOT NULL DEFAULT '';
ALTER TABLE node_events ADD COLUMN broker TEXT NOT NULL DEFAULT '';
ALTER TABLE dropped_records ADD COLUMN broker TEXT NOT NULL DEFAULT '';
