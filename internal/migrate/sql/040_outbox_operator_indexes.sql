-- Indexes for the operator views of the outbox and the inbox (package outbox's Admin listings, which the console and
-- the CLI page through). Owned by package outbox.
--
--   outbox_sent (source_position), BRIN    which messages were staged from an event: the ledger is appended in
--                                          publication order, which follows the log closely, so a range summary is
--                                          nearly free to keep up and lets a lookup by position skip the rest of a
--                                          ledger of millions of entries. The hot path (the relay's mark) gains no
--                                          B-tree insertion.
--   outbox_dead_letters, inbox_dead_letters (dead_at, ...)
--                                          estate-wide pages of dead letters in time order (keyset pagination), and
--                                          the dead letters of a window of time; the existing indexes lead with the
--                                          tenant. Dead letters are few and written rarely.
--
-- Building them reads each table once; the BRIN index on a large ledger takes about a second per few million rows.
CREATE INDEX outbox_sent_source_position_idx ON outbox_sent USING brin (source_position);
CREATE INDEX outbox_dead_letters_time_idx ON outbox_dead_letters (dead_at, message_id, topic, tenant_id);
CREATE INDEX inbox_dead_letters_time_idx ON inbox_dead_letters (dead_at, message_id, handler, tenant_id);
