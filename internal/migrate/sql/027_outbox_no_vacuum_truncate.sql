-- The outbox is a queue: it empties and refills all day. A vacuum that finds empty pages at the end of a table
-- truncates them, and truncating takes an ACCESS EXCLUSIVE lock, which queues every staging transaction (they insert
-- into this table) behind it for as long as the truncation scan runs: latency spikes on the save path that grow
-- with the table's churn. Keeping the pages costs nothing here (they are reused by the next inserts), so neither
-- autovacuum nor the relay's own vacuum truncates the hot table. Owned by package outbox.

ALTER TABLE outbox SET (vacuum_truncate = false);
