-- When the node was done with a request (ms after arrival): earlier than total_ms when a slow
-- client was still reading the rest from Corral's read-ahead buffer, the node's slot already free.
ALTER TABLE requests ADD COLUMN node_done_ms INTEGER;
-- fastest-finish's estimate of the time from arrival to the end (ms), the X-Corral-Estimate-Ms header.
ALTER TABLE requests ADD COLUMN estimate_ms INTEGER;
