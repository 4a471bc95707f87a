package main

import (
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/causet/projection-worker/internal/kafkatest"
	"github.com/causet/projection-worker/internal/pgtest"
	"github.com/causet/projection-worker/projection"
)

// TestRunFetchCaps: the worker's fetch requests carry --fetch-max-bytes
// and --fetch-max-partition-bytes (FETCH_MAX_BYTES and
// FETCH_MAX_PARTITION_BYTES), and the defaults without them, as the broker
// reads them off the wire (SRE trial: with records that compress 100:1 the
// fixed 16 MiB / 1 MiB caps took ~490 MiB, and nothing lowered them).
func TestRunFetchCaps(t *testing.T) {
	tests := []struct {
		name            string
		args, env       []string
		total, perTopic int32
	}{
		{name: "defaults", total: projection.DefaultFetchMaxBytes, perTopic: projection.DefaultFetchMaxPartitionBytes},
		{name: "flags", args: []string{"--fetch-max-bytes", "262144", "--fetch-max-partition-bytes", "16384"}, total: 262144, perTopic: 16384},
		{name: "environment", env: []string{"FETCH_MAX_BYTES=131072", "FETCH_MAX_PARTITION_BYTES=8192"}, total: 131072, perTopic: 8192},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, kv := range tt.env {
				k, v, _ := strings.Cut(kv, "=")
				t.Setenv(k, v)
			}
			b := kafkatest.Fake(t)
			events := kafkatest.TopicName(t, "events")
			var mu sync.Mutex
			var seen []string // "<max bytes>/<partition max bytes>" of each fetch of events
			b.Fake.ControlKey(int16(kmsg.Fetch), func(req kmsg.Request) (kmsg.Response, error, bool) {
				b.Fake.KeepControl()
				fr := req.(*kmsg.FetchRequest)
				for _, ft := range fr.Topics {
					for _, fp := range ft.Partitions {
						mu.Lock()
						seen = append(seen, strconv.Itoa(int(fr.MaxBytes))+"/"+strconv.Itoa(int(fp.PartitionMaxBytes)))
						mu.Unlock()
					}
				}
				return nil, nil, false
			})
			b.CreateTopic(t, events, 3, nil)
			w := startRun(t, append([]string{
				"--brokers", strings.Join(b.Addrs, ","), "--database-url", pgtest.URL(t),
				"--projections", exampleProjections, "--topic", events,
				"--dlq-topic", kafkatest.TopicName(t, "dlq"), "--ledger-topic", kafkatest.TopicName(t, "ledger"),
				"--group", kafkatest.TopicName(t, "group")}, tt.args...)...)
			w.waitFor(t, "fetches of 3 partitions", 30*time.Second, func() bool {
				mu.Lock()
				defer mu.Unlock()
				return len(seen) >= 3
			})
			want := strconv.Itoa(int(tt.total)) + "/" + strconv.Itoa(int(tt.perTopic))
			mu.Lock()
			for _, got := range seen {
				if got != want {
					t.Errorf("a fetch asked for %s bytes (total/partition), want %s", got, want)
				}
			}
			mu.Unlock()
			// The client fetches as soon as the group assigns its
			// partitions, which can be before the started line is written
			// (CI: checked at once, it was not there yet).
			line := "fetch_max_bytes=" + strconv.Itoa(int(tt.total)) + " fetch_max_partition_bytes=" + strconv.Itoa(int(tt.perTopic))
			w.waitFor(t, "the started line saying "+line, 10*time.Second, func() bool { return w.logged(line) })
			w.shutdown(t)
		})
	}
}
