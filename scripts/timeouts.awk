# timeouts.awk — go test's output as is, except a package that ran out of
# time (-timeout): its page of goroutine stacks becomes one line naming the
# tests that were running.
#
#   go test -timeout 20m ./... 2>&1 | awk -f scripts/timeouts.awk
#
# go test prints "panic: test timed out after 20m0s", "running tests:", one
# tab-indented line per running test, then every goroutine's stack, then
# "FAIL <package> <time>". This prints:
#   TIMEOUT <package> after 20m0s, still running: TestA (19m58s), TestB (3m1s)
# and the FAIL line. Everything else passes through untouched.
/^panic: test timed out after / {
	after = $6; running = ""; state = "names"; next
}
state == "names" && /^\trunning tests:/ { next }
state == "names" && /^\t\t/ {
	sub(/^\t\t/, ""); running = running (running == "" ? "" : ", ") $0; next
}
state == "names" { state = "stacks" }
state == "stacks" && /^(FAIL|ok )[ \t]/ {
	split($0, f, /[ \t]+/)
	print "TIMEOUT " f[2] " after " after ", still running: " (running == "" ? "(none named)" : running)
	state = ""
}
state == "stacks" { next }
{ print; fflush() }
