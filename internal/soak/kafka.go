package soak

import (
	"context"
	"fmt"
	"net/url"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Uncommitted returns one line for each partition of topic that group has
// not committed to its end ("partition 3 committed 10 of 12", -1 for no
// commit); none when every partition is drained and committed.
func Uncommitted(ctx context.Context, adm *kadm.Client, topic, group string) ([]string, error) {
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("end offsets of %s: %w", topic, err)
	}
	committed, err := adm.FetchOffsets(ctx, group)
	if err != nil {
		return nil, fmt.Errorf("committed offsets of %s: %w", group, err)
	}
	var behind []string
	ends.Each(func(e kadm.ListedOffset) {
		c, ok := committed.Lookup(e.Topic, e.Partition)
		if e.Offset > 0 && (!ok || c.At < e.Offset) {
			at := int64(-1)
			if ok {
				at = c.At
			}
			behind = append(behind, fmt.Sprintf("partition %d committed %d of %d", e.Partition, at, e.Offset))
		}
	})
	return behind, nil
}

// Committed returns group's committed offset of each partition of topic.
func Committed(ctx context.Context, adm *kadm.Client, topic, group string) (map[int32]int64, error) {
	offs, err := adm.FetchOffsets(ctx, group)
	if err == nil {
		err = offs.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("committed offsets of %s: %w", group, err)
	}
	out := map[int32]int64{}
	offs.Each(func(o kadm.OffsetResponse) {
		if o.Topic == topic {
			out[o.Partition] = o.At
		}
	})
	return out, nil
}

// RecordDeadLetter is ParseDeadLetter of a record read from the
// dead-letter topic.
func RecordDeadLetter(r *kgo.Record) (DeadLetter, error) {
	hs := make([][2]string, len(r.Headers))
	for i, h := range r.Headers {
		hs[i] = [2]string{h.Key, string(h.Value)}
	}
	return ParseDeadLetter(r.Key, r.Value, hs)
}

// CreateDatabase creates the database name on the server of baseURL (a
// soak's own, so that its tenant schemas and settings touch no other test)
// and returns its URL and a pool for the checks: direct, never read-only,
// no statement timeout, time zone UTC, whatever the database's defaults
// become.
func CreateDatabase(ctx context.Context, baseURL, name string) (string, Database, error) {
	admin, err := pgx.Connect(ctx, baseURL)
	if err != nil {
		return "", Database{}, err
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+ident(name)); err != nil {
		return "", Database{}, fmt.Errorf("create database %s: %w", name, err)
	}
	u, err := url.Parse(baseURL)
	if err != nil {
		return "", Database{}, err
	}
	u.Path = "/" + name
	cfg, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		return "", Database{}, err
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = "soak-checker"
	cfg.ConnConfig.RuntimeParams["default_transaction_read_only"] = "off"
	cfg.ConnConfig.RuntimeParams["statement_timeout"] = "0"
	cfg.ConnConfig.RuntimeParams["TimeZone"] = "UTC"
	cfg.MaxConns = 6
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return "", Database{}, err
	}
	return u.String(), Database{Pool: pool}, nil
}

// DropDatabase drops the database name on the server of baseURL, whoever is
// connected to it.
func DropDatabase(ctx context.Context, baseURL, name string) error {
	admin, err := pgx.Connect(ctx, baseURL)
	if err != nil {
		return err
	}
	defer admin.Close(ctx)
	_, err = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+ident(name)+" WITH (FORCE)")
	return err
}

// AddFinal puts the final checks' counts and violations in the report.
func (r *Report) AddFinal(f Final) {
	r.Lost, r.Unprocessed = f.Lost, f.Unprocessed
	r.DeadLetters, r.DeadLettersByCause = f.DeadLetters, f.ByCause
	r.GoodDeadLettered, r.ExpectedGoodDeadLettered = f.GoodDeadLettered, f.ExpectedGoodDeadLettered
	r.Duplicates, r.InFlightDuplicates = f.Duplicates, f.InFlightDuplicates
	r.RewoundDuplicates, r.TimedOutDuplicates = f.RewoundDuplicates, f.TimedOutDuplicates
	r.Violations = append(r.Violations, f.Violations...)
}
