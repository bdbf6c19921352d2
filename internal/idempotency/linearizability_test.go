package idempotency

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/testdb"
)

// The key store is linearizable: clients calling Claim, TakeOver, Complete,
// EndLease (a lease ending: what a dead owner's does by running out) and
// Lookup at the same time on the same keys, each call in its own committed
// transaction against PostgreSQL, produce a history that some one-at-a-time
// order of the same calls explains, under the sequential model below. The
// history is recorded for real and checked with porcupine.

// The model: one key's state. A key is absent, IN_PROGRESS (its owner's
// token, whether its lease is over, the request's fingerprint) or
// COMPLETED (the stored answer, forever the same).
type keyModel struct {
	Status  string // "", StatusInProgress, StatusCompleted
	Owner   string // IN_PROGRESS: the owner token
	Expired bool   // IN_PROGRESS: the lease is over
	FP      string
	Answer  string // COMPLETED: the stored body
}

type opKind int

const (
	opClaim opKind = iota
	opTakeOver
	opComplete
	opEndLease
	opLookup
)

var opNames = map[opKind]string{opClaim: "claim", opTakeOver: "take-over", opComplete: "complete", opEndLease: "end-lease", opLookup: "lookup"}

type keyInput struct {
	Key    string
	Kind   opKind
	FP     string // claim, take-over
	Token  string // complete, end-lease: the claim the client holds
	Answer string // complete
}

type keyOutput struct {
	OK    bool   // claim / take-over won, complete / end-lease applied
	Token string // claim / take-over: the new owner token
	// lookup: the row as read
	Status  string
	Expired bool
	FP      string
	Answer  string
	Err     string // an error the model does not allow: fails the check
}

var keyStoreModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		var keys []string
		for _, op := range history {
			k := op.Input.(keyInput).Key
			if _, ok := byKey[k]; !ok {
				keys = append(keys, k)
			}
			byKey[k] = append(byKey[k], op)
		}
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, byKey[k])
		}
		return out
	},
	Init: func() any { return keyModel{} },
	Step: func(state, input, output any) (bool, any) {
		s, in, out := state.(keyModel), input.(keyInput), output.(keyOutput)
		if out.Err != "" {
			return false, s
		}
		switch in.Kind {
		case opClaim: // INSERT … ON CONFLICT DO NOTHING: the first one wins, whoever else is there
			if s.Status == "" {
				return out.OK && out.Token != "", keyModel{Status: StatusInProgress, Owner: out.Token, FP: in.FP}
			}
			return !out.OK, s
		case opTakeOver: // only the same request, only from an owner whose lease is over
			if s.Status == StatusInProgress && s.Expired && s.FP == in.FP {
				return out.OK && out.Token != "" && out.Token != s.Owner, keyModel{Status: StatusInProgress, Owner: out.Token, FP: s.FP}
			}
			return !out.OK, s
		case opComplete: // fenced by the owner token, not by time
			if s.Status == StatusInProgress && s.Owner == in.Token {
				return out.OK, keyModel{Status: StatusCompleted, FP: s.FP, Answer: in.Answer}
			}
			return !out.OK, s
		case opEndLease:
			if s.Status == StatusInProgress && s.Owner == in.Token {
				next := s
				next.Expired = true
				return out.OK, next
			}
			return !out.OK, s
		case opLookup:
			switch s.Status {
			case "":
				return out.Status == "", s
			case StatusInProgress:
				return out.Status == StatusInProgress && out.Expired == s.Expired && out.FP == s.FP, s
			default: // a completed key replays the same answer every time (invariant 5)
				return out.Status == StatusCompleted && out.Answer == s.Answer && out.FP == s.FP, s
			}
		}
		return false, s
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(keyInput), output.(keyOutput)
		switch {
		case out.Err != "":
			return fmt.Sprintf("%s → error %s", opNames[in.Kind], out.Err)
		case in.Kind == opLookup:
			return fmt.Sprintf("lookup → %q expired=%v %s", out.Status, out.Expired, out.Answer)
		case in.Kind == opClaim || in.Kind == opTakeOver:
			return fmt.Sprintf("%s(%s) → %v %s", opNames[in.Kind], in.FP, out.OK, short8(out.Token))
		default:
			return fmt.Sprintf("%s(%s %s) → %v", opNames[in.Kind], short8(in.Token), in.Answer, out.OK)
		}
	},
	DescribeState: func(state any) string {
		s := state.(keyModel)
		return fmt.Sprintf("%q owner=%s expired=%v fp=%s answer=%s", s.Status, short8(s.Owner), s.Expired, s.FP, s.Answer)
	},
}

func short8(s string) string {
	if len(s) > 8 {
		return s[:8]
	}
	return s
}

// keyClient runs one call against the real store, each in its own
// committed transaction, as a workflow would.
type keyClient struct {
	store  *Store
	userID int64
}

