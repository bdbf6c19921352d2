package fake_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/idemlab/idemlab/internal/fault"
	"github.com/idemlab/idemlab/internal/provider/fake"
	"github.com/idemlab/idemlab/internal/webhook"
)

// receiver is an app stand-in: it checks each callback's signature and
// keeps the events in arrival order.
type receiver struct {
	mu     sync.Mutex
	events []webhook.Event
	bad    int
	answer int // what it answers; 0: 200
}

var secret = []byte("test-secret")

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if _, err := webhook.Verify(r.Header, secret, body, time.Now(), webhook.Tolerance); err != nil {
		rc.bad++
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	var ev webhook.Event
	_ = json.Unmarshal(body, &ev)
	rc.events = append(rc.events, ev)
	if rc.answer != 0 {
		w.WriteHeader(rc.answer)
	}
}

func (rc *receiver) got() []webhook.Event {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]webhook.Event(nil), rc.events...)
}

func webhookSetup(t *testing.T, mode fault.WebhookMode, delayMS int) (*bundle, *receiver, *fault.Sender) {
	t.Helper()
	b := setup(t)
	rc := &receiver{}
	app := httptest.NewServer(rc)
	t.Cleanup(app.Close)
	if _, err := b.control.SetWebhookSettings(context.Background(), fault.WebhookSettings{Mode: mode, DelayMS: delayMS}); err != nil {
		t.Fatal(err)
	}
	s := fault.NewSender(b.db.Pool, b.fake.Webhooks(), fault.SenderConfig{URL: app.URL, Secret: secret, MinBackoff: time.Millisecond})
	return b, rc, s
}

func statuses(evs []webhook.Event) []string {
	var out []string
	for _, e := range evs {
		out = append(out, e.Status)
	}
	return out
}

// drain runs the sender until n copies were delivered or 10 s passed.
func drain(t *testing.T, s *fault.Sender, rc *receiver, n int) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); len(rc.got()) < n && time.Now().Before(end); {
		if _, err := s.RunOnce(context.Background()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestCallbacksFollowTheWebhookMode(t *testing.T) {
	t.Parallel()
	t.Run("ok: one signed COMPLETED", func(t *testing.T) {
		t.Parallel()
		b, rc, s := webhookSetup(t, fault.WebhooksOK, 0)
		b.cancel(t, "k1", 1)
		drain(t, s, rc, 1)
		got := rc.got()
		if len(got) != 1 || got[0].Status != "COMPLETED" || got[0].Key != "k1" || got[0].Attempt != 1 {
			t.Fatalf("got %+v", got)
		}
	})
	t.Run("duplicate: two copies, one id", func(t *testing.T) {
		t.Parallel()
		b, rc, s := webhookSetup(t, fault.WebhooksDuplicate, 0)
		b.cancel(t, "k1", 1)
		drain(t, s, rc, 2)
		got := rc.got()
		if len(got) != 2 || got[0].ID != got[1].ID {
			t.Fatalf("got %+v", got)
		}
	})
	t.Run("reorder: COMPLETED before RUNNING", func(t *testing.T) {
		t.Parallel()
		b, rc, s := webhookSetup(t, fault.WebhooksReorder, 100)
		b.cancel(t, "k1", 1)
		drain(t, s, rc, 2)
		if got := statuses(rc.got()); len(got) != 2 || got[0] != "COMPLETED" || got[1] != "RUNNING" {
			t.Fatalf("got %v", got)
		}
	})
	t.Run("lost: recorded, never sent", func(t *testing.T) {
		t.Parallel()
		b, rc, s := webhookSetup(t, fault.WebhooksLost, 0)
		b.cancel(t, "k1", 1)
		if _, err := s.RunOnce(context.Background()); err != nil {
			t.Fatal(err)
		}
		l, err := b.control.Webhooks(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if len(rc.got()) != 0 || l.Lost != 1 {
			t.Fatalf("received %v, ledger %+v", rc.got(), l)
		}
	})
	t.Run("off: nothing queued", func(t *testing.T) {
		t.Parallel()
		b, rc, s := webhookSetup(t, fault.WebhooksOff, 0)
		b.cancel(t, "k1", 1)
		if n, err := s.RunOnce(context.Background()); err != nil || n.Claimed != 0 || len(rc.got()) != 0 {
			t.Fatalf("%+v %v", n, err)
		}
	})
	t.Run("refused and retried with backoff until answered 2xx", func(t *testing.T) {
		t.Parallel()
		b, rc, s := webhookSetup(t, fault.WebhooksOK, 0)
		rc.answer = http.StatusServiceUnavailable
		f := fake.DefaultFault()
		f.Mode = fake.ModeReject
		if _, err := b.fake.SetFaults(context.Background(), f); err != nil {
			t.Fatal(err)
		}
		b.cancel(t, "k1", 1)
		drain(t, s, rc, 2)
		rc.mu.Lock()
		rc.answer = 0
		rc.mu.Unlock()
		drain(t, s, rc, 3)
		got := rc.got()
		if len(got) < 3 || got[0].Status != "REJECTED" || got[2].Attempt != 3 {
			t.Fatalf("got %+v", got)
		}
		l, err := b.control.Webhooks(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if l.Delivered != 1 || l.Queued != 0 || l.Retries != 2 {
			t.Fatalf("ledger %+v", l)
		}
	})
}

func TestAForgedCallbackFailsVerification(t *testing.T) {
	t.Parallel()
	body := []byte(`{"id":"evt_1"}`)
	now := time.Now()
	h := http.Header{}
	webhook.SetHeaders(h, secret, "evt_1", now, body)
	if _, err := webhook.Verify(h, secret, body, now, webhook.Tolerance); err != nil {
		t.Fatalf("genuine: %v", err)
	}
	if _, err := webhook.Verify(h, []byte("other"), body, now, webhook.Tolerance); err == nil {
		t.Fatal("another secret verified")
	}
	if _, err := webhook.Verify(h, secret, []byte(`{"id":"evt_2"}`), now, webhook.Tolerance); err == nil {
		t.Fatal("a changed body verified")
	}
	if _, err := webhook.Verify(h, secret, body, now.Add(10*time.Minute), webhook.Tolerance); err == nil {
		t.Fatal("a stale one verified")
	}
}
