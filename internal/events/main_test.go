package events_test

import (
	"os"
	"testing"

	"github.com/idemlab/idemlab/internal/testenv"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testenv.StopNATS() // the embedded server, when there was no other
	os.Exit(code)
}
