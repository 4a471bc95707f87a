package dlq_test

import (
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/causet/projection-worker/dlq"
	"github.com/causet/projection-worker/retry"
)

func ExampleFingerprint() {
	// The same bug with different data lands in one group.
	a := `invalid input syntax for type uuid: "user-123" at sequence 1891`
	b := `invalid input syntax for type uuid: "artist-456" at sequence 7`
	fmt.Println(dlq.MaskLiterals(a))
	fmt.Println(dlq.Fingerprint("artist_followers", retry.Permanent, "22P02", a))
	fmt.Println(dlq.Fingerprint("artist_followers", retry.Permanent, "22P02", b))

	// Another projection is another group.
	fmt.Println(dlq.Fingerprint("artist_stats", retry.Permanent, "22P02", a))
	// Output:
	// invalid input syntax for type uuid: "<str>" at sequence <num>
	// 79f879b28df28a86
	// 79f879b28df28a86
	// 8b9880d76e3f8198
}

func ExampleNewRecord() {
	source := &kgo.Record{
		Topic:     "causet.projection-events.v1",
		Partition: 3,
		Offset:    1891,
		Timestamp: time.UnixMilli(1719331200000),
		Key:       []byte("user-123"),
		Value:     []byte(`{"eventType":"ARTIST_FOLLOWED","entityId":"user-123","forkId":"production","tenantSchema":"acme_concertapp_production","irVersion":"v42","sequenceNumber":1891,"ts":1719331200000,"payload":{"user_id":"user-123","artist_id":"artist-456"}}`),
	}
	pgErr := &pgconn.PgError{
		Severity:  "ERROR",
		Code:      "42703",
		Message:   `column "followed_at" of relation "artist_followers" does not exist`,
		TableName: "artist_followers",
	}
	rec, err := dlq.NewRecord(dlq.DeadLetter{
		Source:        source,
		Projection:    "artist_followers",
		TenantSchema:  "acme_concertapp_production",
		ForkID:        "production",
		EventType:     "ARTIST_FOLLOWED",
		Class:         retry.Projection,
		Err:           fmt.Errorf("apply artist_followers: %w", pgErr),
		Retries:       5,
		FirstFailedAt: time.UnixMilli(1719331200123),
	}, dlq.RecordConfig{Worker: "worker-7f9c", Generation: "1.4.0/v42"}, time.UnixMilli(1719331206200))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%s %s\n%s\n", rec.Topic, rec.Key, rec.Value)
	for _, h := range rec.Headers {
		fmt.Printf("%s: %s\n", h.Key, h.Value)
	}
	// Output:
	// causet.projection-dlq.v1 user-123
	// {"originalEvent":{"eventType":"ARTIST_FOLLOWED","entityId":"user-123","forkId":"production","tenantSchema":"acme_concertapp_production","irVersion":"v42","sequenceNumber":1891,"ts":1719331200000,"payload":{"user_id":"user-123","artist_id":"artist-456"}},"projectionName":"artist_followers","tenantSchema":"acme_concertapp_production","error":"ERROR: column \"followed_at\" of relation \"artist_followers\" does not exist (SQLSTATE 42703)","stackTrace":"apply artist_followers: ERROR: column \"followed_at\" of relation \"artist_followers\" does not exist (SQLSTATE 42703) [*fmt.wrapError]\n  ERROR: column \"followed_at\" of relation \"artist_followers\" does not exist (SQLSTATE 42703) [*pgconn.PgError]\n\nTable: artist_followers","retryCount":5,"firstFailedAt":1719331200123,"failedAt":1719331206200}
	// causet.dlq.original-topic: causet.projection-events.v1
	// causet.dlq.original-partition: 3
	// causet.dlq.original-offset: 1891
	// causet.dlq.original-timestamp: 1719331200000
	// causet.dlq.projection: artist_followers
	// causet.dlq.fork-id: production
	// causet.dlq.tenant-schema: acme_concertapp_production
	// causet.dlq.event-type: ARTIST_FOLLOWED
	// causet.dlq.error-class: projection
	// causet.dlq.sqlstate: 42703
	// causet.dlq.fingerprint: 537b419c1e06d9c6
	// causet.dlq.worker: worker-7f9c
	// causet.dlq.generation: 1.4.0/v42
	// causet.dlq.replay-count: 0
}
