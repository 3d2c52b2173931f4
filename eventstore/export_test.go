package eventstore

import "context"

// ReadStreamSQL is the statement s reads a stream's events with ($1 tenant, $2 stream, $3 from version).
func ReadStreamSQL(ctx context.Context, s *PostgresStore) string {
	return s.readStreamSQL(s.Partitioned(ctx))
}
