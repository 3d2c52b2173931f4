-- Log followers: where a requested reset moves the checkpoint. 0 (the default) is the start of the log; a rebuild
-- from a later position (projection.RequestRebuildFrom) is how a projection is rebuilt once the start of the log
-- has been archived (eventstore.Partitions.Archive): it reads on from there, knowingly without the archived events.
ALTER TABLE checkpoints ADD COLUMN reset_position bigint NOT NULL DEFAULT 0 CHECK (reset_position >= 0);
