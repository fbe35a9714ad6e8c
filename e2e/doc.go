// Package e2e holds cross-role end-to-end tests: real `cart controlplane`,
// `cart dataplane` and all-in-one `cart` processes, `cartctl`, HAProxy in
// TCP mode and simulated replicas, all on 127.0.0.1. The tests live in
// _test.go files; see README.md for what they cover and how to run them.
package e2e
