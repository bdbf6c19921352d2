// Package operations is what a person running durable workflows does with
// them, beside what the engine (internal/workflow) does on its own: find
// them (List and Counts, the list's filters and counts), wait for one to
// end (Waiter: one LISTEN connection per process, woken by the NOTIFY a
// final transition sends), and forget the finished ones after a retention
// period (Janitor, in bounded batches).
//
// It reads and deletes the workflow's tables; it never moves an operation
// from one state to another. That stays the engine's (docs/workflows.md).
package operations
