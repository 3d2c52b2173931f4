package main

import (
	"fmt"
	"hash/fnv"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/stagehand-es/stagehand/outbox"
)

// Per-key order at the handler, with more than one message in flight. A consumer group that may hold only one
// unacknowledged message at a time keeps each key's order all the way to the handler (see provisionBroker), but
// handles one message at a time. So each topic is split into partitions: subjects topic.p0 ... topic.p3 of the
// topic's stream. A message goes to the partition of its partition key (FNV-1a of the key), so a key's messages
// stay on one subject, in order, and each group reads every partition through a durable consumer of its own: one
// message in flight per partition, four per topic and group, each key still in order. More partitions, more
// messages in flight; a partition's count cannot change while messages are pending without breaking the order of
// the keys that move.
const partitions = 4

// partitionSubject is the subject of partition p of topic.
func partitionSubject(topic string, p int) string { return fmt.Sprintf("%s.p%d", topic, p) }

// partitionOf is the partition of a partition key.
func partitionOf(key string) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(key))
	return int(h.Sum32() % partitions)
}

// partitionName is the last token of a partition's subject ("p2"), which names its durable consumer.
func partitionName(subject string) string { return subject[strings.LastIndexByte(subject, '.')+1:] }

// partitionedPublisher publishes each message to its partition's subject of the topic.
type partitionedPublisher struct{ next message.Publisher }

func (p partitionedPublisher) Publish(topic string, msgs ...*message.Message) error {
	for _, msg := range msgs {
		subject := partitionSubject(topic, partitionOf(msg.Metadata.Get(outbox.HeaderPartitionKey)))
		if err := p.next.Publish(subject, msg); err != nil {
			return err
		}
	}
	return nil
}

func (p partitionedPublisher) Close() error { return p.next.Close() }

// addPartitionedHandlers adds one router handler per partition of topic, named name-p0, name-p1, ...
func addPartitionedHandlers(r *message.Router, name, topic string, sub message.Subscriber,
	h message.NoPublishHandlerFunc) {
	for p := range partitions {
		subject := partitionSubject(topic, p)
		r.AddConsumerHandler(name+"-"+partitionName(subject), subject, sub, h)
	}
}
