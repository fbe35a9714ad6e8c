package discovery

import (
	"github.com/cartrouter/cart/config"
)

// DNSResolverFrom builds the DNS discovery resolver from discovery.dns.*.
func DNSResolverFrom(cfg *config.Config) (*DNSResolver, error) {
	d := cfg.Discovery.DNS
	return NewDNSResolver(DNSOptions{Name: d.Name, SRV: d.RecordType == "SRV", Port: d.Port,
		Scheme: d.Scheme, Server: d.Resolver, Timeout: config.Seconds(d.TimeoutSecs)})
}

// RulesFrom translates discovery.* into the reconciler's rules.
func RulesFrom(cfg *config.Config) Options {
	d := cfg.Discovery
	return Options{AddAfter: d.DNS.AddAfter, RemoveAfter: d.DNS.RemoveAfter, DrainTimeout: config.Seconds(d.DrainTimeoutSecs),
		MinInterval: config.Seconds(d.DNS.MinIntervalSecs), MaxInterval: config.Seconds(d.DNS.MaxIntervalSecs)}
}
