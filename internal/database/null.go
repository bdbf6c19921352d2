package database

// Deref is the value a nullable column was scanned into (a *string for a
// text column that may be NULL, say), or T's zero value for NULL. It is
// the one such helper: every package that reads nullable columns uses it.
func Deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
