package nemesis

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"
)

// adminHTTP is short-tempered: a nemesis action that cannot reach its
// target (it is down or paused) is skipped, not waited for.
var adminHTTP = &http.Client{Timeout: 2 * time.Second}

// appAdmin calls the app's admin endpoints and the fakes' control APIs.
type appAdmin struct {
	token string
	http  *http.Client
}

// armCrash: PUT /api/v1/admin/crash — die at the next pass of point, once.
func (a *appAdmin) armCrash(ctx context.Context, appURL, point string) error {
	return a.put(ctx, appURL+"/api/v1/admin/crash", true, map[string]any{"at": point, "mode": "exit", "once": true})
}

// disarmCrash: PUT /api/v1/admin/crash {"at": ""}; errors are ignored (an
// instance that is down has nothing armed when it comes back).
func (a *appAdmin) disarmCrash(ctx context.Context, appURL string) {
	a.put(ctx, appURL+"/api/v1/admin/crash", true, map[string]any{"at": ""})
}

// canTellBelief reports whether the app has the belief endpoint
// (GET /api/v1/admin/systems answers 200).
func (a *appAdmin) canTellBelief(ctx context.Context, appURL string) bool {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, appURL+"/api/v1/admin/systems", nil)
	req.Header.Set("Authorization", "Bearer "+a.token)
	resp, err := a.http.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// setBelief: PUT /api/v1/admin/systems/{name} {"believed_idempotent": b}.
func (a *appAdmin) setBelief(ctx context.Context, appURL, name string, idempotent bool) error {
	return a.put(ctx, appURL+"/api/v1/admin/systems/"+name, true, map[string]any{"believed_idempotent": idempotent})
}

// setFaults: the fake's own PUT /v1/faults, straight to the fake (not
// through the proxy: a flip must not wait out a delay window).
func (a *appAdmin) setFaults(ctx context.Context, fakeURL string, f fault) error {
	return a.put(ctx, fakeURL+"/v1/faults", false, f)
}

func (a *appAdmin) put(ctx context.Context, url string, auth bool, body any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, url, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if auth {
		req.Header.Set("Authorization", "Bearer "+a.token)
	}
	resp, err := a.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 500))
		return fmt.Errorf("PUT %s: %d %s", url, resp.StatusCode, bytes.TrimSpace(raw))
	}
	return nil
}

func itoa(n int) string { return strconv.Itoa(n) }
