package eventstore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/eventstore"
)

func appendN(t *testing.T, s eventstore.Store, stream string, n int) {
	t.Helper()
	evs := make([]eventstore.EventData, n)
	for i := range evs {
		evs[i] = eventstore.EventData{Type: "e", Payload: []byte(`{}`), Metadata: eventstore.Metadata{"k": "v"}}
	}
	_, err := s.Append(context.Background(), eventstore.AppendRequest{StreamID: stream, StreamType: "t",
		Expected: eventstore.AnyVersion, Events: evs})
	require.NoError(t, err)
}

func setMetadata(t *testing.T, s *eventstore.PostgresStore, stream string, version int64, meta string) {
	t.Helper()
	_, err := s.Pool().Exec(context.Background(), `UPDATE `+pgx.Identifier{s.Schema(), "events"}.Sanitize()+
		` SET metadata = $3::jsonb WHERE stream_id = $1 AND version = $2`, stream, version, meta)
	require.NoError(t, err)
}

// A metadata value that is not a string (which any SQL tool can write) is read as its JSON text, by ReadLog and
// ReadStream alike: it no longer fails every page that contains it.
func TestNonStringMetadataIsReadAsJSONText(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newPostgres(t)
	appendN(t, s, "a", 3)
	setMetadata(t, s, "a", 2, `{"retries": 1, "ok": true, "nested": {"x": [1, "y"]}, "s": "v"}`)
	want := eventstore.Metadata{"retries": "1", "ok": "true", "nested": `{"x":[1,"y"]}`, "s": "v"}

	page, err := s.ReadLog(ctx, eventstore.LogQuery{})
	require.NoError(t, err)
	require.Len(t, page.Records, 3)
	require.Equal(t, want, page.Records[1].Metadata)
	recs, err := s.ReadStream(ctx, "", "a", 1)
	require.NoError(t, err)
	require.Equal(t, want, recs[1].Metadata)
}

// Metadata that is not a JSON object cannot be read. ReadLog hands out the events before it, then reports that
// event alone as a *RecordError naming its stream, version and position, and reads on past it; ReadStream returns
// the same typed error.
func TestCorruptRecordIsReportedAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newPostgres(t)
	appendN(t, s, "a", 4)
	setMetadata(t, s, "a", 3, `[1, 2]`)

	page, err := s.ReadLog(ctx, eventstore.LogQuery{})
	require.NoError(t, err)
	require.Len(t, page.Records, 2, "the events before the corrupt one")
	require.Equal(t, page.Records[1].Position, page.Last)

	_, err = s.ReadLog(ctx, eventstore.LogQuery{After: page.Last})
	require.ErrorIs(t, err, eventstore.ErrCorruptRecord)
	var re *eventstore.RecordError
	require.True(t, errors.As(err, &re))
	require.Equal(t, "a", re.Record.StreamID)
	require.Equal(t, int64(3), re.Record.Version)
	require.Equal(t, page.Last+1, re.Record.Position)
	require.Equal(t, "e", re.Record.Type)
	require.JSONEq(t, `{}`, string(re.Record.Payload))
	require.ErrorContains(t, err, `stream "a" version 3`)

	rest, err := s.ReadLog(ctx, eventstore.LogQuery{After: re.Record.Position})
	require.NoError(t, err)
	require.Len(t, rest.Records, 1)
	require.Equal(t, int64(4), rest.Records[0].Version)

	// A filter that leaves the corrupt event out never reads its metadata.
	filtered, err := s.ReadLog(ctx, eventstore.LogQuery{StreamTypes: []string{"other"}})
	require.NoError(t, err)
	require.Equal(t, rest.Records[0].Position, filtered.Last)

	_, err = s.ReadStream(ctx, "", "a", 1)
	require.ErrorIs(t, err, eventstore.ErrCorruptRecord)
	require.True(t, errors.As(err, &re))
	require.Equal(t, int64(3), re.Record.Version)
}

// A payload that is not JSON, or one jsonb cannot hold, fails with ErrInvalidAppend naming the stream and the
// event, not with SQLSTATE 22P02 / 22P05; the stream is left as it was, and a transaction stays usable.
func TestAppendOfBadPayloadIsTyped(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newPostgres(t)
	for _, payload := range []string{`not json`, `{"a": "\u0000"}`} {
		for _, n := range []int{1, 2} {
			evs := []eventstore.EventData{{Type: "ok", Payload: []byte(`{}`)}, {Type: "bad", Payload: []byte(payload)}}
			_, err := s.Append(ctx, eventstore.AppendRequest{StreamID: "p", Expected: eventstore.AnyVersion,
				Events: evs[2-n:]})
			require.ErrorIs(t, err, eventstore.ErrInvalidAppend, payload)
			require.ErrorContains(t, err, `(type "bad") of stream "p"`)
			require.NotContains(t, err.Error(), "SQLSTATE")
		}
	}
	_, err := s.ReadStream(ctx, "", "p", 1)
	require.ErrorIs(t, err, eventstore.ErrStreamNotFound)
}

// Stored metadata is read by one rule whatever its length: a JSON object is metadata, JSON null or {} is none, and
// anything else (a two-byte 42 or [] as much as 420 or ["x", 1]) is a *RecordError, from ReadLog and ReadStream
// alike.
func TestMetadataReadingRuleHoldsForEveryLength(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cases := []struct {
		stored string
		want   eventstore.Metadata // nil: no metadata
		bad    bool
	}{
		{stored: `{}`}, {stored: `null`},
		{stored: `{"a": "b"}`, want: eventstore.Metadata{"a": "b"}},
		{stored: `{"n": 1}`, want: eventstore.Metadata{"n": "1"}},
		{stored: `42`, bad: true}, {stored: `[]`, bad: true}, {stored: `""`, bad: true}, {stored: `1`, bad: true},
		{stored: `420`, bad: true}, {stored: `["x", 1]`, bad: true}, {stored: `"s"`, bad: true},
		{stored: `true`, bad: true},
	}
	s := newPostgres(t)
	for i, tc := range cases {
		stream := fmt.Sprintf("s%d", i)
		appendN(t, s, stream, 1)
		setMetadata(t, s, stream, 1, tc.stored)
	}
	for i, tc := range cases {
		stream := fmt.Sprintf("s%d", i)
		page, logErr := s.ReadLog(ctx, eventstore.LogQuery{After: int64(i), Limit: 1})
		recs, streamErr := s.ReadStream(ctx, "", stream, 1)
		if tc.bad {
			var re *eventstore.RecordError
			require.True(t, errors.As(logErr, &re), "ReadLog of metadata %s: %v", tc.stored, logErr)
			require.Equal(t, stream, re.Record.StreamID)
			require.True(t, errors.As(streamErr, &re), "ReadStream of metadata %s: %v", tc.stored, streamErr)
			require.ErrorIs(t, streamErr, eventstore.ErrCorruptRecord)
			continue
		}
		require.NoError(t, logErr, tc.stored)
		require.NoError(t, streamErr, tc.stored)
		require.Len(t, page.Records, 1)
		require.Equal(t, stream, page.Records[0].StreamID)
		require.Equal(t, tc.want, page.Records[0].Metadata, tc.stored)
		require.Equal(t, tc.want, recs[0].Metadata, tc.stored)
	}
}
