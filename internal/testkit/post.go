package testkit

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// PostJSON posts body to url as JSON, with the header pairs hdr (name,
// value, name, value, ...), and returns the response, its body (read and
// closed) and the error that cut reading it short, if any: a test of a
// cut connection may expect one.
func PostJSON(t testing.TB, url, body string, hdr ...string) (*http.Response, string, error) {
	t.Helper()
	return Do(t, http.MethodPost, url, body, append([]string{"Content-Type", "application/json"}, hdr...)...)
}

// Do is PostJSON for any method: the body, when there is one, is sent as
// JSON, and an empty one goes without a Content-Type, as a GET's would.
func Do(t testing.TB, method, url, body string, hdr ...string) (*http.Response, string, error) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, string(b), err
}
