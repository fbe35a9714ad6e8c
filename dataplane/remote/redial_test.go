package remote

import "testing"

func TestTimeoutRunDropsAfterRoundsInARow(t *testing.T) {
	const a, b = "http://a", "http://b"
	// call is one Route call: the round it started in and its outcome.
	type call struct {
		target  string
		started int // index of the step whose round it started in; -1: its own step
		outcome int
		drop    bool
	}
	tests := []struct {
		name  string
		calls []call
	}{
		{"three timeouts in a row drop, and the count starts again", []call{
			{a, -1, cpFailed, false}, {a, -1, cpFailed, false}, {a, -1, cpFailed, true},
			{a, -1, cpFailed, false}, {a, -1, cpFailed, false}, {a, -1, cpFailed, true},
		}},
		{"calls of one stall count once", []call{
			{a, -1, cpFailed, false}, {a, 0, cpFailed, false}, {a, 0, cpFailed, false},
			{a, -1, cpFailed, false}, {a, 3, cpFailed, false}, {a, -1, cpFailed, true},
		}},
		{"an answer starts the count again", []call{
			{a, -1, cpFailed, false}, {a, -1, cpFailed, false}, {a, -1, cpAnswered, false},
			{a, -1, cpFailed, false}, {a, -1, cpFailed, false}, {a, -1, cpFailed, true},
		}},
		{"refusals and unknowns neither count nor reset", []call{
			{a, -1, cpFailed, false}, {a, -1, cpRefused, false}, {a, -1, cpUnknown, false},
			{a, -1, cpFailed, false}, {a, -1, cpFailed, true},
		}},
		{"another node starts its own count", []call{
			{a, -1, cpFailed, false}, {a, -1, cpFailed, false}, {b, -1, cpFailed, false},
			{b, -1, cpFailed, false}, {b, -1, cpFailed, true},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			run := timeoutRun{after: 3}
			rounds := make([]uint64, len(tt.calls))
			for i, c := range tt.calls {
				rounds[i] = run.start()
				round := rounds[i]
				if c.started >= 0 {
					round = rounds[c.started]
				}
				if got := run.done(c.target, round, c.outcome); got != c.drop {
					t.Fatalf("call %d (%+v): drop %v, want %v", i, c, got, c.drop)
				}
			}
		})
	}
}
