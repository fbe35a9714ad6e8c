package extract

import "testing"

// The endpoint table is the one place a routed endpoint is named: every
// row maps path -> endpoint -> name -> endpoint without loss, and no two
// rows share a path or a name.
func TestEndpointTable(t *testing.T) {
	paths, names := map[string]bool{}, map[string]bool{}
	eps := Endpoints()
	if len(eps) != 4 {
		t.Fatalf("%d endpoints, want 4", len(eps))
	}
	for _, ep := range eps {
		if paths[ep.Path()] || names[ep.String()] || ep.Path() == "" || ep.String() == "unknown" {
			t.Fatalf("endpoint %d: path %q name %q duplicated or missing", ep, ep.Path(), ep.String())
		}
		paths[ep.Path()], names[ep.String()] = true, true
		if got, ok := EndpointForPath(ep.Path()); !ok || got != ep {
			t.Errorf("EndpointForPath(%q) = %v, %v", ep.Path(), got, ok)
		}
		if got, ok := EndpointForName(ep.String()); !ok || got != ep {
			t.Errorf("EndpointForName(%q) = %v, %v", ep.String(), got, ok)
		}
	}
	if _, ok := EndpointForPath("/v1/chat/completions/"); ok {
		t.Error("a path outside the table matched")
	}
	if _, ok := EndpointForName("embeddings"); ok {
		t.Error("a name outside the table matched")
	}
}
