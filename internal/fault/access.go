package fault

import (
	"crypto/subtle"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// Access says who may use a fake's control API (faults, reset, ledger). The
// business API — the calls the app makes and their status queries — is open
// to every caller, as a real system's would be to its clients; the control
// API can stop every cancellation, so it is not:
//
//   - Open: anyone (demo mode: the control API of a demo on a laptop);
//   - else Token set: every request carries "Authorization: Bearer <Token>",
//     from any address (the app's Control clients send it; FAKE_CONTROL_TOKEN);
//   - else: loopback callers only. The zero Access is this, the safe default.
type Access struct {
	Token string
	Open  bool
}

// Guard wraps a control handler with the access rule: 401 without the token
// when one is required, 403 for a caller not on loopback when none is.
func (a Access) Guard(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		switch {
		case a.Open:
		case a.Token != "":
			got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			if !ok || subtle.ConstantTimeCompare([]byte(got), []byte(a.Token)) != 1 {
				w.Header().Set("WWW-Authenticate", `Bearer realm="fake control"`)
				WriteError(w, http.StatusUnauthorized, "unauthorized", "the control API needs its bearer token (FAKE_CONTROL_TOKEN)")
				return
			}
		case !fromLoopback(r):
			WriteError(w, http.StatusForbidden, "forbidden", "the control API answers loopback callers only; set FAKE_CONTROL_TOKEN to reach it from elsewhere")
			return
		}
		h(w, r)
	}
}

// fromLoopback reports whether r's peer is a loopback address. RemoteAddr is
// the TCP peer, not a header a caller could forge.
func fromLoopback(r *http.Request) bool {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return false
	}
	addr, err := netip.ParseAddr(host)
	return err == nil && addr.Unmap().IsLoopback()
}
