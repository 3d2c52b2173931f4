-- Routine maintenance of the outbox and inbox tables (package outbox, Maintainer): one row recording the latest
-- pass, so status commands, health checks and every process see whether retention is being applied, and so a pass
-- is not repeated by each process that starts (a pass runs when the latest one started an interval ago or more).
-- Owned by package outbox.
CREATE TABLE outbox_maintenance (
    id               boolean     PRIMARY KEY DEFAULT true CHECK (id),
    -- The owner (leases table) of the process that ran the latest pass.
    owner            text        NOT NULL,
    interval_seconds double precision NOT NULL,
    started_at       timestamptz NOT NULL,
    finished_at      timestamptz,
    last_error       text        NOT NULL DEFAULT '',
    -- What the latest pass removed, per table.
    sent_removed           bigint NOT NULL DEFAULT 0,
    inbox_removed          bigint NOT NULL DEFAULT 0,
    inbox_attempts_removed bigint NOT NULL DEFAULT 0,
    dead_letters_expired   bigint NOT NULL DEFAULT 0,
    inbox_dead_expired     bigint NOT NULL DEFAULT 0,
    passes           bigint      NOT NULL DEFAULT 0
);
