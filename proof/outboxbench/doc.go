// Package outboxbench measures the relay's drain rate and latency beside a hand-written claim + mark and
// watermill-sql's default schema with Watermill's forwarder, on the same durable PostgreSQL in the same run. It
// lives in the proof module, not in the library, so that watermill-sql (and the lib/pq driver it imports) never
// enter the library's module graph.
//
//	go test ./proof/outboxbench -run '^$' -bench 'Drain|Latency' -benchtime 1x
//	STAGEHAND_OUTBOX_SOAK=5m go test ./proof/outboxbench -run '^$' -bench Soak -benchtime 1x -timeout 20m
package outboxbench
