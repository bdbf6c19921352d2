package views

import (
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Readable errors. The texts the workflow and recovery record are Go error
// chains — "provider: status 7:provider_cancel: external: unreachable:
// unexpected HTTP status 503: {…}" — precise for whoever debugs, hard for
// whoever reads the page. ReadableError shows a one-line summary in words
// and keeps the chain, as recorded, folded under it.

// chainStart is where a Go error chain begins in a text: a package prefix
// ("provider: ") at the start or after another clause's ": ".
var chainStart = regexp.MustCompile(`(^|: )[a-z][a-z0-9]*: `)

// httpStatus finds the status code in "unexpected HTTP status 503" or
// "(HTTP 503)".
var httpStatus = regexp.MustCompile(`HTTP (?:status )?(\d{3})`)

// systems are the packages whose name is also the system a reader knows.
var systems = map[string]string{"provider": "the provider", "payments": "the payments service"}

// ErrorSummary splits text into a one-line summary for people and the raw
// chain it came from. raw is "" when text already reads as a sentence (no
// chain, no JSON, short): then summary is text itself.
func ErrorSummary(text string) (summary, raw string) {
	text = strings.TrimSpace(text)
	loc := chainStart.FindStringIndex(text)
	if loc == nil && !strings.Contains(text, "{") && utf8.RuneCountInString(text) <= 160 {
		return text, ""
	}
	if loc != nil {
		// A chain inside parentheses — "provider could not be asked
		// (provider: status 7:…: unexpected HTTP status 503); lease renewed"
		// — is summed up inside them, and what follows them stays: cut at
		// the chain, the summary would leave the parenthesis open and lose
		// the rest of the sentence.
		if open := strings.LastIndex(text[:loc[0]], "("); open >= 0 && !strings.Contains(text[open:loc[0]], ")") {
			if end := closingParen(text, open); end > 0 {
				inner, _ := ErrorSummary(text[open+1 : end])
				return text[:open] + "(" + lowerFirst(inner) + ")" + text[end+1:], text
			}
		}
	}
	head, chain := text, ""
	if loc != nil {
		head, chain = strings.TrimSuffix(text[:loc[0]], ":"), text[loc[0]:]
		chain = strings.TrimPrefix(chain, ": ")
	}
	who := "the other system"
	if loc != nil {
		pkg, _, _ := strings.Cut(chain, ":")
		if s, ok := systems[pkg]; ok {
			who = s
		}
	}
	reason := errorReason(who, chain)
	if reason == "" && loc == nil { // long text, or JSON, without a chain
		return firstWords(text, 120), text
	}
	switch {
	case head == "":
		summary = capitalize(reason)
	case reason == "":
		summary = head
	default:
		summary = head + ": " + reason
	}
	return summary, text
}

// errorReason says in words what a chain reports: the usual causes in
// words of their own, otherwise the chain's words without its package
// prefixes.
func errorReason(who, chain string) string {
	if chain == "" {
		return ""
	}
	if r := knownCause(who, chain); r != "" {
		return r
	}
	plain := chain
	for {
		next := chainStart.ReplaceAllString(plain, "$1")
		if next == plain {
			break
		}
		plain = next
	}
	return firstWords(plain, 120)
}

// knownCause names the usual causes of a failed call in words — a status
// code, no answer in time, not reached, not found — or "" for any other.
func knownCause(who, chain string) string {
	lower := strings.ToLower(chain)
	switch {
	case httpStatus.MatchString(chain):
		code := httpStatus.FindStringSubmatch(chain)[1]
		return who + " answered with an error (HTTP " + code + ")"
	case strings.Contains(lower, "deadline exceeded") || strings.Contains(lower, "timeout") || strings.Contains(lower, "timed out"):
		return "no answer from " + who + " in time"
	case strings.Contains(lower, "connection refused") || strings.Contains(lower, "no such host") ||
		strings.Contains(lower, "connection reset") || strings.Contains(lower, "eof"):
		return who + " could not be reached"
	case strings.Contains(lower, "unreachable"):
		return who + " could not be reached"
	case strings.Contains(lower, "not found"):
		return "not found"
	}
	return ""
}

// ErrorCause is the cause of the failure text records, as a sentence a
// customer may read (ErrorSummary's reason for the usual causes), or ""
// when it is none of those: the text itself is not for customers.
func ErrorCause(text string) string {
	loc := chainStart.FindStringIndex(text)
	if loc == nil {
		return ""
	}
	chain := strings.TrimPrefix(text[loc[0]:], ": ")
	who := "the other system"
	if s, ok := systems[strings.SplitN(chain, ":", 2)[0]]; ok {
		who = s
	}
	return capitalize(knownCause(who, chain))
}

// firstWords is s cut at a word boundary to about n characters.
func firstWords(s string, n int) string {
	if i := strings.IndexAny(s, "{\n"); i > 0 {
		s = strings.TrimRight(s[:i], " :")
	}
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)[:n]
	if i := strings.LastIndex(string(r), " "); i > n/2 {
		return string(r[:i]) + " …"
	}
	return string(r) + "…"
}

func capitalize(s string) string {
	r, size := utf8.DecodeRuneInString(s)
	if r == utf8.RuneError {
		return s
	}
	return string(unicode.ToUpper(r)) + s[size:]
}

// closingParen is the index of the parenthesis that closes the one at
// open in s, or -1 when none does.
func closingParen(s string, open int) int {
	depth := 0
	for i := open; i < len(s); i++ {
		switch s[i] {
		case '(':
			depth++
		case ')':
			if depth--; depth == 0 {
				return i
			}
		}
	}
	return -1
}

// lowerFirst is s with its first letter in lower case (a summary set inside
// a sentence).
func lowerFirst(s string) string {
	r, n := utf8.DecodeRuneInString(s)
	if r == utf8.RuneError {
		return s
	}
	return string(unicode.ToLower(r)) + s[n:]
}
