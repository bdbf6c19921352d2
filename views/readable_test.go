package views

import "testing"

func TestErrorSummaryReadsLikeASentence(t *testing.T) {
	for _, tc := range []struct{ text, summary string }{
		{"provider: status 7:provider_cancel: external: unreachable: unexpected HTTP status 503: {\"error\":\"unavailable\"}",
			"The provider answered with an error (HTTP 503)"},
		{"outcome unknown, handed to recovery: payments: refund 3:refund: context deadline exceeded",
			"outcome unknown, handed to recovery: no answer from the payments service in time"},
		{"policies: operation not found", "Not found"},
		{"workflow: step audit: something odd happened", "Step audit: something odd happened"},
		{"every step done", "every step done"},
		// A chain inside parentheses is summed up inside them, the sentence
		// around it kept (issue 29's second read, finding 21: the summary
		// ended "…(provider: status 3:provider_cancel: … (HTTP 503)", open).
		{"poll 1/5: provider could not be asked (provider: status 3:provider_cancel: external: unreachable: unexpected HTTP status 503: {\"error\":\"unavailable\"}); lease renewed, asking again in 2s",
			"poll 1/5: provider could not be asked (the provider answered with an error (HTTP 503)); lease renewed, asking again in 2s"},
	} {
		summary, raw := ErrorSummary(tc.text)
		if summary != tc.summary {
			t.Errorf("ErrorSummary(%q) = %q, want %q", tc.text, summary, tc.summary)
		}
		if want := tc.text; tc.text == tc.summary {
			if raw != "" {
				t.Errorf("a sentence got a raw chain: %q", raw)
			}
		} else if raw != want {
			t.Errorf("raw = %q, want the text as recorded", raw)
		}
	}
}
