package views

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// The timeline says what its times are, so a line stamped a few
// milliseconds after the call it records reads as written, not as happened
// out of order (third read, finding 9: "sent to provider" at .178 beside a
// call Sent at .176).
func TestTheTimelineSaysWhatItsTimesAre(t *testing.T) {
	var buf bytes.Buffer
	op := OperationDetail{Admin: true, Timeline: []TimelineEvent{{At: "00:56:20.178", To: "IN_PROGRESS"}}}
	if err := OperationPanel(op).Render(context.Background(), &buf); err != nil {
		t.Fatal(err)
	}
	page := buf.String()
	for _, want := range []string{"<th>Written at</th>", "just before it commits", "each statement&#39;s own instant"} {
		if !strings.Contains(page, want) {
			t.Errorf("the timeline lacks %q", want)
		}
	}
}
