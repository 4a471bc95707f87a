//go:build tools

// Package tools pins dependencies that packages are about to use; it is removed once they do.
package tools
import (
 _ "github.com/twmb/franz-go/pkg/kgo"
 _ "github.com/twmb/franz-go/pkg/kadm"
 _ "github.com/twmb/franz-go/pkg/kfake"
 _ "github.com/twmb/franz-go/plugin/kotel"
 _ "github.com/twmb/franz-go/plugin/kslog"
 _ "github.com/jackc/pgx/v5/pgxpool"
 _ "github.com/cenkalti/backoff/v4"
 _ "github.com/segmentio/encoding/json"
 _ "go.opentelemetry.io/otel"
 _ "go.opentelemetry.io/otel/sdk/metric"
 _ "go.opentelemetry.io/otel/sdk/trace"
 _ "go.opentelemetry.io/otel/exporters/prometheus"
 _ "go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
 _ "go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
 _ "github.com/prometheus/client_golang/prometheus/promhttp"
 _ "github.com/google/cel-go/cel"
 _ "github.com/santhosh-tekuri/jsonschema/v6"
 _ "gopkg.in/yaml.v3"
 _ "github.com/google/go-cmp/cmp"
 _ "github.com/schollz/progressbar/v3"
)
