-- The console's chart history (package console): what the outbox, the sent ledger, the dead letters and the inbox
-- recorded in each bucket of time (ten seconds by default), by topic and by inbox handler, and the backlogs the
-- console saw at a bucket's end. The console's sampler counts each bucket from the tables' own timestamps through
-- their time indexes and writes it once; its charts read this table, so their history survives a restart of the
-- console. Rows older than the console's retention are deleted by the console in small batches. Owned by package
-- console.
CREATE TABLE console_samples (
    -- Whose figures: '' every tenant, otherwise the tenant's ID (the console's scope; a tenant's ID is never empty).
    scope               text        NOT NULL,
    -- 'all' (the whole scope), 'topic' (name: the topic) or 'handler' (name: the inbox handler).
    kind                text        NOT NULL CHECK (kind IN ('all', 'topic', 'handler')),
    name                text        NOT NULL DEFAULT '',
    -- The bucket [at, at + seconds).
    at                  timestamptz NOT NULL,
    seconds             integer     NOT NULL CHECK (seconds > 0),
    -- Counts in the bucket (NULL where the kind has no such figure).
    appended            bigint,
    staged              bigint,
    published           bigint,
    dead_lettered       bigint,
    handled             bigint,
    inbox_dead_lettered bigint,
    inbox_failed        bigint,
    -- Backlogs seen at the bucket's end (kind 'all'; NULL for a bucket counted after the fact).
    pending             bigint,
    oldest_pending_ms   bigint,
    dead_letters        bigint,
    inbox_dead_letters  bigint,
    projection_lag      bigint,
    worker_lag          bigint,
    PRIMARY KEY (scope, kind, name, at)
);

-- Charts read a scope's range of time; retention deletes by time.
CREATE INDEX console_samples_at_idx ON console_samples (scope, kind, at);
CREATE INDEX console_samples_retention_idx ON console_samples (at);
