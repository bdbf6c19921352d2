package users_test

import (
	"bytes"
	"context"
	"sync"
	"testing"

	"github.com/idemlab/idemlab/internal/testdb"
	"github.com/idemlab/idemlab/internal/users"
)

// Replicas starting together all ask for the secret at once: one makes it,
// every one reads the same 32 bytes, and asking again changes nothing.
func TestServerSecretIsMadeOnceForEveryone(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	st := users.NewStore(db.Pool)
	const n = 8
	got := make([][]byte, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			got[i], errs[i] = st.ServerSecret(context.Background(), "session")
		}()
	}
	close(start)
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("caller %d: %v", i, errs[i])
		}
		if len(got[i]) != 32 || !bytes.Equal(got[i], got[0]) {
			t.Fatalf("caller %d got %x, caller 0 %x", i, got[i], got[0])
		}
	}
	again, err := st.ServerSecret(context.Background(), "session")
	if err != nil || !bytes.Equal(again, got[0]) {
		t.Fatalf("asked again: %x, %v", again, err)
	}
	var rows int
	db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM server_secrets`).Scan(&rows)
	if rows != 1 {
		t.Fatalf("%d secrets stored", rows)
	}
}
