package main

import (
	"bufio"
	"encoding/json"
	"os"
	"regexp"
	"strings"
)

// causes reads the apps' JSON logs for the error behind each 500: the
// "unhandled error" line carries the request id the client saw in
// X-Request-Id. The cause is shortened and its numbers blurred
// (ports, pids, ids), so equal causes group in the figures.
func causes(logPaths []string) map[string]string {
	out := map[string]string{}
	for _, path := range logPaths {
		f, err := os.Open(path)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Bytes()
			if !strings.Contains(string(line), `"unhandled error"`) {
				continue
			}
			var v struct {
				RequestID string `json:"request_id"`
				Err       string `json:"err"`
			}
			if json.Unmarshal(line, &v) == nil && v.RequestID != "" {
				out[v.RequestID] = blur(v.Err)
			}
		}
		f.Close()
	}
	return out
}

var digits = regexp.MustCompile(`[0-9]+`)

func blur(s string) string {
	s = digits.ReplaceAllString(s, "#")
	if len(s) > 120 {
		s = s[:120] + "…"
	}
	return s
}
