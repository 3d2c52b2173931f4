package histories

import (
	"encoding/json"
	"fmt"
	"hash/fnv"

	"github.com/stagehand-es/stagehand/aggregate"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/staging"
)

// The pipeline run's domain. Producers save Counter aggregates: every save raises Ticked events carrying the ID of
// the save (a fresh one per attempt), so the committed log tells which save committed, and the message of each
// event names it too. The handlers behind the inbox add one Counted event per message to the key's Tally
// aggregate (UpsertTx on the inbox's transaction): the Tally streams are the committed effects, read back after
// the run, and their order is the order at the handler.

// Stable names of the pipeline run's types.
const (
	counterType = "histories.counter"
	tickedType  = "histories.ticked"
	tallyType   = "histories.tally"
	countedType = "histories.counted"
	mappingName = "histories.ticked.v1"
	messageType = "histories.v1.Ticked"
	topicPrefix = "histories-ticked"
)

// counter is the aggregate the producers save.
type counter struct {
	aggregate.Root
	Ticks int64
}

func newCounter(id string) *counter { return &counter{Root: aggregate.NewRoot(id)} }

// Apply implements aggregate.Aggregate.
func (c *counter) Apply(event any) {
	if e, ok := event.(ticked); ok {
		c.Ticks = e.N
	}
}

// MarshalSnapshot and UnmarshalSnapshot implement aggregate.Snapshotter: the runs' repositories take snapshots
// (pipelineSnapshotEvery), so a handler's LoadTx stays short however long the run, and the loads read snapshots
// under the faults too.
func (c *counter) MarshalSnapshot() ([]byte, error) { return json.Marshal(c.Ticks) }

// UnmarshalSnapshot implements aggregate.Snapshotter.
func (c *counter) UnmarshalSnapshot(data []byte) error { return json.Unmarshal(data, &c.Ticks) }

// ticked is the n-th event of a counter, raised by save Save.
type ticked struct {
	N    int64  `json:"n"`
	Save string `json:"save"`
}

// tally is the aggregate a handler updates: one Counted event per message it applied.
type tally struct {
	aggregate.Root
	Counted int64
}

func newTally(id string) *tally { return &tally{Root: aggregate.NewRoot(id)} }

// Apply implements aggregate.Aggregate.
func (t *tally) Apply(event any) {
	if _, ok := event.(counted); ok {
		t.Counted++
	}
}

// MarshalSnapshot implements aggregate.Snapshotter.
func (t *tally) MarshalSnapshot() ([]byte, error) { return json.Marshal(t.Counted) }

// UnmarshalSnapshot implements aggregate.Snapshotter.
func (t *tally) UnmarshalSnapshot(data []byte) error { return json.Unmarshal(data, &t.Counted) }

// pipelineSnapshotEvery is how many events apart the pipeline run's repositories take snapshots.
const pipelineSnapshotEvery = 20

// counted is a handler's effect: message Message (a pipeline message ID) of key at Seq.
type counted struct {
	Message string `json:"message"`
	Seq     int64  `json:"seq"`
}

// tickedMessage is the payload of the message staged for each Ticked event.
type tickedMessage struct {
	Key     string `json:"key"`
	Version int64  `json:"version"`
	Save    string `json:"save"`
}

// pipelineID is the ID the checkers give the message of the event at version of key raised by save: the staged
// message's ID is (key, version) alone (staging.MessageID), the same for every attempt at that version, so the
// save is added to tell the messages of a failed attempt from those of the attempt that committed.
func pipelineID(key string, version int64, save string) string {
	return fmt.Sprintf("%s@%d/%s", key, version, save)
}

func tallyID(key string) string { return "tally-" + key }

func partitionTopic(key string, partitions int) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(key))
	return fmt.Sprintf("%s.p%02d", topicPrefix, h.Sum32()%uint32(partitions))
}

func partitionTopics(partitions int) []string {
	out := make([]string, partitions)
	for p := range partitions {
		out[p] = fmt.Sprintf("%s.p%02d", topicPrefix, p)
	}
	return out
}

func newPipelineRegistry() (*aggregate.Registry, error) {
	reg := aggregate.NewRegistry(nil)
	_ = aggregate.RegisterAggregate(reg, counterType, newCounter)
	_ = aggregate.RegisterEvent[ticked](reg, tickedType)
	_ = aggregate.RegisterAggregate(reg, tallyType, newTally)
	_ = aggregate.RegisterEvent[counted](reg, countedType)
	if err := reg.Err(); err != nil {
		return nil, fmt.Errorf("histories: registry: %w", err)
	}
	return reg, nil
}

// newPipelineMapping derives one message per Ticked event, keyed by the counter (the default partition key), on
// the key's partition topic.
func newPipelineMapping(reg *aggregate.Registry, partitions int) (*staging.Mapping, error) {
	m := staging.NewMapping(reg)
	_ = staging.Map(m, mappingName, func(src eventstore.Record, e ticked) ([]staging.Message, error) {
		payload, err := json.Marshal(tickedMessage{Key: src.StreamID, Version: src.Version, Save: e.Save})
		if err != nil {
			return nil, fmt.Errorf("encode: %w", err)
		}
		return []staging.Message{{Topic: partitionTopic(src.StreamID, partitions), Type: messageType,
			Payload: payload}}, nil
	})
	if err := m.Err(); err != nil {
		return nil, fmt.Errorf("histories: mapping: %w", err)
	}
	return m, nil
}
