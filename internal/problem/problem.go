// Package problem is the wire format of idemlab's API errors: RFC 9457
// "Problem Details for HTTP APIs" (application/problem+json).
//
// A *Problem is also an error, so any layer that speaks HTTP (a handler, the
// idempotency middleware) can return one and the server's error handler
// writes it. Domain packages never build problems; cmd/web maps their
// sentinel errors to problems in one table.
package problem

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
)

// ContentType is the media type RFC 9457 defines.
const ContentType = "application/problem+json"

// Problem is one RFC 9457 problem. Type is a short, stable, relative URI
// reference such as "slot-taken": clients compare it, and it never changes
// once published (docs/api.md lists them all).
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// Instance is the request path the problem is about.
	Instance string `json:"instance,omitempty"`
	// Extra members (for example "operation_id") are merged into the object.
	Extra map[string]any `json:"-"`
}

// New returns a problem of the given type and status with a detail for humans.
func New(status int, typ, title, detail string) *Problem {
	return &Problem{Type: typ, Title: title, Status: status, Detail: detail}
}

// With returns p with one extra member set.
func (p *Problem) With(key string, value any) *Problem {
	if p.Extra == nil {
		p.Extra = map[string]any{}
	}
	p.Extra[key] = value
	return p
}

func (p *Problem) Error() string {
	return "problem " + strconv.Itoa(p.Status) + " " + p.Type + ": " + p.Detail
}

// MarshalJSON writes the standard members and the extras as one object.
func (p *Problem) MarshalJSON() ([]byte, error) {
	m := make(map[string]any, len(p.Extra)+5)
	for k, v := range p.Extra {
		m[k] = v
	}
	m["type"] = p.Type
	m["title"] = p.Title
	m["status"] = p.Status
	if p.Detail != "" {
		m["detail"] = p.Detail
	}
	if p.Instance != "" {
		m["instance"] = p.Instance
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // details are for people: keep "<token>" readable
	if err := enc.Encode(m); err != nil {
		return nil, err
	}
	return bytes.TrimRight(buf.Bytes(), "\n"), nil
}

// Write sends p as application/problem+json with its status.
func Write(w http.ResponseWriter, p *Problem) error {
	body, err := json.Marshal(p)
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", ContentType)
	w.WriteHeader(p.Status)
	_, err = w.Write(append(body, '\n'))
	return err
}
