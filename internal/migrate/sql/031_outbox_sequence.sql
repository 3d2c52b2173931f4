-- Sequence numbers from one sequence. A key's messages used to be numbered after the highest number the key still had
-- in the outbox or among its dead letters, which staging read with two probes on every call. Staging now draws each
-- ordered message's number from this sequence, after taking the key's advisory lock (package outbox,
-- queries.stageOne and stageMany): a later stager of the same key waits for that lock, so it draws a higher number,
-- and numbers follow staging-commit order within every key as before. A number is never reused, so a dead letter
-- (holding its key or released) that is redriven always goes before the messages staged after it. Staging still
-- probes whether the key has a pending message or a dead letter holding it, to park the new message behind them.
-- CACHE 1 (the default) is required: numbers cached per session would no longer follow the order of the lock.
-- Owned by package outbox.

CREATE SEQUENCE outbox_seq AS bigint;
SELECT setval('outbox_seq', greatest(
    (SELECT max(seq) FROM outbox), (SELECT max(seq) FROM outbox_dead_letters), 1));
