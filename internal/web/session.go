package web

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// sessionCookie is the browser's proof of "signed in as". It holds the user
// id and an expiry, signed with HMAC-SHA256: the server keeps no session
// table, and any replica with the same SESSION_SECRET accepts it.
const (
	sessionCookie = "idemlab_session"
	sessionTTL    = 12 * time.Hour
)

type sessionCodec struct{ key []byte }

func newSessionCodec(key []byte) *sessionCodec { return &sessionCodec{key: key} }

// encode returns "userID.expiresUnix.signature".
func (s *sessionCodec) encode(userID int64, expires time.Time) string {
	payload := fmt.Sprintf("%d.%d", userID, expires.Unix())
	return payload + "." + s.sign(payload)
}

// decode returns the user id of a well-signed, unexpired value.
func (s *sessionCodec) decode(value string, now time.Time) (int64, bool) {
	i := strings.LastIndexByte(value, '.')
	if i < 0 {
		return 0, false
	}
	payload, sig := value[:i], value[i+1:]
	if !hmac.Equal([]byte(sig), []byte(s.sign(payload))) {
		return 0, false
	}
	idText, expText, ok := strings.Cut(payload, ".")
	if !ok {
		return 0, false
	}
	id, err1 := strconv.ParseInt(idText, 10, 64)
	exp, err2 := strconv.ParseInt(expText, 10, 64)
	if err1 != nil || err2 != nil || now.Unix() >= exp {
		return 0, false
	}
	return id, true
}

func (s *sessionCodec) sign(payload string) string {
	m := hmac.New(sha256.New, s.key)
	m.Write([]byte(payload))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}
