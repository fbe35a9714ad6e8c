package config

import (
	"fmt"
	"io/fs"
	"strings"
	"testing"
)

func TestKVEventsValidation(t *testing.T) {
	kv := func(c *Config, e WorkerKVEvents) { c.Workers[0].KVEvents = e }
	tests := []struct {
		name   string
		role   Role
		mutate func(c *Config)
		key    string
		reason string
	}{
		{"replay without endpoint or topic", RoleAllInOne, func(c *Config) { kv(c, WorkerKVEvents{ReplayEndpoint: "tcp://h:5558"}) }, "workers[0].kv_events", "set endpoint"},
		{"http endpoint", RoleAllInOne, func(c *Config) { kv(c, WorkerKVEvents{Endpoint: "http://h:5557"}) }, "workers[0].kv_events.endpoint", "tcp://host:port"},
		{"bad replay port", RoleAllInOne, func(c *Config) { kv(c, WorkerKVEvents{Endpoint: "tcp://h:5557", ReplayEndpoint: "tcp://h:x"}) }, "workers[0].kv_events.replay_endpoint", "bad port"},
		{"ranks past the last port", RoleAllInOne, func(c *Config) { kv(c, WorkerKVEvents{Endpoint: "tcp://h:65535", DataParallelSize: 2}) }, "workers[0].kv_events.endpoint", "cannot offset"},
		{"negative ranks", RoleAllInOne, func(c *Config) { kv(c, WorkerKVEvents{Endpoint: "tcp://h:1", DataParallelSize: -1}) }, "workers[0].kv_events.data_parallel_size", "at least 0"},
		{"topic without listen", RoleControlPlane, func(c *Config) { kv(c, WorkerKVEvents{Topic: "kv@a@m"}) }, "workers[0].kv_events.topic", "kv_events.listen, which is not set"},
		{"duplicate topic", RoleAllInOne, func(c *Config) {
			c.KVEvents.Listen, c.KVEvents.AllowUnauthenticatedListen = "tcp://*:5557", true
			c.Workers = append(c.Workers, Worker{URL: "http://127.0.0.1:8002"})
			c.Workers[0].KVEvents.Topic, c.Workers[1].KVEvents.Topic = "t", "t"
		}, "workers[1].kv_events.topic", `topic "t" already names workers[0]`},
		{"listen on every interface", RoleAllInOne, func(c *Config) { c.KVEvents.Listen = "tcp://*:5557" }, "kv_events.listen", "allow_unauthenticated_listen"},
		{"bad listen", RoleAllInOne, func(c *Config) { c.KVEvents.Listen = "5557" }, "kv_events.listen", "want tcp://host:port"},
		{"replay timeout", RoleAllInOne, func(c *Config) { c.KVEvents.ReplayTimeoutMs = 0 }, "kv_events.replay_timeout_ms", "at least 1"},
		{"listen anywhere with an allowlist", RoleAllInOne, func(c *Config) {
			c.KVEvents.Listen, c.KVEvents.AllowedPublishers = "tcp://*:5557", []string{"10.0.3.0/24", "10.0.4.7", "fd00::1"}
		}, "", ""},
		{"bad allowlist entry", RoleAllInOne, func(c *Config) {
			c.KVEvents.Listen, c.KVEvents.AllowedPublishers = "tcp://127.0.0.1:5557", []string{"10.0.3.0/33"}
		}, "kv_events.allowed_publishers", "neither an IP address nor a CIDR"},
		{"allowlist without listen", RoleAllInOne, func(c *Config) { c.KVEvents.AllowedPublishers = []string{"10.0.0.1"} }, "kv_events.allowed_publishers", "not set"},
		{"allowlist with ipc", RoleAllInOne, func(c *Config) {
			c.KVEvents.Listen, c.KVEvents.AllowedPublishers = "ipc:///run/cart/kv.sock", []string{"10.0.0.1"}
		}, "kv_events.allowed_publishers", "file mode"},
		{"world-writable socket", RoleAllInOne, func(c *Config) { c.KVEvents.IPCSocketMode = "0666" }, "kv_events.ipc_socket_mode", "every local user"},
		{"socket mode not octal", RoleAllInOne, func(c *Config) { c.KVEvents.IPCSocketMode = "rw" }, "kv_events.ipc_socket_mode", "octal"},
		{"socket the owner cannot write", RoleAllInOne, func(c *Config) { c.KVEvents.IPCSocketMode = "0400" }, "kv_events.ipc_socket_mode", "owner can write"},
		{"tiny messages", RoleAllInOne, func(c *Config) { c.KVEvents.MaxMessageBytes = 1000 }, "kv_events.max_message_bytes", "between"},
		{"no connections", RoleAllInOne, func(c *Config) { c.KVEvents.MaxPublisherConnections = 0 }, "kv_events.max_publisher_connections", "between"},
		{"no hashes", RoleAllInOne, func(c *Config) { c.KVEvents.MaxHashesPerRank = 0 }, "kv_events.max_hashes_per_rank", "at least 1"},
		{"data plane", RoleDataPlane, func(c *Config) { kv(c, WorkerKVEvents{Endpoint: "tcp://h:5557"}) }, "kv_events", "never by a data plane"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := validBase()
			tt.mutate(c)
			if tt.key == "" {
				if err := c.Validate(tt.role); err != nil {
					t.Fatal(err)
				}
				return
			}
			ps := problemsOf(t, c.Validate(tt.role))
			if len(ps) != 1 || ps[0].Key != tt.key || !strings.Contains(ps[0].Reason, tt.reason) {
				t.Fatalf("problems %v\nwant one at %q containing %q", ps, tt.key, tt.reason)
			}
		})
	}
	c := validBase()
	c.KVEvents.Listen = "tcp://127.0.0.1:5557"
	if err := c.Validate(RoleAllInOne); err != nil {
		t.Errorf("loopback listen: %v", err)
	}
	c.KVEvents.Listen, c.KVEvents.AllowUnauthenticatedListen = "tcp://*:5557", true
	c.Workers = append(c.Workers, Worker{URL: "http://127.0.0.1:8002", KVEvents: WorkerKVEvents{Topic: "kv@b@m", ReplayEndpoint: "tcp://10.0.0.2:5558"}})
	c.Workers[0].KVEvents = WorkerKVEvents{Endpoint: "tcp://10.0.0.1:5557", ReplayEndpoint: "tcp://10.0.0.1:5558", DataParallelSize: 2}
	for _, role := range []Role{RoleAllInOne, RoleControlPlane} {
		if err := c.Validate(role); err != nil {
			t.Errorf("%v: %v", role, err)
		}
	}
}

func TestKVEventsPublishersAndSocketMode(t *testing.T) {
	k := KVEvents{AllowedPublishers: []string{"10.0.3.9/24", "10.0.4.7", "::ffff:10.0.5.1", "fd00::/8"}}
	ps, err := k.Publishers()
	if err != nil {
		t.Fatal(err)
	}
	got := fmt.Sprint(ps)
	if want := "[10.0.3.0/24 10.0.4.7/32 10.0.5.1/32 fd00::/8]"; got != want {
		t.Fatalf("prefixes %s, want %s", got, want)
	}
	for in, want := range map[string]fs.FileMode{"": 0o600, "0660": 0o660, "600": 0o600} {
		if m, err := (KVEvents{IPCSocketMode: in}).SocketMode(); err != nil || m != want {
			t.Errorf("SocketMode(%q) = %v, %v; want %v", in, m, err, want)
		}
	}
}
