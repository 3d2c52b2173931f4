-- Partitioned relays (outbox.RelayConfig.Partitions). A partition is a range of a 32-bit hash: of the partition key
-- (of the message ID for an unordered message) or of the tenant. The claim index gains both hashes behind
-- next_attempt_at: a partition's claim walks the due rows oldest first, as every claim does, and tests its hash range
-- on the index entries themselves, so another partition's rows cost an index entry each, never a heap fetch. The
-- index is replaced rather than doubled, so staging maintains no more indexes than before. The expressions must match
-- the relay's claim statements exactly (outbox/sql.go). Owned by package outbox.
DROP INDEX outbox_due_idx;
CREATE INDEX outbox_due_idx ON outbox (
    next_attempt_at,
    hashtext(CASE WHEN partition_key <> '' THEN partition_key ELSE message_id END),
    hashtext(tenant_id)
) WHERE next_attempt_at < 'infinity';
