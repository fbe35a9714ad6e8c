package proxy

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"sync/atomic"

	"github.com/cartrouter/cart/config"
	"github.com/cartrouter/cart/dataplane/apierr"
	"github.com/cartrouter/cart/internal/credential"
)

// ClientKey is one tenant's API key.
type ClientKey struct {
	Name string // tenant label in logs and metrics
	Key  string
	// IsolateCache gives the tenant a prefix cache of its own: its
	// requests carry a cache_salt derived from its key (see cacheSalt).
	IsolateCache bool
}

// AnonymousTenant labels requests when no client keys are configured, and
// refused requests (whose tenant is unknown by definition), so the tenant
// label only ever takes configured names plus this one. The config
// refuses tenant names equal to it, so it is defined there.
const AnonymousTenant = config.AnonymousTenant

// WWWAuthenticate is sent with every 401, as RFC 9110 requires.
const WWWAuthenticate = `Bearer realm="cart"`

type keyDigest struct {
	name string
	sum  credential.Digest
}

// clientAuth checks client credentials. Keys are compared as SHA-256
// digests in constant time, against every configured key without an early
// exit, so neither a key's length nor which tenant nearly matched leaks
// through timing.
type clientAuth struct {
	keys  []keyDigest
	admin *credential.Digest // nil: /workers answers loopback callers only
	// salts are the cache-salt secrets of the tenants whose prefix cache
	// is isolated, by tenant name.
	salts map[string][]byte
}

func newClientAuth(keys []ClientKey, admin string) clientAuth {
	a := clientAuth{keys: make([]keyDigest, len(keys))}
	for i, k := range keys {
		a.keys[i] = keyDigest{name: k.Name, sum: credential.DigestOf(k.Key)}
		if k.IsolateCache {
			if a.salts == nil {
				a.salts = map[string][]byte{}
			}
			a.salts[k.Name] = saltSecret(k.Key)
		}
	}
	if admin != "" {
		d := credential.DigestOf(admin)
		a.admin = &d
	}
	return a
}

// tenant returns the tenant whose key r carries, in Authorization (what
// OpenAI clients send) or x-api-key (what Anthropic clients send).
func (a *clientAuth) tenant(r *http.Request) (string, bool) {
	if len(a.keys) == 0 {
		return AnonymousTenant, true
	}
	if tok, ok := credential.BearerToken(r.Header); ok {
		if name, ok := a.match(tok); ok {
			return name, true
		}
	}
	if tok := r.Header.Get("X-Api-Key"); tok != "" {
		return a.match(tok)
	}
	return "", false
}

func (a *clientAuth) match(tok string) (string, bool) {
	sum := credential.DigestOf(tok)
	found := -1
	for i := range a.keys {
		if subtle.ConstantTimeCompare(sum[:], a.keys[i].sum[:]) == 1 {
			found = i
		}
	}
	if found < 0 {
		return "", false
	}
	return a.keys[found].name, true
}

// authenticate admits r or answers 401 in the error shape of the API it
// addressed. It returns the tenant for logs and metrics.
func (p *Proxy) authenticate(w http.ResponseWriter, r *http.Request, endpoint string) (string, bool) {
	if name, ok := p.auth.tenant(r); ok {
		return name, true
	}
	w.Header().Set("WWW-Authenticate", WWWAuthenticate)
	msg := "missing API key: send it as \"Authorization: Bearer <key>\" or \"x-api-key: <key>\""
	if _, ok := credential.BearerToken(r.Header); ok || r.Header.Get("X-Api-Key") != "" {
		msg = "invalid API key"
	}
	c := p.newCall(r, endpoint, AnonymousTenant)
	p.fail(w, c, apierr.New(http.StatusUnauthorized, apierr.TypeAuthentication, "invalid_api_key", "%s", msg))
	return "", false
}

// adminAllowed guards /workers (it lists internal worker URLs): the admin
// token, or a loopback caller when no admin token is configured. Client
// keys never count.
func (p *Proxy) adminAllowed(w http.ResponseWriter, r *http.Request) bool {
	if p.auth.admin == nil {
		if credential.IsLoopback(r.RemoteAddr) {
			return true
		}
		apierr.Write(w, apierr.New(http.StatusForbidden, apierr.TypeAuthentication, "admin_loopback_only",
			"no admin token is configured (auth.admin_token), so this endpoint answers loopback callers only"))
		return false
	}
	if tok, ok := credential.BearerToken(r.Header); ok && p.auth.admin.Matches(tok) {
		return true
	}
	w.Header().Set("WWW-Authenticate", WWWAuthenticate)
	apierr.Write(w, apierr.New(http.StatusUnauthorized, apierr.TypeAuthentication, "invalid_admin_token", "this endpoint needs the admin token (Authorization: Bearer <auth.admin_token>)"))
	return false
}

// WorkerKeys are the keys workers expect (vLLM --api-key): each worker's
// own by URL, else the pool's for workers of the sources trusted with it.
type WorkerKeys = config.WorkerKeySet

// workerKeys is swapped whole on reload.
type workerKeys struct{ v atomic.Pointer[WorkerKeys] }

func (k *workerKeys) get(worker, source string) string {
	if wk := k.v.Load(); wk != nil {
		return wk.Get(worker, source)
	}
	return ""
}

// SetWorkerKeys replaces the worker keys (SIGHUP reload).
func (p *Proxy) SetWorkerKeys(k WorkerKeys) { p.workerKeys.v.Store(&k) }

// WorkerKey is the key currently sent to worker, which came from source
// ("" for none), for health probes, which must authenticate like requests
// do.
func (p *Proxy) WorkerKey(worker, source string) string { return p.workerKeys.get(worker, source) }

// clientCredentialHeaders are what clients authenticate to CART with; they
// are never forwarded, since a worker has no business seeing a tenant's
// key (and a worker that logs headers would leak it).
var clientCredentialHeaders = []string{"Authorization", "X-Api-Key"}

// setWorkerAuth gives an outgoing request the key of worker, which came
// from source, if any. h must be a header map the caller owns.
func (p *Proxy) setWorkerAuth(h http.Header, worker, source string) {
	if k := p.workerKeys.get(worker, source); k != "" {
		h.Set("Authorization", "Bearer "+k)
	}
}

// Prefix-cache isolation. A tenant whose key has IsolateCache gets a
// cache_salt on every request, which vLLM mixes into its block hashes: its
// cached blocks match no other tenant's, so no other tenant can learn
// from a cache hit (the time to first token, or cached_tokens) what it
// sent. The salt is derived from the tenant's key, a secret no other
// tenant holds, so none can send it: HMAC-SHA256 of a fixed label keyed
// by the key is the tenant's salt secret, and the salt of a request is
// HMAC-SHA256 of the client's own cache_salt ("" when it sent none) keyed
// by that secret, in base64url (43 characters, 256 bits, as vLLM
// recommends). The client's salt still splits the tenant's own cache as
// it meant to, and cannot lead out of it. Every data plane derives the
// same salt from the same key; a new key (rotation) starts a cold cache.

// saltLabel keys the salt secret to its one use.
const saltLabel = "cart cache_salt v1"

func saltSecret(key string) []byte {
	m := hmac.New(sha256.New, []byte(key))
	m.Write([]byte(saltLabel))
	return m.Sum(nil)
}

// cacheSalt returns the salt to send for tenant's request that carried
// client's cache_salt, and whether the tenant is isolated at all.
func (a *clientAuth) cacheSalt(tenant, client string) (string, bool) {
	secret, ok := a.salts[tenant]
	if !ok {
		return "", false
	}
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(client))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil)), true
}
