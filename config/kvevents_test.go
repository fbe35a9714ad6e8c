package config

import (
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
		{"data plane", RoleDataPlane, func(c *Config) { kv(c, WorkerKVEvents{Endpoint: "tcp://h:5557"}) }, "kv_events", "never by a data plane"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := validBase()
			tt.mutate(c)
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
