// Package scalebench measures how stagehand scales out: 1, 2 and 4 relay processes (leader election and
// partitions, as documented for scale-out) and 1, 2 and 4 partitioned projection processes against one
// PostgreSQL, each beside the hand-written SQL of the same work run from as many processes in the same run; how
// long the partitions take to move when a process joins or dies; and what each message costs the database.
//
// Worker processes are the test binary re-executed (child.go); they end when their standard input closes, so none
// outlives the benchmark that started it. TestSmoke (part of CI) checks the rig on a small outbox; the
// measurements are benchmarks run by hand (README.md in this directory has the commands and the figures).
package scalebench
