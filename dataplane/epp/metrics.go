package epp

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the endpoint picker's own collectors; the requests it routes
// are counted by the proxy's (cart_requests_total and the rest), as for
// the proxy's own requests.
type Metrics struct {
	Active          prometheus.Gauge
	Answers         *prometheus.CounterVec // fallbacks: how many followed the primary
	Immediate       *prometheus.CounterVec // status
	EndedEarly      prometheus.Counter
	ServedElsewhere prometheus.Counter
	ProtocolErrors  prometheus.Counter
}

// NewMetrics registers the collectors on reg (nil: none).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Active: prometheus.NewGauge(prometheus.GaugeOpts{Name: "cart_epp_streams_active", Help: "ext_proc streams open (requests between their headers and the end of their response)."}),
		Answers: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cart_epp_answers_total",
			Help: "Requests answered with a destination, by the number of fallback endpoints after the primary."}, []string{"fallbacks"}),
		Immediate: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cart_epp_immediate_responses_total",
			Help: "Requests the picker answered itself (ImmediateResponse), by HTTP status: errors (401, 404, 413, 429, 503...) and what CART serves without a worker (GET /v1/models)."}, []string{"status"}),
		EndedEarly: prometheus.NewCounter(prometheus.CounterOpts{Name: "cart_epp_streams_ended_early_total",
			Help: "ext_proc streams that ended (reset or closed) before the response was complete: client disconnects, gateway timeouts."}),
		ServedElsewhere: prometheus.NewCounter(prometheus.CounterOpts{Name: "cart_epp_served_elsewhere_total",
			Help: "Requests the gateway reports were served by another endpoint than the primary (a fallback): the primary's load is released at once."}),
		ProtocolErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "cart_epp_protocol_errors_total",
			Help: "ext_proc streams ended for messages out of order or unusable (a gateway misconfiguration, such as a body mode other than FULL_DUPLEX_STREAMED)."}),
	}
	if reg != nil {
		reg.MustRegister(m.Active, m.Answers, m.Immediate, m.EndedEarly, m.ServedElsewhere, m.ProtocolErrors)
	}
	return m
}
