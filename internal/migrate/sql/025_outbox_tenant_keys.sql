-- Per-key order is per (tenant, partition key). Stream IDs, the default partition keys, are only unique within a
-- tenant, so two tenants may stage messages for the same key: each tenant's messages of that key keep their
-- staging-commit order, independently of the other's. A message of one tenant never waits behind another tenant's
-- message, nor behind another tenant's dead letter holding the key. Owned by package outbox.
--
-- The key counters become one per (tenant, key). Existing rows stay valid: every tenant that has a message or a
-- dead letter numbered on a key gets a counter starting from the key's former counter, which is at or above every
-- sequence number issued for the key, so new messages of that tenant still follow the ones already there. The
-- former counters stay as the counters of the reserved "no tenant" value, which they may well be (harmless when
-- they are not: a counter only has to be at or above the sequence numbers of its key's messages). The indexes that
-- answer "is there an earlier message of this key", "which keys have parked messages" and "does a dead letter hold
-- this key" lead with the tenant. Messages parked behind another tenant's message or dead letter of their key are
-- promoted here, once: nothing else would (a promotion follows a message of the same tenant's key).

ALTER TABLE outbox_keys ADD COLUMN tenant_id text NOT NULL DEFAULT '__untenanted__' CHECK (tenant_id <> '');
ALTER TABLE outbox_keys ALTER COLUMN tenant_id DROP DEFAULT;
ALTER TABLE outbox_keys DROP CONSTRAINT outbox_keys_pkey;
ALTER TABLE outbox_keys ADD PRIMARY KEY (tenant_id, partition_key);

INSERT INTO outbox_keys (tenant_id, partition_key, last_seq)
SELECT DISTINCT t.tenant_id, k.partition_key, k.last_seq
FROM outbox_keys k
JOIN (SELECT tenant_id, partition_key FROM outbox WHERE seq IS NOT NULL
      UNION
      SELECT tenant_id, partition_key FROM outbox_dead_letters WHERE seq IS NOT NULL) t
  ON t.partition_key = k.partition_key
WHERE k.tenant_id = '__untenanted__'
ON CONFLICT (tenant_id, partition_key) DO NOTHING;

DROP INDEX outbox_key_idx;
CREATE INDEX outbox_key_idx ON outbox (tenant_id, partition_key, seq) WHERE seq IS NOT NULL;

DROP INDEX outbox_parked_idx;
CREATE INDEX outbox_parked_idx ON outbox (tenant_id, partition_key, seq) WHERE next_attempt_at = 'infinity';

DROP INDEX outbox_dead_letters_hold_idx;
CREATE INDEX outbox_dead_letters_hold_idx ON outbox_dead_letters (tenant_id, partition_key, seq) WHERE holds_key;

-- The first parked message of each (tenant, key) with nothing of its own tenant before it becomes due.
UPDATE outbox o SET next_attempt_at = now()
WHERE o.next_attempt_at = 'infinity' AND o.seq IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM outbox p
                  WHERE p.tenant_id = o.tenant_id AND p.partition_key = o.partition_key AND p.seq < o.seq)
  AND NOT EXISTS (SELECT 1 FROM outbox_dead_letters d
                  WHERE d.holds_key AND d.tenant_id = o.tenant_id AND d.partition_key = o.partition_key
                    AND d.seq < o.seq);
