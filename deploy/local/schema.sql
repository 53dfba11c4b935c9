-- Schema applied to every shard database by `deploy/local/cluster up` (override with --schema).
CREATE TABLE IF NOT EXISTS kv (id bigint PRIMARY KEY, v text NOT NULL);
