// Package faultsuite is stagehand's fault-injection suite: it breaks things on purpose while messages
// flow and counts what was lost, reordered or applied twice, once per broker (one NATS JetStream server, a 3-node
// JetStream cluster, RabbitMQ), each driven through one small interface (broker.go). Its test is the command:
//
//	go test ./proof/faultsuite -run TestFaultSuite -v                        # CI size (also part of go test work)
//	STAGEHAND_FAULTS=full go test ./proof/faultsuite -run TestFaultSuite -v -timeout 60m   # full size
//
// See README.md in this directory for what it does and what it asserts.
package faultsuite
