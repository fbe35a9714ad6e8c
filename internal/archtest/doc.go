// Package archtest holds tests of the module's package graph: the rules
// that keep its shape visible (the data plane builds on the control plane,
// never the reverse) are checked here, so a new import that breaks one
// fails CI instead of waiting for a review to notice.
package archtest
