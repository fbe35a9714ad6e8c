package health

import "github.com/cartrouter/cart/config"

// ConfigFrom translates health.*; the caller adds what the config file does
// not say (worker keys, the models hook).
func ConfigFrom(h config.Health) Config {
	return Config{Endpoint: h.Endpoint, Interval: config.Seconds(h.IntervalSecs), Timeout: config.Seconds(h.TimeoutSecs),
		FailureThreshold: h.FailureThreshold, SuccessThreshold: h.SuccessThreshold}
}
