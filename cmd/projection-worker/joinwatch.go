package main

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/causet/projection-worker/internal/kafkaconn"
	"github.com/causet/projection-worker/projection"
)

// joinWatchInterval is how long the worker may stay out of its consumer
// group before joinWatch asks the brokers why, and how often it asks again.
const joinWatchInterval = 5 * time.Second

// joinWatch finds out why the consumer group is not joined when franz-go
// keeps it to itself: with a SASL password the broker refuses, every request
// of the worker's client fails at connection time, and franz-go logs it and
// retries without end while polls return nothing. While the worker is not
// joined, joinWatch pings the brokers with the worker's own client every
// joinWatchInterval, keeps the failure for /readyz and logs it at ERROR with
// its kafkaconn.Explain cause (again only when the error changes); when
// the brokers answer but the worker's Ready error has such a cause (a
// static member fenced), that is logged the same way.
type joinWatch struct {
	mu  sync.Mutex
	err error // the last ping's error while not joined; nil once joined
}

// run watches w until ctx is done; it returns then.
func (j *joinWatch) run(ctx context.Context, w *projection.Worker, group string, log *slog.Logger) {
	t := time.NewTicker(joinWatchInterval)
	defer t.Stop()
	var logged string
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if w.Joined() {
			j.set(nil)
			logged = ""
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, joinWatchInterval)
		err := w.Client().Ping(pctx)
		cancel()
		if ctx.Err() != nil || errors.Is(err, kgo.ErrClientClosed) {
			return
		}
		j.set(err)
		if err != nil && err.Error() != logged {
			logged = err.Error()
			if cause := kafkaconn.Explain(err); cause != "" {
				log.Error("consumer group not joined: the brokers refuse the worker's connection", "group", group,
					"cause", cause, "error", err)
			} else {
				// Not a refusal the settings explain: a broker down or
				// unreachable (operator trial: "refuse" with an empty
				// cause, for a connection refused).
				log.Error("consumer group not joined: the brokers cannot be reached", "group", group, "error", err)
			}
		}
		// The brokers answer, but the group refuses the worker for a
		// cause the settings explain (a member fenced by another with
		// its --group-instance-id): said once, with the fix.
		if err != nil {
			continue
		}
		if rerr := w.Ready(); rerr != nil && rerr.Error() != logged {
			if cause := kafkaconn.Explain(rerr); cause != "" {
				logged = rerr.Error()
				log.Error("consumer group not joined", "group", group, "cause", cause, "error", rerr)
			}
		}
	}
}

func (j *joinWatch) set(err error) {
	j.mu.Lock()
	j.err = err
	j.mu.Unlock()
}

// reason returns why the brokers refuse the worker's connection, as
// "cause: error" (kafkaconn.Explain), or "" when the last ping succeeded or
// the worker is joined.
func (j *joinWatch) reason() string {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.err == nil {
		return ""
	}
	if cause := kafkaconn.Explain(j.err); cause != "" {
		return cause + ": " + j.err.Error()
	}
	// As the ERROR line says it (second operator trial: /readyz gave the
	// dial error alone, after the poll's own text of it).
	return "the brokers cannot be reached: " + j.err.Error()
}
