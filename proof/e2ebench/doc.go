// Package e2ebench is stagehand's end-to-end benchmark: append → handled through stagehand beside
// watermill-sql's default schema with Watermill's forwarder, on the same PostgreSQL and the same NATS JetStream
// broker, in the same run.
//
//   - stagehand: an aggregate repository's Save with the Transactional strategy (the event and its message commit
//     together), the outbox relay through a Watermill router (the Balanced profile unless Config.Relay says
//     otherwise), NATS JetStream, and an inbox-wrapped consumer.
//   - forwarder: the same append (the same event store, through SaveTx) and, in the same pgx transaction, the
//     message published into watermill-sql v4's default PostgreSQL schema through Watermill's forwarder publisher;
//     Watermill's forwarder (components/forwarder) moves it to the same broker, and the same inbox-wrapped consumer
//     logic handles it.
//
// Each path's maximum sustainable rate is measured with closed-loop rounds; both paths are then run paced (open
// loop) at 25%, 50% and 90% of stagehand's maximum, and the append → handled latency p50/p99 is taken from each
// append's due time to the commit of the consumer's inbox transaction. The command (a durable cluster, about
// 2.5 minutes):
//
//	go test ./proof/e2ebench -run '^$' -bench EndToEnd -benchtime 1x -timeout 30m
//
// BenchmarkAppendCost takes the append apart (the bare append, stagehand's Transactional Save, SaveTx with
// outbox.StageTx, SaveTx with watermill-sql). See README.md in this directory for the method and the figures.
package e2ebench
