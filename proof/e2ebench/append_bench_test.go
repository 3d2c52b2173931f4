package e2ebench

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"github.com/stagehand-es/stagehand/aggregate"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
	"github.com/stagehand-es/stagehand/staging"
)

// BenchmarkAppendCost takes the append of BenchmarkEndToEnd apart: 16 closed-loop writers, nothing else running
// (no relay, forwarder or consumer), each way of appending one order in turn for 3 s, three rounds:
//
//   - the append alone (Repository.Save without a stager);
//
//   - stagehand's append: Save with the Transactional strategy (the event and its outbox row);
//
//   - the same two writes by hand: SaveTx and outbox.StageTx in one transaction;
//
//   - the forwarder path's append: SaveTx and watermill-sql's default-schema publish in one transaction.
//
//     go test ./proof/e2ebench -run '^$' -bench AppendCost -benchtime 1x
func BenchmarkAppendCost(b *testing.B) {
	url := pgtest.DurableURL(b)
	_, schema := pgtest.MigratedOn(b, url)
	ctx := context.Background()
	pc, err := pgxpool.ParseConfig(url)
	require.NoError(b, err)
	pc.MaxConns = 32
	pc.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	require.NoError(b, err)
	defer pool.Close()
	store, err := eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: schema})
	require.NoError(b, err)
	defer store.Close()
	ob, err := outbox.New(pool, &outbox.Config{Schema: schema})
	require.NoError(b, err)
	defer ob.Close()
	reg, err := newRegistry()
	require.NoError(b, err)
	mapping, err := newMapping(reg)
	require.NoError(b, err)
	stager, err := staging.New(store, &staging.Config{Strategy: staging.Transactional, Outbox: ob, Mapping: mapping})
	require.NoError(b, err)
	staged, err := aggregate.NewRepository[*Order](store, reg, &aggregate.RepositoryConfig{Stager: stager})
	require.NoError(b, err)
	plain, err := aggregate.NewRepository[*Order](store, reg, nil)
	require.NoError(b, err)
	// The envelope table, created outside the writers' transactions (watermill-sql refuses to in one).
	sub, err := wmsql.NewSubscriber(wmsql.BeginnerFromPgx(pool), wmsql.SubscriberConfig{ConsumerGroup: "append-cost",
		SchemaAdapter: wmsql.DefaultPostgreSQLSchema{}, OffsetsAdapter: wmsql.DefaultPostgreSQLOffsetsAdapter{},
		InitializeSchema: true}, watermill.NopLogger{})
	require.NoError(b, err)
	require.NoError(b, sub.SubscribeInitialize(envelopeTopic))
	require.NoError(b, sub.Close())
	payload := []byte(`{"order_id":"x","phase":0,"sent_at":0,"amount":1999}`)

	type way struct {
		name   string
		append func(ctx context.Context, id string) error
	}
	ways := []way{
		{"append only (Save, no stager)", func(ctx context.Context, id string) error {
			o := plain.New(id)
			aggregate.Raise(o, Placed{Amount: 1999})
			return plain.Save(ctx, o)
		}},
		{"stagehand: Save, Transactional", func(ctx context.Context, id string) error {
			o := staged.New(id)
			aggregate.Raise(o, Placed{Amount: 1999})
			return staged.Save(ctx, o)
		}},
		{"SaveTx + outbox.StageTx", func(ctx context.Context, id string) error {
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				o := plain.New(id)
				aggregate.Raise(o, Placed{Amount: 1999})
				if err := plain.SaveTx(ctx, tx, o); err != nil {
					return err
				}
				_, err := ob.StageTx(ctx, tx, outbox.Message{ID: id, Topic: TopicStagehand, Type: MessageType,
					Payload: payload, PartitionKey: id})
				return err
			})
		}},
		{"forwarder: SaveTx + watermill-sql", func(ctx context.Context, id string) error {
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				o := plain.New(id)
				aggregate.Raise(o, Placed{Amount: 1999})
				if err := plain.SaveTx(ctx, tx, o); err != nil {
					return err
				}
				pub, err := wmsql.NewPublisher(wmsql.TxFromPgx(tx), wmsql.PublisherConfig{
					SchemaAdapter: wmsql.DefaultPostgreSQLSchema{}}, watermill.NopLogger{})
				if err != nil {
					return err
				}
				return forwarder.NewPublisher(pub, forwarder.PublisherConfig{ForwarderTopic: envelopeTopic}).
					Publish(TopicForwarder, message.NewMessage(id, payload))
			})
		}},
	}
	const (
		writers = 16
		rounds  = 3
		each    = 3 * time.Second
	)
	rates := make([]float64, len(ways))
	for round := range rounds * b.N {
		for i := range ways {
			w := ways[(i+round)%len(ways)] // rotate the order, so drift in the machine's load falls on all
			var n atomic.Int64
			end := time.Now().Add(each)
			g, gctx := errgroup.WithContext(ctx)
			for writer := range writers {
				g.Go(func() error {
					for j := 0; time.Now().Before(end); j++ {
						if err := w.append(gctx, fmt.Sprintf("cost-%d-%d-%d-%d", round, (i+round)%len(ways), writer, j)); err != nil {
							return fmt.Errorf("%s: %w", w.name, err)
						}
						n.Add(1)
					}
					return nil
				})
			}
			require.NoError(b, g.Wait())
			rates[(i+round)%len(ways)] += float64(n.Load()) / each.Seconds() / float64(rounds*b.N)
		}
	}
	for i, w := range ways {
		fmt.Printf("APPEND %-36s %6.0f appends/s (%.2fx the append alone)\n", w.name, rates[i], rates[i]/rates[0])
		b.ReportMetric(rates[i], fmt.Sprintf("way%d-appends/s", i+1))
	}
	b.ReportMetric(rates[1]/rates[3], "stagehand/forwarder")
	b.ReportMetric(0, "ns/op")
}
