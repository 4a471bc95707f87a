package bench

import (
	"context"
	"strconv"

	"github.com/twmb/franz-go/pkg/kgo"
)

// The inline schemas (JsonConverter, schemas.enable=true) of the flat records
// that Kafka Connect's JDBC sink writes, one per table of
// testdata/projections.yaml, with the columns the worker writes (_causet_seq is
// the event's sequence number). Timestamps are Connect's Timestamp (ms since
// the Unix epoch); device is Debezium's Json, which the sink binds as jsonb.
const (
	tsField       = `"type":"int64","name":"org.apache.kafka.connect.data.Timestamp","version":1`
	followersHead = `{"schema":{"type":"struct","name":"artist_followers","fields":[` +
		`{"field":"artist_id","type":"string","optional":false},` +
		`{"field":"user_id","type":"string","optional":false},` +
		`{"field":"followed_at",` + tsField + `,"optional":true},`
	followersTail = `{"field":"source","type":"string","optional":true},` +
		`{"field":"_causet_seq","type":"int64","optional":false}]},"payload":{`
	followersSchema = followersHead + `{"field":"score","type":"int64","optional":true},` + followersTail
	// poisonedFollowersSchema: the score of a poisoned event (games 0) cannot
	// be computed; its record carries the text "NaN", which the bigint column
	// rejects.
	poisonedFollowersSchema = followersHead + `{"field":"score","type":"string","optional":true},` + followersTail
	followsSchema           = `{"schema":{"type":"struct","name":"user_follows","fields":[` +
		`{"field":"user_id","type":"string","optional":false},` +
		`{"field":"artist_id","type":"string","optional":false},` +
		`{"field":"fork_id","type":"string","optional":false},` +
		`{"field":"followed_at",` + tsField + `,"optional":false},` +
		`{"field":"tier","type":"string","optional":true},` +
		`{"field":"device","type":"string","name":"io.debezium.data.Json","version":1,"optional":true},` +
		`{"field":"_causet_seq","type":"int64","optional":false}]},"payload":{`
	ratingsSchema = `{"schema":{"type":"struct","name":"artist_ratings","fields":[` +
		`{"field":"artist_id","type":"string","optional":false},` +
		`{"field":"user_id","type":"string","optional":false},` +
		`{"field":"stars","type":"int32","optional":false},` +
		`{"field":"review","type":"string","optional":true},` +
		`{"field":"rated_at",` + tsField + `,"optional":true},` +
		`{"field":"_causet_seq","type":"int64","optional":false}]},"payload":{`
)

// appendRow appends the flat record of e's row in table t (an index into
// tableNames), the row the worker's definitions make of e, as JSON with its
// schema.
func appendRow(b []byte, e *event, t int) []byte {
	n := names()
	user, artist := n.users[e.user], n.artists[e.artist]
	str := func(b []byte, field, v string) []byte {
		b = append(b, '"')
		b = append(b, field...)
		b = append(b, `":`...)
		return strconv.AppendQuote(b, v)
	}
	num := func(b []byte, field string, v int64) []byte {
		b = append(b, '"')
		b = append(b, field...)
		b = append(b, `":`...)
		return strconv.AppendInt(b, v, 10)
	}
	switch t {
	case 0: // artist_followers
		if e.poisonedPair(projFollowers) {
			b = append(b, poisonedFollowersSchema...)
		} else {
			b = append(b, followersSchema...)
		}
		b = str(b, "artist_id", artist)
		b = str(append(b, ','), "user_id", user)
		b = num(append(b, ','), "followed_at", e.ts)
		if e.poisonedPair(projFollowers) {
			b = str(append(b, ','), "score", "NaN")
		} else {
			b = num(append(b, ','), "score", e.points/int64(e.games))
		}
		b = str(append(b, ','), "source", sources[e.source])
	case 1: // user_follows
		tier := "free"
		if e.tier >= 0 {
			tier = tiers[e.tier]
		}
		b = append(b, followsSchema...)
		b = str(b, "user_id", user)
		b = str(append(b, ','), "artist_id", artist)
		b = str(append(b, ','), "fork_id", "production")
		b = num(append(b, ','), "followed_at", e.ts)
		b = str(append(b, ','), "tier", tier)
		b = str(append(b, ','), "device", devices[e.device])
	default: // artist_ratings
		b = append(b, ratingsSchema...)
		b = str(b, "artist_id", artist)
		b = str(append(b, ','), "user_id", user)
		b = num(append(b, ','), "stars", int64(e.stars))
		b = str(append(b, ','), "review", e.reviewText())
		b = num(append(b, ','), "rated_at", e.ts)
	}
	b = num(append(b, ','), "_causet_seq", e.seq)
	return append(b, "}}"...)
}

// produceRows writes the flat records of d's rows to topics (one per table, in
// tableNames order), with the events' partitioning (user mod 8), key
// (entityId) and order, and waits until all are acked. Poisoned rows are
// written too, as the rejected values of appendRow.
func produceRows(ctx context.Context, opts []kgo.Opt, topics [tables]string, d *dataset) error {
	n := names()
	return produceRecords(ctx, opts, func(emit func(*kgo.Record)) {
		for i := range d.events {
			e := &d.events[i]
			rows := []int{2}
			if e.typ == followed {
				rows = []int{0, 1}
			}
			for _, t := range rows {
				emit(&kgo.Record{
					Topic:     topics[t],
					Partition: e.partition(),
					Key:       []byte(n.users[e.user]),
					Value:     appendRow(make([]byte, 0, 1024), e, t),
				})
			}
		}
	})
}
