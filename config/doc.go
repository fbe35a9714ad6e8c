// Package config loads, layers, defaults and validates CART's YAML
// configuration. Every role (all-in-one, control plane, data plane) reads its
// settings through this package so that defaults, error reporting and the
// meaning of each key stay identical across binaries.
//
// Loading and validation are deliberately separate steps: Load only checks
// that the files are well-formed and use known keys of the right type, while
// Validate applies value rules that depend on the role being started. That
// lets `--config-check` report every problem in one pass and lets SIGHUP
// reload compare a freshly loaded config with the running one before
// deciding whether it can be applied.
//
// # Credentials
//
// Four credentials, one per role (client keys, the cluster token, the admin
// token, the Raft token); Validate refuses one value in two roles, a
// copy-paste that would silently merge them, and refuses the Raft token in a
// data-plane or all-in-one config, so the role facing clients never holds it
// (docs/security.md).
//
// # Secret files
//
// Secret files are read (and checked non-empty) by Validate, so --config-check
// fails on a missing secret mount instead of the process starting with auth
// silently off. One rule (ExposedSecret, shared with cartctl) says whether
// others can read one: anyone, the group of a file the process owns (the group
// bit then serves only others), or a group the process is not in. It is a WARN
// at start (and a line of --config-check), a config error with
// auth.refuse_insecure_secret_files. Allowed: another user's file shared with
// the process's group, which is how root:cart 0640 files and Kubernetes
// Secrets (root-owned, group fsGroup) reach a service — refusing those would
// make the flag unusable on Kubernetes.
//
// TLS files are read only here (TLS.ServerConfig, ClientTLS.Config, CertPool),
// so every role loads certificates the same way.
package config
