-- Per-key order without a counter row. Staging used to take and advance one counter row per (tenant, partition key)
-- in outbox_keys: an upsert on every save, two more relations locked by it, a table that grew with the number of
-- aggregates and needed pruning. Staging now takes a transaction-scoped advisory lock on the (tenant, key) instead,
-- and numbers its messages after the highest sequence number the key still has in the outbox or among its
-- dead letters, read after the lock (package outbox, queries.stagePrelude and stageOne/stageMany). Sequence numbers
-- only order the messages a key has at the same time, so restarting from 1 when a key has emptied changes no order.
-- The relay tries the same lock before promoting a key's next message, exactly as it used to lock the counter.
-- A key's highest sequence number counts every dead letter of the key, holding it or not, so a released dead letter
-- that is redriven never shares its number with a later message: the index on a key's dead letters covers them all
-- (a probe for one holding the key filters on holds_key, rare among them).
-- Owned by package outbox.

DROP TABLE outbox_keys;
DROP INDEX outbox_dead_letters_hold_idx;
CREATE INDEX outbox_dead_letters_key_idx ON outbox_dead_letters (tenant_id, partition_key, seq) WHERE seq IS NOT NULL;
