package discovery

import (
	"context"
	"fmt"
	"slices"

	"github.com/cartrouter/cart/config"
)

// roleResolver resolves one name per worker role (discovery.dns.name,
// prefill_name, decode_name) as one source: a split pool is usually
// published as one headless Service per role.
type roleResolver struct {
	parts []rolePart
}

type rolePart struct {
	name, role string // role "" = both
	r          Resolver
}

// Resolve merges the names' answers. Any name failing fails the answer
// (the last good set stays): a partial answer would drain the workers of
// the name that failed. An endpoint under two names of different roles is
// an error too: its role would be a guess.
func (m *roleResolver) Resolve(ctx context.Context) Answer {
	out := Answer{TTL: -1}
	seen := map[string]string{} // endpoint -> the role it was found as
	for _, p := range m.parts {
		a := p.r.Resolve(ctx)
		if a.Err != nil {
			return Answer{Err: fmt.Errorf("%s: %w", p.name, a.Err)}
		}
		if out.TTL < 0 || a.TTL < out.TTL {
			out.TTL = a.TTL
		}
		for _, e := range a.Endpoints {
			if r, dup := seen[e]; dup && r != p.role {
				return Answer{Err: fmt.Errorf("%s resolves under two names of different roles (%s is one)", e, p.name)}
			}
			seen[e] = p.role
			out.Endpoints = append(out.Endpoints, e)
			if p.role != "" {
				if out.Roles == nil {
					out.Roles = map[string]string{}
				}
				out.Roles[e] = p.role
			}
		}
	}
	out.TTL = max(out.TTL, 0)
	slices.Sort(out.Endpoints)
	out.Endpoints = slices.Compact(out.Endpoints)
	return out
}

// DNSSourceFrom builds discovery.dns's resolver: the one name, or one per
// role merged.
func DNSSourceFrom(cfg *config.Config) (Resolver, error) {
	d := cfg.Discovery.DNS
	if d.PrefillName == "" && d.DecodeName == "" {
		return DNSResolverFrom(cfg)
	}
	m := &roleResolver{}
	for _, p := range []rolePart{{name: d.Name}, {name: d.PrefillName, role: config.RolePrefillName}, {name: d.DecodeName, role: config.RoleDecodeName}} {
		if p.name == "" {
			continue
		}
		r, err := NewDNSResolver(DNSOptions{Name: p.name, SRV: d.RecordType == "SRV", Port: d.Port,
			Scheme: d.Scheme, Server: d.Resolver, Timeout: config.Seconds(d.TimeoutSecs)})
		if err != nil {
			return nil, err
		}
		p.r = r
		m.parts = append(m.parts, p)
	}
	return m, nil
}

// roleOf maps a pod's role label value to a worker role: "" (no label)
// and "both" serve whole requests; ok is false for a value naming no role
// CART routes to (llm-d's encode workers), whose pod is left out.
func roleOf(v string) (role string, ok bool) {
	if !config.ValidRole(v) {
		return "", false
	}
	return config.RoleStored(v), true
}