func (kc keyClient) run(ctx context.Context, in keyInput, held map[string]*Claim) keyOutput {
	var out keyOutput
	fail := func(err error) keyOutput { return keyOutput{Err: err.Error()} }
	switch in.Kind {
	case opClaim, opTakeOver:
		var c *Claim
		err := pgx.BeginFunc(ctx, kc.store.pool, func(tx pgx.Tx) error {
			var err error
			if in.Kind == opClaim {
				c, err = kc.store.Claim(ctx, tx, kc.userID, in.Key, fingerprintOf(in.FP))
			} else {
				c, err = kc.store.TakeOver(ctx, tx, kc.userID, in.Key, fingerprintOf(in.FP))
			}
			return err
		})
		if err != nil {
			return fail(err)
		}
		if c != nil {
			out.OK, out.Token = true, hex.EncodeToString(c.token[:])
			held[out.Token] = c
		}
	case opComplete:
		err := pgx.BeginFunc(ctx, kc.store.pool, func(tx pgx.Tx) error {
			return held[in.Token].Complete(ctx, tx, Response{Status: 200, Body: []byte(in.Answer)})
		})
		switch {
		case err == nil:
			out.OK = true
		case !errors.Is(err, ErrLeaseLost):
			return fail(err)
		}
	case opEndLease:
		err := kc.store.EndLease(ctx, held[in.Token])
		switch {
		case err == nil:
			out.OK = true
		case !errors.Is(err, ErrLeaseLost):
			return fail(err)
		}
	case opLookup:
		rec, err := kc.store.Lookup(ctx, kc.userID, in.Key)
		switch {
		case errors.Is(err, ErrNotFound):
		case err != nil:
			return fail(err)
		default:
			out.Status, out.FP = rec.Status, fingerprintName(rec.Fingerprint)
			if rec.Status == StatusInProgress {
				out.Expired = rec.LeaseExpired
			} else {
				out.Answer = string(rec.Response.Body)
			}
		}
	}
	return out
}

// The two requests a key is used for, named in the model, hashed in the store.
var fingerprints = map[string][]byte{
	"fp-a": Fingerprint(Request{Method: "POST", Route: "/a"}),
	"fp-b": Fingerprint(Request{Method: "POST", Route: "/b"}),
}

func fingerprintOf(name string) []byte { return fingerprints[name] }

func fingerprintName(fp []byte) string {
	for name, b := range fingerprints {
		if bytes.Equal(b, fp) {
			return name
		}
	}
	return hex.EncodeToString(fp)
}

// recordHistory runs clients × steps random calls on keys and returns the
// history. Each client keeps the claims it won and uses them (and, now and
// then, one that is no longer current) to complete or give up a lease.
func recordHistory(t *testing.T, store *Store, userID int64, clients, steps int, keys []string, seed uint64) []porcupine.Operation {
	t.Helper()
	ctx := context.Background()
	var mu sync.Mutex
	var history []porcupine.Operation
	start := time.Now()
	var wg sync.WaitGroup
	release := make(chan struct{})
	for id := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(id)))
			kc := keyClient{store: store, userID: userID}
			held := map[string]*Claim{} // token → claim
			var tokens []keyInput       // key and token of each claim won
			<-release
			for n := range steps {
				in := keyInput{Key: keys[rng.IntN(len(keys))]}
				switch r := rng.IntN(20); {
				case r < 6:
					in.Kind, in.FP = opClaim, []string{"fp-a", "fp-b"}[rng.IntN(2)]
				case r < 9:
					in.Kind, in.FP = opTakeOver, []string{"fp-a", "fp-b"}[rng.IntN(2)]
				case r < 11 && len(tokens) > 0:
					h := tokens[rng.IntN(len(tokens))]
					in.Kind, in.Key, in.Token, in.Answer = opComplete, h.Key, h.Token, fmt.Sprintf("answer-%d-%d", id, n)
				case r < 15 && len(tokens) > 0:
					h := tokens[rng.IntN(len(tokens))]
					in.Kind, in.Key, in.Token = opEndLease, h.Key, h.Token
				default:
					in.Kind = opLookup
				}
				call := time.Since(start).Nanoseconds()
				out := kc.run(ctx, in, held)
				ret := time.Since(start).Nanoseconds()
				if out.OK && out.Token != "" {
					tokens = append(tokens, keyInput{Key: in.Key, Token: out.Token})
				}
				mu.Lock()
				history = append(history, porcupine.Operation{ClientId: id, Input: in, Call: call, Output: out, Return: ret})
				mu.Unlock()
			}
		}()
	}
	close(release)
	wg.Wait()
	return history
}

