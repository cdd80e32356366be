-- The X-Request-Id a client sent, kept beside Corral's own id (the key): a client's id is
-- echoed, never trusted to name a row.
ALTER TABLE requests ADD COLUMN client_request_id TEXT;
