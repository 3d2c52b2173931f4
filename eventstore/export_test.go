package eventstore

import "context"

// ReadStreamSQL is the statement s reads a stream's events with ($1 tenant, $2 stream, $3 from version, $4 limit:
// NULL for none).
func ReadStreamSQL(ctx context.Context, s *PostgresStore) string {
	return s.q.readStream[b2i(s.Partitioned(ctx))].SQL
}
