-- How long the node spent generating the answer's tokens, in microseconds: Ollama's
-- `eval_duration` (reported in ns) from the answer's last line. Tokens per second, everywhere
-- Corral shows it, is completion tokens / this (see README "tokens/s").
ALTER TABLE requests ADD COLUMN generation_us INTEGER;
