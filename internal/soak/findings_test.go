package soak

import (
	"fmt"
	"log/slog"
	"sync"
)

// findings collects a soak's violations and stalls as they happen, logging
// each at ERROR ("<prefix>: violation", "<prefix>: stall"). Both soaks embed
// one; read vs and stalls once their goroutines are done.
type findings struct {
	log    *slog.Logger
	prefix string // "soak" or "soak-kafka"

	mu     sync.Mutex
	vs     []Violation
	stalls []string
}

func (f *findings) violate(vs ...Violation) {
	if len(vs) == 0 {
		return
	}
	f.mu.Lock()
	f.vs = append(f.vs, vs...)
	f.mu.Unlock()
	for _, v := range vs {
		f.log.Error(f.prefix+": violation", "violation", v.String())
	}
}

func (f *findings) stall(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	f.mu.Lock()
	f.stalls = append(f.stalls, msg)
	f.mu.Unlock()
	f.log.Error(f.prefix+": stall", "stall", msg)
}
