package main

import (
	"errors"
	"strings"
	"testing"
)

// TestExitCodePrefixesEveryLine: a runtime error of several lines (the
// errors.Join of a shutdown: a commit and leaving the group) is printed
// with each line after "projection-worker: " (new-user trial: its second
// line came bare into the JSON log stream), exit 1.
func TestExitCodePrefixesEveryLine(t *testing.T) {
	var b strings.Builder
	err := errors.Join(errors.New("commit offsets at shutdown: context deadline exceeded"), errors.New("leave group: shutdown grace of 25s exceeded"))
	if code := exitCode(err, &b); code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	want := "projection-worker: commit offsets at shutdown: context deadline exceeded\nprojection-worker: leave group: shutdown grace of 25s exceeded\n"
	if b.String() != want {
		t.Errorf("printed %q, want %q", b.String(), want)
	}
}
