package eventstore

import "context"

// SetRecoveryProbe makes s see the answer of probe instead of pg_is_in_recovery(), so tests can stand for a
// standby.
func SetRecoveryProbe(s *PostgresStore, probe func(context.Context) (bool, error)) {
	s.recoveryProbe = probe
	s.primary.Store(false)
}

// ReadStreamSQL is the statement s reads a stream's events with ($1 tenant, $2 stream, $3 from version).
func ReadStreamSQL(ctx context.Context, s *PostgresStore) string {
	return s.readStreamSQL(s.Partitioned(ctx))
}
