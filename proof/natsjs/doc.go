// Package natsjs is the embedded NATS JetStream server and the error classification that stagehand's fault suite
// and end-to-end benchmarks share: one place that starts a server (or a node of a cluster) for them, routes its
// log to a *slog.Logger, and tells the relay which NATS client errors mean "broker unreachable". (examples/orders keeps its own copy on
// purpose: an example is read on its own.)
package natsjs
