-- Inbox: idempotent consumers. Owned by package outbox (inbox.go).
--
--   inbox               one row per (message ID, handler) already handled, written in the handler's own
--                       transaction, so a redelivered message is skipped. Rows are kept for the retention window
--                       and then removed by cleanup.
--   inbox_attempts      failed attempts of a message that has not yet succeeded or been dead-lettered.
--   inbox_dead_letters  messages a handler could not decode or kept failing on, with the error.

CREATE TABLE inbox (
    message_id   text        NOT NULL CHECK (message_id <> ''),
    handler      text        NOT NULL CHECK (handler <> ''),
    tenant_id    text        NOT NULL DEFAULT '__untenanted__' CHECK (tenant_id <> ''),
    message_type text        NOT NULL DEFAULT '',
    -- 'handled', or 'dead-lettered' (the message sits in inbox_dead_letters and redeliveries are skipped).
    outcome      text        NOT NULL DEFAULT 'handled' CHECK (outcome IN ('handled', 'dead-lettered')),
    processed_at timestamptz NOT NULL,
    PRIMARY KEY (message_id, handler)
);

CREATE INDEX inbox_processed_at_idx ON inbox USING brin (processed_at);

CREATE TABLE inbox_attempts (
    message_id      text        NOT NULL,
    handler         text        NOT NULL,
    tenant_id       text        NOT NULL CHECK (tenant_id <> ''),
    attempts        integer     NOT NULL,
    last_error      text        NOT NULL,
    first_failed_at timestamptz NOT NULL,
    last_failed_at  timestamptz NOT NULL,
    PRIMARY KEY (message_id, handler)
);

CREATE TABLE inbox_dead_letters (
    message_id   text        NOT NULL,
    handler      text        NOT NULL,
    tenant_id    text        NOT NULL CHECK (tenant_id <> ''),
    message_type text        NOT NULL,
    topic        text        NOT NULL,
    payload      bytea       NOT NULL,
    metadata     jsonb       NOT NULL,
    attempts     integer     NOT NULL,
    last_error   text        NOT NULL,
    dead_at      timestamptz NOT NULL,
    PRIMARY KEY (message_id, handler)
);

CREATE INDEX inbox_dead_letters_dead_at_idx ON inbox_dead_letters (tenant_id, dead_at);
