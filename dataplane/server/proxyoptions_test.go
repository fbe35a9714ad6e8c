package server_test

import (
	"slices"
	"testing"

	"github.com/cartrouter/cart/config"
	"github.com/cartrouter/cart/dataplane/server"
)

// The pass-through and media keys reach the proxy, and only the built-in
// inference APIs are resendable whatever the operator allows.
func TestProxyOptionsPassThroughAndMedia(t *testing.T) {
	cfg := config.Default()
	cfg.Proxy.RemoteMediaAllowFile = true
	cfg.Proxy.PassThroughPaths = []string{"/v1/embeddings", "/admin/*"}
	o := server.ProxyOptions(cfg, nil, nil, nil, nil)
	if !o.AllowFileMediaURLs {
		t.Error("proxy.remote_media_allow_file did not reach the proxy")
	}
	if !slices.Equal(o.PassThroughPaths, cfg.Proxy.PassThroughPaths) {
		t.Errorf("pass-through paths %v", o.PassThroughPaths)
	}
	if slices.Contains(o.RetryablePassThroughPaths, "/admin/*") || !slices.Equal(o.RetryablePassThroughPaths, config.DefaultPassThroughPaths) {
		t.Errorf("resendable paths %v, want the built-in inference APIs only", o.RetryablePassThroughPaths)
	}
	if o := server.ProxyOptions(config.Default(), nil, nil, nil, nil); o.AllowFileMediaURLs || !slices.Equal(o.PassThroughPaths, config.DefaultPassThroughPaths) {
		t.Errorf("defaults: allow file %v, paths %v", o.AllowFileMediaURLs, o.PassThroughPaths)
	}
}