func TestKeyStoreIsLinearizable(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	var userID int64
	if err := db.Pool.QueryRow(context.Background(), `
		INSERT INTO users (name, api_token_sha256)
		VALUES ('porcupine', sha256('porcupine'::bytea))
		RETURNING id`).Scan(&userID); err != nil {
		t.Fatal(err)
	}
	store := NewStore(db.Pool, time.Hour, 24*time.Hour) // leases end only by EndLease
	for round := range 3 {
		var keys []string
		for k := range 8 {
			keys = append(keys, fmt.Sprintf("r%d-k%d", round, k))
		}
		history := recordHistory(t, store, userID, 8, 60, keys, uint64(round)+1)
		counts := map[opKind]int{}
		won := 0
		for _, op := range history {
			counts[op.Input.(keyInput).Kind]++
			if out := op.Output.(keyOutput); out.OK {
				won++
			}
		}
		res, info := porcupine.CheckOperationsVerbose(keyStoreModel, history, time.Minute)
		if res != porcupine.Ok {
			path := filepath.Join(os.TempDir(), fmt.Sprintf("idemlab-keystore-history-%d.html", round))
			if err := porcupine.VisualizePath(keyStoreModel, info, path); err == nil {
				t.Logf("the history, drawn: %s", path)
			}
			logIllegalKey(t, history)
			t.Fatalf("round %d: the key store's history is not linearizable (%s)", round, res)
		}
		t.Logf("round %d: %d calls (%d claims, %d take-overs, %d completes, %d lease ends, %d lookups; %d succeeded): linearizable",
			round, len(history), counts[opClaim], counts[opTakeOver], counts[opComplete], counts[opEndLease], counts[opLookup], won)
	}
}

// logIllegalKey logs, in call order, the calls of the first key whose
// history no sequential order explains.
func logIllegalKey(t *testing.T, history []porcupine.Operation) {
	t.Helper()
	for _, part := range keyStoreModel.Partition(history) {
		if porcupine.CheckOperations(keyStoreModel, part) {
			continue
		}
		sort.Slice(part, func(i, j int) bool { return part[i].Call < part[j].Call })
		for _, op := range part {
			t.Logf("client %d [%d µs, %d µs] %s", op.ClientId, op.Call/1000, op.Return/1000, keyStoreModel.DescribeOperation(op.Input, op.Output))
		}
		return
	}
}

// The checker is not vacuous: histories that break the model's rules are
// refused.
func TestKeyStoreModelRefusesImpossibleHistories(t *testing.T) {
	t.Parallel()
	op := func(client int, call, ret int64, in keyInput, out keyOutput) porcupine.Operation {
		return porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: ret}
	}
	for name, h := range map[string][]porcupine.Operation{
		"two owners at once": {
			op(0, 0, 1, keyInput{Key: "k", Kind: opClaim, FP: "a"}, keyOutput{OK: true, Token: "t1"}),
			op(1, 2, 3, keyInput{Key: "k", Kind: opClaim, FP: "a"}, keyOutput{OK: true, Token: "t2"}),
		},
		"take-over from a live owner": {
			op(0, 0, 1, keyInput{Key: "k", Kind: opClaim, FP: "a"}, keyOutput{OK: true, Token: "t1"}),
			op(1, 2, 3, keyInput{Key: "k", Kind: opTakeOver, FP: "a"}, keyOutput{OK: true, Token: "t2"}),
		},
		"the fenced-out owner completes": {
			op(0, 0, 1, keyInput{Key: "k", Kind: opClaim, FP: "a"}, keyOutput{OK: true, Token: "t1"}),
			op(0, 2, 3, keyInput{Key: "k", Kind: opEndLease, Token: "t1"}, keyOutput{OK: true}),
			op(1, 4, 5, keyInput{Key: "k", Kind: opTakeOver, FP: "a"}, keyOutput{OK: true, Token: "t2"}),
			op(0, 6, 7, keyInput{Key: "k", Kind: opComplete, Token: "t1", Answer: "x"}, keyOutput{OK: true}),
		},
		"a replay that differs": {
			op(0, 0, 1, keyInput{Key: "k", Kind: opClaim, FP: "a"}, keyOutput{OK: true, Token: "t1"}),
			op(0, 2, 3, keyInput{Key: "k", Kind: opComplete, Token: "t1", Answer: "x"}, keyOutput{OK: true}),
			op(1, 4, 5, keyInput{Key: "k", Kind: opLookup}, keyOutput{Status: StatusCompleted, FP: "a", Answer: "y"}),
		},
		"another request takes the key over": {
			op(0, 0, 1, keyInput{Key: "k", Kind: opClaim, FP: "a"}, keyOutput{OK: true, Token: "t1"}),
			op(0, 2, 3, keyInput{Key: "k", Kind: opEndLease, Token: "t1"}, keyOutput{OK: true}),
			op(1, 4, 5, keyInput{Key: "k", Kind: opTakeOver, FP: "b"}, keyOutput{OK: true, Token: "t2"}),
		},
	} {
		if porcupine.CheckOperations(keyStoreModel, h) {
			t.Errorf("%s: accepted as linearizable", name)
		}
	}
}
