package staging

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// identityTimeout bounds the two identity queries a stager's construction may make (New takes no context).
const identityTimeout = 5 * time.Second

// databaseIdentity is what a server reports about the database a connection reached: together, the same values
// from two pools mean one database on one running server, whatever host names, addresses or sockets the pools
// connect through.
//
//   - system is the cluster's system identifier (fixed at initdb): two separately created servers differ. It is 0
//     when the role may not read it (pg_control_system is restricted on some managed services).
//   - started is when the server's postmaster started: a physical copy or streaming replica of a cluster shares
//     its system identifier but runs as another server, started at another instant.
//   - port is the server's configured port (the setting, not the connection's, so a Unix socket and TCP agree).
//   - name is the database's name: two databases on one server differ here.
//
// A row written by the migrations (an installation ID) would not do: the event store and the outbox may live in
// different schemas with their own migrations, and a restored dump carries the row to another server.
type databaseIdentity struct {
	system  int64
	started time.Time
	port    string
	name    string
}

const identityQuery = `SELECT (SELECT system_identifier FROM pg_control_system()), pg_postmaster_start_time(),
    current_setting('port'), current_database()`

// identityQueryNoControl is identityQuery for servers that refuse pg_control_system (some managed services
// restrict or lack it): the start instant, port and name still tell servers and databases apart.
const identityQueryNoControl = `SELECT 0::bigint, pg_postmaster_start_time(), current_setting('port'),
    current_database()`

func identityOf(ctx context.Context, pool *pgxpool.Pool) (databaseIdentity, error) {
	var id databaseIdentity
	err := pool.QueryRow(ctx, identityQuery).Scan(&id.system, &id.started, &id.port, &id.name)
	// 42501 insufficient_privilege, 42883 undefined_function, 0A000 feature_not_supported.
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) &&
		(pgErr.Code == "42501" || pgErr.Code == "42883" || pgErr.Code == "0A000") {
		err = pool.QueryRow(ctx, identityQueryNoControl).Scan(&id.system, &id.started, &id.port, &id.name)
	}
	if err != nil {
		return id, fmt.Errorf("staging: read the database identity: %w", err)
	}
	return id, nil
}

// samePoolDatabase reports whether a and b reach one database. The same pool, or the same host, port and database
// in both configurations, needs no query; otherwise each database is asked who it is, within identityTimeout.
func samePoolDatabase(a, b *pgxpool.Pool) (bool, error) {
	if a == b {
		return true, nil
	}
	ca, cb := a.Config().ConnConfig, b.Config().ConnConfig
	if ca.Host == cb.Host && ca.Port == cb.Port && ca.Database == cb.Database {
		return true, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), identityTimeout)
	defer cancel()
	ia, err := identityOf(ctx, a)
	if err != nil {
		return false, err
	}
	ib, err := identityOf(ctx, b)
	if err != nil {
		return false, err
	}
	return ia.same(ib), nil
}

// same reports whether a and b are one database. A system identifier of 0 (not readable by that connection's
// role) matches any: the other three still decide.
func (a databaseIdentity) same(b databaseIdentity) bool {
	return (a.system == b.system || a.system == 0 || b.system == 0) && a.started.Equal(b.started) &&
		a.port == b.port && a.name == b.name
}
