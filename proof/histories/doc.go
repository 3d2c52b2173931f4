// Package histories checks stagehand the way databases are checked after Jepsen: clients run operations through a
// fault proxy that breaks the network between them and PostgreSQL, every operation is recorded with its
// invocation and completion times, inputs and outcome (ok, fail, or info when the client cannot know), and
// checkers decide whether the recorded history is one the documented guarantees allow.
//
//	go test ./proof/histories -v                                  # CI size (also part of go test work)
//	STAGEHAND_HISTORIES=full go test ./proof/histories -run TestStreamsUnderNetworkFaults -v -timeout 30m
//	STAGEHAND_HISTORIES_SEED=123 go test ./proof/histories -run TestStreamsUnderNetworkFaults -v   # replay a seed
//
// Proxy is the PostgreSQL fault proxy (or, with ProxyOptions.Raw, a byte proxy for a broker); Recorder records
// histories; CheckStreams checks per-stream linearizability of appends and loads with porcupine; ResolveSaves,
// CheckPipeline, CheckHandlerLoads and CheckProjectionReads check the pipeline (acknowledged saves' messages
// handled exactly once in effect and aborted saves' never, per-key order, handlers seeing their cause, projection
// reads that are folds of prefixes of the log); RunStreams and RunPipeline are the seeded runs the tests drive,
// on direct connections or through PgBouncer (StartPgBouncer). See README.md in this directory for what each
// asserts, the anomalies found and what is not built yet.
package histories
