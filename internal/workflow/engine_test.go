package workflow

import (
	"slices"
	"testing"
)

// Types come in one order, every time (fourth read: the operations page's
// Kind filter reshuffled its options on every load — a map's order).
func TestTypesAreSorted(t *testing.T) {
	e := &Engine{defs: map[string]*Definition{"CANCEL_DEPOSIT": nil, "BOOK_DEPOSIT": nil, "CANCEL": nil, "A": nil, "Z": nil}}
	for range 20 {
		if got := e.Types(); !slices.IsSorted(got) || len(got) != 5 {
			t.Fatalf("Types() = %v, want the five sorted", got)
		}
	}
}
