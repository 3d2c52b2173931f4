-- Partitioned relays (outbox.RelayConfig.Partitions). A partition is a range of a 32-bit hash: of the partition key
-- (of the message ID for an unordered message) or of the tenant. Each partition's claim walks this index in
-- next_attempt_at order, like the unpartitioned claim walks outbox_due_idx, and tests the hash range on the index
-- entries themselves, so rows of other partitions cost an index entry each, never a heap fetch. The expressions
-- must match the relay's claim statements exactly (outbox/sql.go). Owned by package outbox.
CREATE INDEX outbox_due_partition_idx ON outbox (
    next_attempt_at,
    hashtext(CASE WHEN partition_key <> '' THEN partition_key ELSE message_id END),
    hashtext(tenant_id)
) WHERE next_attempt_at < 'infinity';
