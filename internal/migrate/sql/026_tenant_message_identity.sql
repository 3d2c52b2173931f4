-- Message identity includes the tenant. Message IDs are chosen by producers and only unique within a tenant (two
-- tenants may well stage the same ID, or consume a message with the same ID from their own streams), so:
--   outbox, outbox_sent, outbox_dead_letters   a message is (tenant, message ID, topic): staging an ID another
--                                              tenant already staged, sent or dead-lettered inserts a row of its own
--                                              rather than nothing;
--   inbox, inbox_attempts, inbox_dead_letters  a handled message is (tenant, message ID, handler): a message with the
--                                              ID of another tenant's message is handled, not skipped as a duplicate.
-- The message ID leads each key, so the estate-wide operations that look a message up by ID alone use it too.
-- Existing rows stay valid: they were unique on fewer columns. Owned by package outbox.

ALTER TABLE outbox DROP CONSTRAINT outbox_message_key;
ALTER TABLE outbox ADD CONSTRAINT outbox_message_key UNIQUE (message_id, topic, tenant_id);

ALTER TABLE outbox_sent DROP CONSTRAINT outbox_sent_pkey;
ALTER TABLE outbox_sent ADD PRIMARY KEY (message_id, topic, tenant_id);

ALTER TABLE outbox_dead_letters DROP CONSTRAINT outbox_dead_letters_pkey;
ALTER TABLE outbox_dead_letters ADD PRIMARY KEY (message_id, topic, tenant_id);

ALTER TABLE inbox DROP CONSTRAINT inbox_pkey;
ALTER TABLE inbox ADD PRIMARY KEY (message_id, handler, tenant_id);

ALTER TABLE inbox_attempts DROP CONSTRAINT inbox_attempts_pkey;
ALTER TABLE inbox_attempts ADD PRIMARY KEY (message_id, handler, tenant_id);

ALTER TABLE inbox_dead_letters DROP CONSTRAINT inbox_dead_letters_pkey;
ALTER TABLE inbox_dead_letters ADD PRIMARY KEY (message_id, handler, tenant_id);
