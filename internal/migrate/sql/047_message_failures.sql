-- Failure history, error signatures and lookups for operators (package outbox: Admin.Find, Admin.DeadLetterGroups,
-- Admin.Failures). Owned by package outbox.
--
--   message_failures    each failed attempt of a message, with its error: a relay's rejected delivery (source
--                       'outbox', target the topic) or an inbox handler's failure (source 'inbox', target the
--                       handler). Written only when an attempt fails, in the statement or batch that already records
--                       the failure, so a publication or a handling that succeeds costs nothing more. Bounded: the
--                       last 10 failures of each (message, target) are kept (n numbers them across redrives; the
--                       insert deletes the one that falls out), and each error is cut to 1,000 characters. Routine
--                       maintenance removes entries older than the dead-letter retention (BRIN on failed_at).
--   error_type, error_signature on both dead-letter tables
--                       the error's type and its signature (the type and the message with numbers, IDs, hex and
--                       quoted values replaced), so dead letters group by cause; the index leads with the signature
--                       and carries what a group counts (time, tenant, type), so grouping reads the index alone,
--                       and a group's newest dead letter is its last entry.
--   lookups             dead letters by correlation ID, stream (the aggregate-id header) and partition key. Dead
--                       letters are few and written rarely; the hot outbox table and the sent ledger gain no index.
CREATE TABLE message_failures (
    source     text        NOT NULL CHECK (source IN ('outbox', 'inbox')),
    tenant_id  text        NOT NULL CHECK (tenant_id <> ''),
    message_id text        NOT NULL,
    target     text        NOT NULL,
    n          integer     NOT NULL CHECK (n > 0),
    -- The attempt's number in its round (a redrive starts a new round at 1).
    attempt    integer     NOT NULL,
    error_type text        NOT NULL,
    signature  text        NOT NULL,
    error      text        NOT NULL,
    failed_at  timestamptz NOT NULL,
    PRIMARY KEY (message_id, source, target, tenant_id, n)
);

CREATE INDEX message_failures_failed_at_idx ON message_failures USING brin (failed_at);

-- A dead letter written without a signature (before this migration, or by an older release during an upgrade) has
-- the type 'unknown' and one signature for all of them, so it still belongs to a group that can be acted on.
ALTER TABLE outbox_dead_letters ADD COLUMN error_type text NOT NULL DEFAULT 'unknown',
    ADD COLUMN error_signature text NOT NULL DEFAULT 'unknown: recorded without a signature';
ALTER TABLE inbox_dead_letters ADD COLUMN error_type text NOT NULL DEFAULT 'unknown',
    ADD COLUMN error_signature text NOT NULL DEFAULT 'unknown: recorded without a signature';

CREATE INDEX outbox_dead_letters_signature_idx ON outbox_dead_letters (error_signature, dead_at)
    INCLUDE (tenant_id, error_type);
CREATE INDEX inbox_dead_letters_signature_idx ON inbox_dead_letters (error_signature, dead_at)
    INCLUDE (tenant_id, error_type);

CREATE INDEX outbox_dead_letters_correlation_idx ON outbox_dead_letters (correlation_id) WHERE correlation_id <> '';
CREATE INDEX outbox_dead_letters_stream_idx ON outbox_dead_letters ((metadata ->> 'aggregate-id'))
    WHERE metadata ? 'aggregate-id';
CREATE INDEX outbox_dead_letters_partition_key_idx ON outbox_dead_letters (partition_key) WHERE partition_key <> '';
CREATE INDEX inbox_dead_letters_correlation_idx ON inbox_dead_letters ((metadata ->> 'correlation-id'))
    WHERE metadata ? 'correlation-id';
CREATE INDEX inbox_dead_letters_stream_idx ON inbox_dead_letters ((metadata ->> 'aggregate-id'))
    WHERE metadata ? 'aggregate-id';
