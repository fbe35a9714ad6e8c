package config

import (
	"fmt"
	"net/netip"
	"strings"
)

// ParseNetworks reads a list of networks (discovery.allowed_networks): CIDR
// prefixes, or single addresses (a /32 or /128).
func ParseNetworks(list []string) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(list))
	for _, s := range list {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			a, aerr := netip.ParseAddr(s)
			if aerr != nil || a.Zone() != "" {
				return nil, fmt.Errorf("%q is not a network (CIDR such as 10.0.0.0/8) or an IP address", s)
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// Listeners are the host:port addresses a process of role binds: a
// discovered worker must never be one of them (discovery refuses them).
func (c *Config) Listeners(role Role) []string {
	var out []string
	switch role {
	case RoleControlPlane:
		out = append(out, c.ControlPlane.APIAddr, c.ControlPlane.RaftAddr)
	default:
		out = append(out, c.Server.Addr())
		if c.Server.MetricsAddr != "" {
			out = append(out, c.Server.MetricsAddr)
		}
	}
	if l, ok := strings.CutPrefix(c.KVEvents.Listen, "tcp://"); ok {
		out = append(out, l)
	}
	return out
}
