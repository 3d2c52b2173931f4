package histories

import (
	"fmt"
	"net"
	"net/url"
	"strconv"

	"github.com/jackc/pgx/v5/pgconn"
)

// ServerAddr returns the "host:port" a PostgreSQL connection string (URL or key=value form) connects to.
func ServerAddr(connString string) (string, error) {
	cfg, err := pgconn.ParseConfig(connString)
	if err != nil {
		return "", fmt.Errorf("histories: parse the connection string: %w", err)
	}
	return net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))), nil
}

// Through returns the URL-form connection string connString with its host and port replaced by addr (a proxy's),
// so every connection made with it, fallbacks included, goes through the proxy.
func Through(connString, addr string) (string, error) {
	u, err := url.Parse(connString)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", fmt.Errorf("histories: %q is not a postgres:// URL", connString)
	}
	u.Host = addr
	return u.String(), nil
}
