-- Who really answered, and what went wrong before: the model that answered when it is not the
-- one asked for (a provider's model), the attempts that failed first (a JSON list of
-- {node, outcome, detail}), and the node that continued a cut stream.
ALTER TABLE requests ADD COLUMN answered_model TEXT;
ALTER TABLE requests ADD COLUMN failed_attempts TEXT;
ALTER TABLE requests ADD COLUMN continued_by TEXT;
