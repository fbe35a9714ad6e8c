package deploy

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/cartrouter/cart/config"
)

// helmKubeVersion is passed to helm: a helm built with `go install` does
// not know a Kubernetes version and assumes 1.20, below the chart's
// kubeVersion (gRPC probes need 1.27+).
const helmKubeVersion = "1.30.0"

const chartDir = "deploy/helm/cart"

func helmBin(t *testing.T) string {
	return tool(t, "make deploy-tools, or GOBIN=$PWD/.tools go install helm.sh/helm/v3/cmd/helm@v3.22.0",
		os.Getenv("HELM"), path(t, ".tools", "helm"), "helm")
}

type obj = map[string]any

// manifests is a rendered chart, indexed by kind and name.
type manifests struct {
	docs []obj
}

func (m manifests) get(t *testing.T, kind, name string) obj {
	t.Helper()
	for _, d := range m.docs {
		if d["kind"] == kind && dig(d, "metadata", "name") == name {
			return d
		}
	}
	t.Fatalf("no %s %s rendered", kind, name)
	return nil
}

func (m manifests) all(kind string) []obj {
	var out []obj
	for _, d := range m.docs {
		if d["kind"] == kind {
			out = append(out, d)
		}
	}
	return out
}

// dig walks maps by key and slices by int index; nil when absent.
func dig(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(obj)
			if !ok {
				return nil
			}
			v = m[k]
		case int:
			s, ok := v.([]any)
			if !ok || k >= len(s) {
				return nil
			}
			v = s[k]
		}
	}
	return v
}

func str(v any) string { s, _ := v.(string); return s }

func list(v any) []any { s, _ := v.([]any); return s }

func helmTemplate(t *testing.T, args ...string) (manifests, error) {
	t.Helper()
	all := append([]string{"template", "rel", path(t, chartDir), "--namespace", "ns", "--kube-version", helmKubeVersion}, args...)
	out, err := runErr(repoRoot(t), nil, helmBin(t), all...)
	if err != nil {
		return manifests{}, fmt.Errorf("%w: %s", err, out)
	}
	var m manifests
	dec := yaml.NewDecoder(bytes.NewReader([]byte(out)))
	for {
		var d obj
		if err := dec.Decode(&d); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("rendered YAML does not parse: %v", err)
		}
		if d != nil {
			m.docs = append(m.docs, d)
		}
	}
	return m, nil
}

func mustTemplate(t *testing.T, args ...string) manifests {
	t.Helper()
	m, err := helmTemplate(t, args...)
	if err != nil {
		t.Fatalf("helm template %v: %v", args, err)
	}
	return m
}

var withWorkers = []string{
	"--set", "workers[0].url=http://vllm-0.vllm:8000", "--set", "workers[0].maxLoad=32",
	"--set", "workers[1].url=http://vllm-1.vllm:8000",
}

func TestHelmLint(t *testing.T) {
	h := helmBin(t)
	run(t, repoRoot(t), h, "lint", "--strict", "--kube-version", helmKubeVersion, chartDir)
	run(t, repoRoot(t), h, append([]string{"lint", "--strict", "--kube-version", helmKubeVersion, chartDir,
		"--set", "dataPlane.hpa.enabled=true", "--set", "auth.existingSecret=cart-token", "--set", "metrics.serviceMonitor.enabled=true"}, withWorkers...)...)
	run(t, repoRoot(t), h, "lint", "--strict", "--kube-version", helmKubeVersion, chartDir,
		"--set", "discovery.kubernetes.enabled=true", "--set", "discovery.kubernetes.selector=app=vllm", "--set", "discovery.kubernetes.namespace=gpu")
}

func TestHelmControlPlane(t *testing.T) {
	m := mustTemplate(t, withWorkers...)
	sts := m.get(t, "StatefulSet", "rel-cart-cp")
	if r := dig(sts, "spec", "replicas"); r != 3 {
		t.Errorf("StatefulSet replicas %v, want 3", r)
	}
	if p := dig(sts, "spec", "podManagementPolicy"); p != "Parallel" {
		t.Errorf("podManagementPolicy %v: OrderedReady deadlocks after a full outage (node 0 never becomes Ready alone)", p)
	}
	svcName := str(dig(sts, "spec", "serviceName"))
	headless := m.get(t, "Service", svcName)
	if dig(headless, "spec", "clusterIP") != "None" {
		t.Errorf("serviceName %s is not headless (clusterIP %v)", svcName, dig(headless, "spec", "clusterIP"))
	}
	if dig(headless, "spec", "publishNotReadyAddresses") != true {
		t.Error("headless Service must publish not-ready addresses: nodes become Ready only after electing a leader, which needs their DNS names")
	}
	ports := map[any]bool{}
	for _, p := range list(dig(headless, "spec", "ports")) {
		ports[dig(p, "port")] = true
	}
	if !ports[6701] || !ports[6702] {
		t.Errorf("headless Service ports %v, want 6701 (API) and 6702 (Raft)", ports)
	}
	vcts := list(dig(sts, "spec", "volumeClaimTemplates"))
	if len(vcts) != 1 || dig(vcts[0], "metadata", "name") != "data" {
		t.Fatalf("volumeClaimTemplates %v, want one named data", vcts)
	}

	pod := dig(sts, "spec", "template", "spec")
	containers := list(dig(pod, "containers"))
	if len(containers) != 1 {
		t.Errorf("control-plane pod has %d containers: no sidecars (the Raft quorum is the HA mechanism)", len(containers))
	}
	if ic := list(dig(pod, "initContainers")); len(ic) != 0 {
		t.Errorf("control-plane pod has init containers %v", ic)
	}
	c := containers[0]
	if dig(c, "readinessProbe", "grpc", "port") != 6701 {
		t.Errorf("readinessProbe %v, want grpc on 6701 (SERVING once the node knows a leader)", dig(c, "readinessProbe"))
	}
	if dig(c, "livenessProbe", "grpc") != nil || dig(c, "livenessProbe", "httpGet") != nil {
		t.Errorf("livenessProbe %v must not depend on having a leader", dig(c, "livenessProbe"))
	}
	var dataMount string
	for _, vm := range list(dig(c, "volumeMounts")) {
		if dig(vm, "name") == "data" {
			dataMount = str(dig(vm, "mountPath"))
		}
	}
	args := strings.Join(toStrings(dig(c, "args")), " ")
	if args != "cart controlplane -c /etc/cart/controlplane.yaml -c /etc/cart/$(POD_NAME).yaml" {
		t.Errorf("args %q", args)
	}
	if !slices.ContainsFunc(list(dig(c, "env")), func(e any) bool {
		return dig(e, "name") == "POD_NAME" && dig(e, "valueFrom", "fieldRef", "fieldPath") == "metadata.name"
	}) {
		t.Error("POD_NAME is not taken from metadata.name: $(POD_NAME) in args would not expand")
	}
	if !slices.ContainsFunc(list(dig(c, "env")), func(e any) bool {
		return dig(e, "name") == "GOMAXPROCS" && dig(e, "valueFrom", "resourceFieldRef", "resource") == "requests.cpu" &&
			dig(e, "valueFrom", "resourceFieldRef", "divisor") == "1"
	}) {
		t.Error("GOMAXPROCS is not taken from the node's CPU request: Go would run a P per core of the machine")
	}
	// Two Ps by default: with one, a log fsync or a GC mark slice stops
	// the node (the chart README's "CPU").
	if cpu := fmt.Sprint(dig(c, "resources", "requests", "cpu")); cpu != "2" {
		t.Errorf("control-plane CPU request %s by default, want 2 (GOMAXPROCS 2)", cpu)
	}

	// Every node's config, through the real loader and validator.
	cm := m.get(t, "ConfigMap", "rel-cart-config")
	data, _ := dig(cm, "data").(obj)
	dir := t.TempDir()
	for k, v := range data {
		if err := os.WriteFile(filepath.Join(dir, k), []byte(str(v)), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tokenFile := tokenMountPath(t, c) + "/token"
	for i := range 3 {
		pod := fmt.Sprintf("rel-cart-cp-%d", i)
		cfg, err := config.Load(filepath.Join(dir, "controlplane.yaml"), filepath.Join(dir, pod+".yaml"))
		if err != nil {
			t.Errorf("%s config: %v", pod, err)
			continue
		}
		// Admin token for joins and cartctl; no client key on a control plane.
		if cfg.Auth.AdminTokenFile != tokenMountPath(t, c)+"/admin-token" || len(cfg.Auth.ClientKeys) != 0 {
			t.Errorf("%s auth %+v: want the mounted admin token and no client keys", pod, cfg.Auth)
		}
		// The Raft token keys the peer handshake: the cluster token, which
		// data planes hold, must open nothing on the Raft port.
		if cfg.Auth.RaftTokenFile != tokenMountPath(t, c)+"/raft-token" || cfg.Auth.RaftAcceptClusterToken {
			t.Errorf("%s auth %+v: want the mounted Raft token, no transition setting", pod, cfg.Auth)
		}
		mounted := *cfg
		withSecretFiles(&mounted, fakeSecrets(t))
		if err := mounted.Validate(config.RoleControlPlane); err != nil {
			t.Errorf("%s config: %v", pod, err)
			continue
		}
		cp := cfg.ControlPlane
		host := fmt.Sprintf("%s.%s.ns.svc.cluster.local", pod, svcName)
		if cp.NodeID != pod || cp.AdvertiseRaftAddr != host+":6702" || cp.AdvertiseAPIURL != "http://"+host+":6701" {
			t.Errorf("%s identity: node_id %q raft %q api %q; want the pod name and its headless DNS name", pod, cp.NodeID, cp.AdvertiseRaftAddr, cp.AdvertiseAPIURL)
		}
		if (i == 0) != cp.Bootstrap {
			t.Errorf("%s bootstrap=%v: only ordinal 0 bootstraps", pod, cp.Bootstrap)
		}
		if i > 0 && len(cp.Join) != 2 {
			t.Errorf("%s joins %v, want its two peers", pod, cp.Join)
		}
		if cp.DataDir != dataMount {
			t.Errorf("%s data_dir %q is not the PVC mount %q", pod, cp.DataDir, dataMount)
		}
		if cfg.Auth.TokenFile != tokenFile {
			t.Errorf("%s auth.token_file %q, want the Secret mount %q", pod, cfg.Auth.TokenFile, tokenFile)
		}
		if len(cfg.Workers) != 2 || cfg.Workers[0].MaxLoad != 32 {
			t.Errorf("%s seeds workers %+v, want the two from values", pod, cfg.Workers)
		}
	}
	if _, ok := data["rel-cart-cp-3.yaml"]; ok {
		t.Error("config rendered for a fourth node")
	}

	// After the first install node 0 can be told to join like the others,
	// so an empty volume cannot bootstrap a second cluster.
	joined := mustTemplate(t, "--set", "controlPlane.bootstrap=false")
	overlay := str(dig(joined.get(t, "ConfigMap", "rel-cart-config"), "data", "rel-cart-cp-0.yaml"))
	if strings.Contains(overlay, "bootstrap") || !strings.Contains(overlay, "rel-cart-cp-1.") || !strings.Contains(overlay, "rel-cart-cp-2.") {
		t.Errorf("controlPlane.bootstrap=false: node 0 overlay\n%s\nwant a join through nodes 1 and 2", overlay)
	}

	pdb := m.get(t, "PodDisruptionBudget", "rel-cart-cp")
	if dig(pdb, "spec", "minAvailable") != 2 {
		t.Errorf("control-plane PDB minAvailable %v, want 2 (the quorum of 3)", dig(pdb, "spec", "minAvailable"))
	}
	five := mustTemplate(t, "--set", "controlPlane.replicas=5")
	if v := dig(five.get(t, "PodDisruptionBudget", "rel-cart-cp"), "spec", "minAvailable"); v != 3 {
		t.Errorf("PDB minAvailable for 5 nodes %v, want 3", v)
	}
	if _, err := helmTemplate(t, "--set", "controlPlane.replicas=4"); err == nil || !strings.Contains(err.Error(), "odd") {
		t.Errorf("4 control-plane replicas rendered (%v); an even Raft cluster must be refused", err)
	}
}

func toStrings(v any) []string {
	var out []string
	for _, x := range list(v) {
		out = append(out, str(x))
	}
	return out
}

func tokenMountPath(t *testing.T, container any) string {
	t.Helper()
	for _, vm := range list(dig(container, "volumeMounts")) {
		if dig(vm, "name") == "token" {
			if dig(vm, "readOnly") != true {
				t.Errorf("token mount of %v is writable", dig(container, "name"))
			}
			return str(dig(vm, "mountPath"))
		}
	}
	t.Errorf("container %v does not mount the token Secret", dig(container, "name"))
	return ""
}

func TestHelmDataPlane(t *testing.T) {
	m := mustTemplate(t, withWorkers...)
	dep := m.get(t, "Deployment", "rel-cart-dataplane")
	if dig(dep, "spec", "replicas") != 2 {
		t.Errorf("Deployment replicas %v, want 2", dig(dep, "spec", "replicas"))
	}
	pod := dig(dep, "spec", "template", "spec")
	c := dig(pod, "containers", 0)
	// A data plane shares no lock: it keeps Go's default, a P per core.
	if slices.ContainsFunc(list(dig(c, "env")), func(e any) bool { return dig(e, "name") == "GOMAXPROCS" }) {
		t.Error("the data plane's GOMAXPROCS is set: the chart README says data planes keep Go's default")
	}
	if dig(c, "readinessProbe", "httpGet", "path") != "/health" {
		t.Errorf("data-plane readinessProbe %v, want httpGet /health", dig(c, "readinessProbe"))
	}
	if p := dig(c, "livenessProbe", "httpGet", "path"); p != nil && p != "/health" {
		t.Errorf("data-plane livenessProbe path %v", p)
	}
	if strings.Join(toStrings(dig(c, "args")), " ") != "cart dataplane -c /etc/cart/dataplane.yaml" {
		t.Errorf("data-plane args %v", dig(c, "args"))
	}
	svc := m.get(t, "Service", "rel-cart-dataplane")
	if dig(svc, "spec", "ports", 0, "port") != 6700 {
		t.Errorf("data-plane Service port %v", dig(svc, "spec", "ports", 0, "port"))
	}

	// waitForWorkers: an init container that blocks until a worker is listed.
	ic := dig(pod, "initContainers", 0)
	args := toStrings(dig(ic, "args"))
	if dig(ic, "name") != "wait-for-workers" || len(args) < 3 || args[0] != "cart-probe" || args[len(args)-2] != "workers" ||
		args[len(args)-1] != "http://rel-cart-cp.ns.svc.cluster.local:6701" {
		t.Errorf("wait-for-workers init container %v", ic)
	}
	tokenFile := tokenMountPath(t, c) + "/token"
	// ListWorkers is an admin call: the init container alone holds the
	// admin token; the serving container holds the cluster token and the
	// client key only.
	var adminMount string
	for _, vm := range list(dig(ic, "volumeMounts")) {
		if dig(vm, "name") == "admin-token" && dig(vm, "readOnly") == true {
			adminMount = str(dig(vm, "mountPath"))
		}
	}
	if adminMount == "" || !slices.Contains(args, "-token-file="+adminMount+"/admin-token") {
		t.Errorf("wait-for-workers does not read the admin token from its own mount: %v %v", args, dig(ic, "volumeMounts"))
	}
	vols := map[string][]string{}
	for _, v := range list(dig(pod, "volumes")) {
		for _, it := range list(dig(v, "secret", "items")) {
			vols[str(dig(v, "name"))] = append(vols[str(dig(v, "name"))], str(dig(it, "key")))
		}
	}
	if !slices.Equal(vols["token"], []string{"token", "client-key"}) || !slices.Equal(vols["admin-token"], []string{"admin-token"}) {
		t.Errorf("data-plane secret volumes %v", vols)
	}
	for _, vm := range list(dig(c, "volumeMounts")) {
		if dig(vm, "name") == "admin-token" {
			t.Error("the serving data-plane container mounts the admin token")
		}
	}
	if none := mustTemplate(t, "--set", "dataPlane.waitForWorkers.enabled=false"); dig(none.get(t, "Deployment", "rel-cart-dataplane"), "spec", "template", "spec", "initContainers") != nil {
		t.Error("waitForWorkers.enabled=false still renders the init container")
	}

	cm := m.get(t, "ConfigMap", "rel-cart-config")
	f := filepath.Join(t.TempDir(), "dataplane.yaml")
	if err := os.WriteFile(f, []byte(str(dig(cm, "data", "dataplane.yaml"))), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(f)
	if err != nil {
		t.Fatalf("dataplane.yaml: %v", err)
	}
	if len(cfg.DataPlane.ControlPlane) != 3 || cfg.Server.Port != 6700 || cfg.Auth.TokenFile != tokenFile {
		t.Errorf("dataplane.yaml: control_plane %v, port %d, token_file %q", cfg.DataPlane.ControlPlane, cfg.Server.Port, cfg.Auth.TokenFile)
	}
	// A data plane on 0.0.0.0 needs client keys; the chart ships one.
	if k := cfg.Auth.ClientKeys; len(k) != 1 || k[0].Name != "default" || k[0].KeyFile != tokenMountPath(t, c)+"/client-key" || cfg.Auth.AdminTokenFile != "" {
		t.Errorf("dataplane.yaml auth %+v: want the mounted client key and no admin token", cfg.Auth)
	}
	withSecretFiles(cfg, fakeSecrets(t))
	if err := cfg.Validate(config.RoleDataPlane); err != nil {
		t.Fatalf("dataplane.yaml: %v", err)
	}
	// Tenants added through dataPlane.config keep theirs next to the chart's.
	more := mustTemplate(t, "--set", "dataPlane.config.auth.client_keys[0].name=team-a", "--set", "dataPlane.config.auth.client_keys[0].key_file=/keys/team-a")
	dpYAML := str(dig(more.get(t, "ConfigMap", "rel-cart-config"), "data", "dataplane.yaml"))
	if !strings.Contains(dpYAML, "name: team-a") || !strings.Contains(dpYAML, "name: default") {
		t.Errorf("dataPlane.config client keys lost:\n%s", dpYAML)
	}

	// HPA only when enabled; then the Deployment leaves replicas to it.
	if hpas := m.all("HorizontalPodAutoscaler"); len(hpas) != 0 {
		t.Errorf("HPA rendered while disabled: %v", hpas)
	}
	scaled := mustTemplate(t, "--set", "dataPlane.hpa.enabled=true", "--set", "dataPlane.hpa.maxReplicas=7")
	hpa := scaled.get(t, "HorizontalPodAutoscaler", "rel-cart-dataplane")
	if dig(hpa, "spec", "scaleTargetRef", "name") != "rel-cart-dataplane" || dig(hpa, "spec", "maxReplicas") != 7 {
		t.Errorf("HPA %v", dig(hpa, "spec"))
	}
	if r := dig(scaled.get(t, "Deployment", "rel-cart-dataplane"), "spec", "replicas"); r != nil {
		t.Errorf("Deployment replicas %v with the HPA enabled: every upgrade would reset the HPA's count", r)
	}
}

// podSpecs returns every pod template in the release (and the Job's).
func podSpecs(m manifests) map[string]any {
	out := map[string]any{}
	for _, d := range m.docs {
		if spec := dig(d, "spec", "template", "spec"); spec != nil {
			out[str(d["kind"])+"/"+str(dig(d, "metadata", "name"))] = spec
		}
	}
	return out
}

func TestHelmSecurityAndToken(t *testing.T) {
	for _, tc := range []struct {
		name       string
		args       []string
		secretName string
		rendered   bool
	}{
		{"generated", nil, "rel-cart-auth", true},
		{"existingSecret", []string{"--set", "auth.existingSecret=my-token", "--set", "auth.secretKey=tok"}, "my-token", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := mustTemplate(t, append(tc.args, withWorkers...)...)
			secrets := m.all("Secret")
			if tc.rendered != (len(secrets) == 1) {
				t.Fatalf("%d Secrets rendered", len(secrets))
			}
			if tc.rendered {
				seen := map[string]bool{}
				for _, k := range []string{"token", "admin-token", "client-key", "raft-token"} {
					v := str(dig(secrets[0], "data", k))
					if len(v) < 40 || seen[v] {
						t.Errorf("generated %s %q is too short or not distinct", k, v)
					}
					seen[v] = true
				}
			}
			specs := podSpecs(m)
			if len(specs) != 3 {
				t.Fatalf("pod templates %v, want the StatefulSet, the Deployment and the workers Job", specs)
			}
			for name, spec := range specs {
				if dig(spec, "securityContext", "runAsNonRoot") != true || dig(spec, "securityContext", "seccompProfile", "type") != "RuntimeDefault" {
					t.Errorf("%s pod securityContext %v", name, dig(spec, "securityContext"))
				}
				if dig(spec, "automountServiceAccountToken") != false {
					t.Errorf("%s mounts a service account token; CART never calls the API server", name)
				}
				var tokenVol any
				for _, v := range list(dig(spec, "volumes")) {
					if dig(v, "name") == "token" {
						tokenVol = v
					}
				}
				if dig(tokenVol, "secret", "secretName") != tc.secretName {
					t.Errorf("%s token volume %v, want Secret %s", name, tokenVol, tc.secretName)
				}
				// Each pod gets the credentials of its role only.
				want := map[string][]string{"StatefulSet": {"token", "admin-token", "raft-token"}, "Deployment": {"token", "client-key"}, "Job": {"admin-token"}}[strings.SplitN(name, "/", 2)[0]]
				if !tc.rendered {
					want = slices.Clone(want)
					for i, k := range want {
						if k == "token" {
							want[i] = "tok"
						}
					}
				}
				var keys []string
				for _, it := range list(dig(tokenVol, "secret", "items")) {
					keys = append(keys, str(dig(it, "key")))
				}
				if !slices.Equal(keys, want) {
					t.Errorf("%s token volume reads keys %v, want %v", name, keys, want)
				}
				for _, c := range append(list(dig(spec, "initContainers")), list(dig(spec, "containers"))...) {
					sc := dig(c, "securityContext")
					drop := toStrings(dig(sc, "capabilities", "drop"))
					if dig(sc, "readOnlyRootFilesystem") != true || dig(sc, "allowPrivilegeEscalation") != false ||
						dig(sc, "runAsNonRoot") != true || !slices.Equal(drop, []string{"ALL"}) {
						t.Errorf("%s container %v securityContext %v", name, dig(c, "name"), sc)
					}
					if dig(c, "resources", "requests") == nil {
						t.Errorf("%s container %v has no resource requests", name, dig(c, "name"))
					}
					for _, e := range list(dig(c, "env")) {
						if strings.Contains(strings.ToLower(str(dig(e, "name"))), "token") && dig(e, "value") != nil && !strings.HasSuffix(str(dig(e, "name")), "_FILE") {
							t.Errorf("%s container %v has a literal token in env %v", name, dig(c, "name"), e)
						}
					}
				}
			}
		})
	}
}

func TestHelmNeverProbesModels(t *testing.T) {
	m := mustTemplate(t, append(withWorkers, "--set", "dataPlane.hpa.enabled=true", "--set", "metrics.serviceMonitor.enabled=true")...)
	var walk func(where string, v any)
	walk = func(where string, v any) {
		switch x := v.(type) {
		case obj:
			for k, c := range x {
				walk(where+"."+k, c)
			}
		case []any:
			for i, c := range x {
				walk(fmt.Sprintf("%s[%d]", where, i), c)
			}
		case string:
			// Config text in the ConfigMap may not name it either: a
			// health.endpoint of /v1/models would be the same mistake.
			if strings.Contains(x, "/v1/models") {
				t.Errorf("%s uses /v1/models (answered from a cache; never a probe): %q", where, x)
			}
		}
	}
	for _, d := range m.docs {
		walk(str(d["kind"])+"/"+str(dig(d, "metadata", "name")), d)
	}
	for name, spec := range podSpecs(m) {
		for _, c := range append(list(dig(spec, "initContainers")), list(dig(spec, "containers"))...) {
			for _, probe := range []string{"readinessProbe", "livenessProbe", "startupProbe"} {
				if p := dig(c, probe, "httpGet", "path"); p != nil && p != "/health" {
					t.Errorf("%s %v %s probes %v", name, dig(c, "name"), probe, p)
				}
			}
		}
	}
}

func TestHelmWorkersHook(t *testing.T) {
	if none := mustTemplate(t); len(none.all("Job")) != 0 {
		t.Error("workers Job rendered with no workers")
	}
	m := mustTemplate(t, withWorkers...)
	job := m.get(t, "Job", "rel-cart-workers")
	ann, _ := dig(job, "metadata", "annotations").(obj)
	hooks := strings.Split(str(ann["helm.sh/hook"]), ",")
	if !slices.Contains(hooks, "post-install") || !slices.Contains(hooks, "post-upgrade") {
		t.Errorf("helm.sh/hook %q, want post-install,post-upgrade", ann["helm.sh/hook"])
	}
	if !strings.Contains(str(ann["helm.sh/hook-delete-policy"]), "before-hook-creation") {
		t.Errorf("hook-delete-policy %q: a second upgrade would collide with the old Job", ann["helm.sh/hook-delete-policy"])
	}
	spec := dig(job, "spec", "template", "spec")
	if dig(spec, "restartPolicy") != "Never" {
		t.Errorf("Job restartPolicy %v", dig(spec, "restartPolicy"))
	}
	var adds [][]string
	for _, c := range list(dig(spec, "initContainers")) {
		a := toStrings(dig(c, "args"))
		if len(a) >= 3 && a[0] == "cartctl" && a[1] == "workers" && a[2] == "add" {
			adds = append(adds, a[3:])
		}
		if strings.HasPrefix(str(dig(c, "name")), "add-worker") {
			env := map[string]any{}
			for _, e := range list(dig(c, "env")) {
				env[str(dig(e, "name"))] = dig(e, "value")
			}
			if env["CARTCTL_SERVER"] != "http://rel-cart-cp.ns.svc.cluster.local:6701" || env["CARTCTL_TOKEN_FILE"] != tokenMountPath(t, c)+"/admin-token" {
				t.Errorf("%v env %v: want the control-plane Service and the mounted token", dig(c, "name"), env)
			}
		}
	}
	want := [][]string{{"http://vllm-0.vllm:8000", "--max-load=32"}, {"http://vllm-1.vllm:8000"}}
	if !slices.EqualFunc(adds, want, slices.Equal) {
		t.Errorf("cartctl workers add calls %v, want %v", adds, want)
	}
	// Values files hold numbers as floats: large ones must still render as
	// integers (not 1e+06) in cartctl flags.
	vf := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(vf, []byte("workers:\n  - url: http://a:8000\n    maxLoad: 1000000\n    loadPenalty: 2000000\n    cacheCapacityTokens: 3000000\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	big := toStrings(dig(mustTemplate(t, "-f", vf).get(t, "Job", "rel-cart-workers"), "spec", "template", "spec", "initContainers", 1, "args"))
	if want := []string{"cartctl", "workers", "add", "http://a:8000", "--max-load=1000000", "--load-penalty=2000000", "--cache-capacity-tokens=3000000"}; !slices.Equal(big, want) {
		t.Errorf("args %q, want %q", big, want)
	}
	if first := dig(spec, "initContainers", 0, "name"); first != "wait-for-leader" {
		t.Errorf("first Job step %v, want wait-for-leader", first)
	}
}

// TestHelmWorkerChangesDoNotRestart: the worker list reaches running pods
// through the hook Job, so it must not change the pods' config checksums
// (which would roll every pod); other config changes must.
func TestHelmWorkerChangesDoNotRestart(t *testing.T) {
	sums := func(args ...string) [2]string {
		m := mustTemplate(t, args...)
		return [2]string{
			str(dig(m.get(t, "StatefulSet", "rel-cart-cp"), "spec", "template", "metadata", "annotations", "checksum/config")),
			str(dig(m.get(t, "Deployment", "rel-cart-dataplane"), "spec", "template", "metadata", "annotations", "checksum/config")),
		}
	}
	base := sums()
	if base[0] == "" || base[1] == "" {
		t.Fatal("no checksum/config annotations")
	}
	if got := sums(withWorkers...); got != base {
		t.Errorf("adding workers changed the checksums %v -> %v: pods would restart", base, got)
	}
	if got := sums("--set", "config.log.level=debug"); got[0] == base[0] || got[1] == base[1] {
		t.Errorf("a config change left a checksum unchanged %v -> %v: pods would keep the old config", base, got)
	}
}

// The control plane's NetworkPolicy lets only control-plane pods reach
// Raft, and only the release's own pods, admin namespaces and the
// configured peers reach the API.
func TestHelmNetworkPolicy(t *testing.T) {
	m := mustTemplate(t, withWorkers...)
	np := m.get(t, "NetworkPolicy", "rel-cart-cp")
	cpSel := obj{"app.kubernetes.io/name": "cart", "app.kubernetes.io/instance": "rel", "app.kubernetes.io/component": "controlplane"}
	if got := dig(np, "spec", "podSelector", "matchLabels"); fmt.Sprint(got) != fmt.Sprint(cpSel) {
		t.Errorf("policy selects %v, want the control-plane pods %v", got, cpSel)
	}
	if got := toStrings(dig(np, "spec", "policyTypes")); !slices.Equal(got, []string{"Ingress"}) {
		t.Errorf("policyTypes %v", got)
	}
	// The pods must actually carry the labels the policy selects.
	sts := m.get(t, "StatefulSet", "rel-cart-cp")
	for k, v := range cpSel {
		if dig(sts, "spec", "template", "metadata", "labels", k) != v {
			t.Errorf("control-plane pods lack label %s=%v", k, v)
		}
	}
	rules := list(dig(np, "spec", "ingress"))
	byPort := map[int][]any{}
	for _, r := range rules {
		ports := list(dig(r, "ports"))
		if len(ports) != 1 {
			t.Fatalf("rule with ports %v: want exactly one port per rule", ports)
		}
		p, _ := dig(ports[0], "port").(int)
		byPort[p] = list(dig(r, "from"))
	}
	if len(byPort) != 2 {
		t.Fatalf("ingress rules for ports %v, want 6701 and 6702 only", byPort)
	}
	raftFrom := byPort[6702]
	if len(raftFrom) != 1 || fmt.Sprint(dig(raftFrom[0], "podSelector", "matchLabels")) != fmt.Sprint(cpSel) || dig(raftFrom[0], "namespaceSelector") != nil {
		t.Errorf("Raft port open to %v; want the control-plane pods only", raftFrom)
	}
	var components []string
	var nsLabels []string
	for _, f := range byPort[6701] {
		if c := str(dig(f, "podSelector", "matchLabels", "app.kubernetes.io/component")); c != "" {
			if dig(f, "podSelector", "matchLabels", "app.kubernetes.io/instance") != "rel" {
				t.Errorf("API peer %v not limited to this release", f)
			}
			components = append(components, c)
		}
		if l := dig(f, "namespaceSelector", "matchLabels"); l != nil {
			nsLabels = append(nsLabels, fmt.Sprint(l))
		}
	}
	if !slices.Equal(components, []string{"controlplane", "dataplane", "workers-job"}) {
		t.Errorf("API open to components %v", components)
	}
	if !slices.Equal(nsLabels, []string{"map[cart.cartrouter.io/admin:true]", "map[kubernetes.io/metadata.name:monitoring]"}) {
		t.Errorf("API open to namespaces %v", nsLabels)
	}

	// Configurable: another admin label, no extra peers; or no policy.
	m = mustTemplate(t, "--set", "networkPolicy.adminNamespaceLabels.team=ops", "--set", "networkPolicy.adminNamespaceLabels.cart\\.cartrouter\\.io/admin=null", "--set", "networkPolicy.apiFrom=null")
	np = m.get(t, "NetworkPolicy", "rel-cart-cp")
	from := list(dig(np, "spec", "ingress", 1, "from"))
	if len(from) != 4 || fmt.Sprint(dig(from[3], "namespaceSelector", "matchLabels")) != "map[team:ops]" {
		t.Errorf("API peers with a custom admin label: %v", from)
	}
	if nps := mustTemplate(t, "--set", "networkPolicy.enabled=false").all("NetworkPolicy"); len(nps) != 0 {
		t.Errorf("NetworkPolicy rendered while disabled: %v", nps)
	}
}

// TestHelmKubernetesDiscovery: Kubernetes discovery renders the control
// plane's own ServiceAccount and a Role granting get/list/watch on exactly
// what its source reads, in the watched namespace; without it, no RBAC and
// no token anywhere. The workers Job stays for static pools only.
func TestHelmKubernetesDiscovery(t *testing.T) {
	off := mustTemplate(t)
	if n := len(off.all("Role")) + len(off.all("RoleBinding")); n != 0 {
		t.Errorf("RBAC rendered without Kubernetes discovery (%d objects)", n)
	}

	for _, tc := range []struct {
		name, ns string
		args     []string
		rule     obj
		config   config.DiscoveryKubernetes
	}{
		{"service", "ns", []string{"--set", "discovery.kubernetes.service=vllm"},
			obj{"apiGroups": []any{"discovery.k8s.io"}, "resources": []any{"endpointslices"}, "verbs": []any{"get", "list", "watch"}},
			config.DiscoveryKubernetes{Enabled: true, Service: "vllm", Namespace: "ns", Port: "http"}},
		{"selector in another namespace", "gpu", []string{"--set", "discovery.kubernetes.selector=app=vllm", "--set", "discovery.kubernetes.namespace=gpu", "--set", "discovery.kubernetes.port=8000"},
			obj{"apiGroups": []any{""}, "resources": []any{"pods"}, "verbs": []any{"get", "list", "watch"}},
			config.DiscoveryKubernetes{Enabled: true, Selector: "app=vllm", Namespace: "gpu", Port: "8000"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := mustTemplate(t, append([]string{"--set", "discovery.kubernetes.enabled=true"}, tc.args...)...)
			sa := m.get(t, "ServiceAccount", "rel-cart-discovery")
			if dig(sa, "metadata", "namespace") != "ns" {
				t.Errorf("discovery ServiceAccount namespace %v, want the release's", dig(sa, "metadata", "namespace"))
			}
			role := m.get(t, "Role", "rel-cart-discovery")
			if dig(role, "metadata", "namespace") != tc.ns {
				t.Errorf("Role namespace %v, want the watched namespace %s", dig(role, "metadata", "namespace"), tc.ns)
			}
			if rules := list(dig(role, "rules")); len(rules) != 1 || fmt.Sprint(rules[0]) != fmt.Sprint(tc.rule) {
				t.Errorf("Role rules %v, want only %v", rules, tc.rule)
			}
			rb := m.get(t, "RoleBinding", "rel-cart-discovery")
			if dig(rb, "metadata", "namespace") != tc.ns || dig(rb, "roleRef", "kind") != "Role" || dig(rb, "roleRef", "name") != "rel-cart-discovery" ||
				dig(rb, "subjects", 0, "kind") != "ServiceAccount" || dig(rb, "subjects", 0, "name") != "rel-cart-discovery" || dig(rb, "subjects", 0, "namespace") != "ns" {
				t.Errorf("RoleBinding %v does not bind the Role to the control plane's ServiceAccount", rb)
			}
			for name, spec := range podSpecs(m) {
				wantSA, wantToken := "rel-cart", false
				if strings.HasPrefix(name, "StatefulSet/") {
					wantSA, wantToken = "rel-cart-discovery", true
				}
				if dig(spec, "serviceAccountName") != wantSA || dig(spec, "automountServiceAccountToken") != wantToken {
					t.Errorf("%s: serviceAccountName %v automount %v, want %s %v", name, dig(spec, "serviceAccountName"), dig(spec, "automountServiceAccountToken"), wantSA, wantToken)
				}
			}
			if jobs := m.all("Job"); len(jobs) != 0 {
				t.Errorf("workers Job rendered for a discovered pool with no static workers")
			}
			// The control plane's config turns discovery on, and validates.
			dir := t.TempDir()
			data, _ := dig(m.get(t, "ConfigMap", "rel-cart-config"), "data").(obj)
			for _, f := range []string{"controlplane.yaml", "rel-cart-cp-0.yaml", "dataplane.yaml"} {
				if err := os.WriteFile(filepath.Join(dir, f), []byte(str(data[f])), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			cfg, err := config.Load(filepath.Join(dir, "controlplane.yaml"), filepath.Join(dir, "rel-cart-cp-0.yaml"))
			if err != nil {
				t.Fatal(err)
			}
			got := cfg.Discovery.Kubernetes
			want := config.Default().Discovery.Kubernetes
			want.Enabled, want.Service, want.Selector, want.Namespace, want.Port = true, tc.config.Service, tc.config.Selector, tc.config.Namespace, tc.config.Port
			if got != want {
				t.Errorf("control-plane discovery.kubernetes %+v, want %+v", got, want)
			}
			withSecretFiles(cfg, fakeSecrets(t))
			if err := cfg.Validate(config.RoleControlPlane); err != nil {
				t.Errorf("control-plane config: %v", err)
			}
			dp, err := config.Load(filepath.Join(dir, "dataplane.yaml"))
			if err != nil || dp.Discovery.Kubernetes.Enabled {
				t.Errorf("data-plane config discovers too (%v): data planes must not", err)
			}
		})
	}

	both := mustTemplate(t, append([]string{"--set", "discovery.kubernetes.enabled=true", "--set", "discovery.kubernetes.service=vllm"}, withWorkers...)...)
	if len(both.all("Job")) != 1 {
		t.Error("static workers beside discovery: the workers Job must still register them")
	}
	for _, bad := range [][]string{
		{"--set", "discovery.kubernetes.enabled=true"},
		{"--set", "discovery.kubernetes.enabled=true", "--set", "discovery.kubernetes.service=vllm", "--set", "discovery.kubernetes.selector=app=vllm"},
	} {
		if _, err := helmTemplate(t, bad...); err == nil || !strings.Contains(err.Error(), "discovery.kubernetes") {
			t.Errorf("%v rendered (%v); want a template error naming discovery.kubernetes", bad, err)
		}
	}
}

// The chart runs a split pool of cart-sims: a StatefulSet per role with
// the role's flag, every pod registered with its role in the config seed
// and by the workers Job, and the control plane's config, with the roles,
// still valid.
func TestHelmSplitPoolOfSims(t *testing.T) {
	m := mustTemplate(t, "--set", "sims.replicas.prefill=2", "--set", "sims.replicas.decode=2", "--set", "sims.args={--time-scale=0.1}")
	for _, c := range []struct {
		role string
		n    int
	}{{"prefill", 2}, {"decode", 2}} {
		ss := m.get(t, "StatefulSet", "rel-cart-sim-"+c.role)
		if r := dig(ss, "spec", "replicas"); fmt.Sprint(r) != fmt.Sprint(c.n) {
			t.Errorf("%s replicas %v", c.role, r)
		}
		args := toStrings(dig(ss, "spec", "template", "spec", "containers", 0, "args"))
		if !slices.Contains(args, "--pd-role="+c.role) || !slices.Contains(args, "--time-scale=0.1") || args[0] != "cart-sim" {
			t.Errorf("%s args %q", c.role, args)
		}
		m.get(t, "Service", "rel-cart-sim-"+c.role)
	}
	for _, s := range m.all("StatefulSet") {
		if strings.Contains(str(dig(s, "metadata", "name")), "sim-both") {
			t.Error("a both StatefulSet rendered with no both replicas")
		}
	}
	var adds []string
	for _, c := range list(dig(m.get(t, "Job", "rel-cart-workers"), "spec", "template", "spec", "initContainers")) {
		if a := toStrings(dig(c, "args")); len(a) > 3 && a[2] == "add" {
			adds = append(adds, strings.Join(a[3:], " "))
		}
	}
	want := []string{
		"http://rel-cart-sim-prefill-0.rel-cart-sim-prefill.ns.svc.cluster.local:8000 --role=prefill",
		"http://rel-cart-sim-prefill-1.rel-cart-sim-prefill.ns.svc.cluster.local:8000 --role=prefill",
		"http://rel-cart-sim-decode-0.rel-cart-sim-decode.ns.svc.cluster.local:8000 --role=decode",
		"http://rel-cart-sim-decode-1.rel-cart-sim-decode.ns.svc.cluster.local:8000 --role=decode",
	}
	if !slices.Equal(adds, want) {
		t.Errorf("workers Job adds %q, want %q", adds, want)
	}
	dir := t.TempDir()
	data, _ := dig(m.get(t, "ConfigMap", "rel-cart-config"), "data").(obj)
	for _, f := range []string{"controlplane.yaml", "rel-cart-cp-0.yaml"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte(str(data[f])), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := config.Load(filepath.Join(dir, "controlplane.yaml"), filepath.Join(dir, "rel-cart-cp-0.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	roles := map[string]int{}
	for _, w := range cfg.Workers {
		roles[w.Role]++
	}
	if roles["prefill"] != 2 || roles["decode"] != 2 || len(cfg.Workers) != 4 {
		t.Errorf("seeded workers %+v", cfg.Workers)
	}
	withSecretFiles(cfg, fakeSecrets(t))
	if err := cfg.Validate(config.RoleControlPlane); err != nil {
		t.Errorf("control-plane config: %v", err)
	}
	if _, err := helmTemplate(t, "--set", "workers[0].url=http://a:8000", "--set", "workers[0].role=Prefill"); err == nil {
		t.Error("a misspelt worker role rendered")
	}
}

// Upgrading a release from a chart whose control plane keyed the Raft
// handshake with the cluster token: auth.raftAcceptClusterToken renders the
// transition setting into the control plane's config (and only there), and
// that config validates for the role.
func TestHelmRaftTokenTransition(t *testing.T) {
	m := mustTemplate(t, append([]string{"--set", "auth.raftAcceptClusterToken=true"}, withWorkers...)...)
	data, _ := dig(m.get(t, "ConfigMap", "rel-cart-config"), "data").(obj)
	dir := t.TempDir()
	for k, v := range data {
		if err := os.WriteFile(filepath.Join(dir, k), []byte(str(v)), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cp, err := config.Load(filepath.Join(dir, "controlplane.yaml"), filepath.Join(dir, "rel-cart-cp-0.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !cp.Auth.RaftAcceptClusterToken || cp.Auth.RaftTokenFile == "" {
		t.Errorf("control plane auth %+v: want the Raft token and the transition setting", cp.Auth)
	}
	withSecretFiles(cp, fakeSecrets(t))
	if err := cp.Validate(config.RoleControlPlane); err != nil {
		t.Errorf("control plane config in the transition: %v", err)
	}
	dp, err := config.Load(filepath.Join(dir, "dataplane.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if dp.Auth.RaftAcceptClusterToken || dp.Auth.RaftTokenFile != "" {
		t.Errorf("data plane auth %+v: holds Raft settings", dp.Auth)
	}
}

// The chart as an InferencePool's Endpoint Picker: the pickers'
// Deployment (cart epp, probes on the metrics port) and Service, the
// InferencePool naming them, the control plane discovering the pool's pods
// with RBAC for exactly that, a generated TLS certificate, and configs
// that validate for their roles.
func TestHelmEndpointPicker(t *testing.T) {
	pickers := []string{"--set", "endpointPicker.enabled=true", "--set", "endpointPicker.inferencePool.selector.app=vllm",
		"--set", "endpointPicker.inferencePool.targetPorts={8000,8001}", "--set", "endpointPicker.fallbackEndpoints=1"}
	run(t, repoRoot(t), helmBin(t), append([]string{"lint", "--strict", "--kube-version", helmKubeVersion, chartDir}, pickers...)...)
	m := mustTemplate(t, pickers...)

	dep := m.get(t, "Deployment", "rel-cart-epp")
	pod := dig(dep, "spec", "template", "spec")
	c := dig(pod, "containers", 0)
	if got := strings.Join(toStrings(dig(c, "args")), " "); got != "cart epp -c /etc/cart/epp.yaml -c /etc/cart/tls.yaml" {
		t.Errorf("picker args %q", got)
	}
	if dig(c, "readinessProbe", "httpGet", "path") != "/readyz" || dig(c, "readinessProbe", "httpGet", "port") != "metrics" ||
		dig(c, "livenessProbe", "httpGet", "path") != "/livez" {
		t.Errorf("picker probes %v %v: want /readyz and /livez on the metrics port", dig(c, "readinessProbe"), dig(c, "livenessProbe"))
	}
	if dig(pod, "automountServiceAccountToken") != false {
		t.Error("the pickers mount a ServiceAccount token: they read nothing from the API server")
	}
	svc := m.get(t, "Service", "rel-cart-epp")
	if dig(svc, "spec", "ports", 0, "port") != 9002 || dig(svc, "spec", "ports", 0, "name") != "grpc-ext-proc" {
		t.Errorf("picker Service ports %v", dig(svc, "spec", "ports"))
	}
	pool := m.get(t, "InferencePool", "rel-cart")
	if dig(pool, "apiVersion") != "inference.networking.k8s.io/v1" || dig(pool, "spec", "endpointPickerRef", "name") != "rel-cart-epp" ||
		dig(pool, "spec", "endpointPickerRef", "port", "number") != 9002 || dig(pool, "spec", "endpointPickerRef", "failureMode") != "FailClose" ||
		dig(pool, "spec", "selector", "matchLabels", "app") != "vllm" || dig(pool, "spec", "targetPorts", 1, "number") != 8001 {
		t.Errorf("InferencePool %v", dig(pool, "spec"))
	}
	role := m.get(t, "Role", "rel-cart-discovery")
	want := []any{
		obj{"apiGroups": []any{"inference.networking.k8s.io"}, "resources": []any{"inferencepools"}, "verbs": []any{"get", "list", "watch"}},
		obj{"apiGroups": []any{""}, "resources": []any{"pods"}, "verbs": []any{"get", "list", "watch"}},
	}
	if fmt.Sprint(dig(role, "rules")) != fmt.Sprint(want) {
		t.Errorf("discovery Role rules %v, want %v", dig(role, "rules"), want)
	}
	var apiFrom []string
	for _, f := range list(dig(m.get(t, "NetworkPolicy", "rel-cart-cp"), "spec", "ingress", 1, "from")) {
		apiFrom = append(apiFrom, str(dig(f, "podSelector", "matchLabels", "app.kubernetes.io/component")))
	}
	if !slices.Contains(apiFrom, "epp") {
		t.Errorf("the control plane's API is closed to the pickers: open to %v", apiFrom)
	}
	if sa := dig(m.get(t, "StatefulSet", "rel-cart-cp"), "spec", "template", "spec", "serviceAccountName"); sa != "rel-cart-discovery" {
		t.Errorf("control plane runs as %v, want the discovery ServiceAccount", sa)
	}
	tlsSecret := m.get(t, "Secret", "rel-cart-epp-tls")
	if dig(tlsSecret, "type") != "kubernetes.io/tls" {
		t.Errorf("TLS Secret type %v", dig(tlsSecret, "type"))
	}
	if existing := mustTemplate(t, append(pickers, "--set", "endpointPicker.tls.existingSecret=my-cert")...); len(existing.all("Secret")) != 1 {
		t.Error("a TLS Secret is generated although endpointPicker.tls.existingSecret names one")
	}

	// The configs: the pickers' validates as cart epp (asking the control
	// plane), with the mounted certificate; the control plane discovers
	// the pool.
	dir := t.TempDir()
	data, _ := dig(m.get(t, "ConfigMap", "rel-cart-config"), "data").(obj)
	for _, f := range []string{"epp.yaml", "epp-tls.yaml", "controlplane.yaml", "rel-cart-cp-0.yaml"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte(str(data[f])), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, kv := range [][2]string{{"tls.crt", "crt.pem"}, {"tls.key", "key.pem"}} {
		b, err := base64.StdEncoding.DecodeString(str(dig(tlsSecret, "data", kv[0])))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, kv[1]), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := config.Load(filepath.Join(dir, "epp.yaml"), filepath.Join(dir, "epp-tls.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Server.Port != 9002 || cfg.Server.MetricsAddr != "0.0.0.0:9090" || cfg.EPP.FallbackEndpoints != 1 || len(cfg.DataPlane.ControlPlane) != 3 ||
		cfg.Server.TLS.CertFile != "/etc/cart-tls/tls.crt" || !cfg.Auth.AllowUnauthenticatedRemote || len(cfg.Auth.ClientKeys) != 0 {
		t.Errorf("epp.yaml: %+v %+v %+v", cfg.Server, cfg.EPP, cfg.Auth)
	}
	withSecretFiles(cfg, fakeSecrets(t))
	cfg.Server.TLS.CertFile, cfg.Server.TLS.KeyFile = filepath.Join(dir, "crt.pem"), filepath.Join(dir, "key.pem")
	if err := cfg.Validate(config.RoleEPP); err != nil {
		t.Errorf("epp.yaml: %v", err)
	}
	if _, err := cfg.Server.TLS.ServerConfig(); err != nil {
		t.Errorf("the generated certificate does not load: %v", err)
	}
	cp, err := config.Load(filepath.Join(dir, "controlplane.yaml"), filepath.Join(dir, "rel-cart-cp-0.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if k := cp.Discovery.Kubernetes; !k.Enabled || k.InferencePool != "rel-cart" || k.Namespace != "ns" || k.Port != "" {
		t.Errorf("control-plane discovery %+v, want the InferencePool rel-cart", k)
	}
	withSecretFiles(cp, fakeSecrets(t))
	if err := cp.Validate(config.RoleControlPlane); err != nil {
		t.Errorf("controlplane.yaml: %v", err)
	}

	// Pickers only: no HTTP data planes.
	only := mustTemplate(t, append(pickers, "--set", "dataPlane.enabled=false")...)
	for _, kind := range []string{"Deployment", "Service", "PodDisruptionBudget"} {
		for _, d := range only.all(kind) {
			if strings.Contains(str(dig(d, "metadata", "name")), "dataplane") {
				t.Errorf("dataPlane.enabled=false still renders %s %s", kind, dig(d, "metadata", "name"))
			}
		}
	}
	for _, bad := range [][]string{
		{"--set", "endpointPicker.enabled=true"},
		append(slices.Clone(pickers), "--set", "discovery.kubernetes.enabled=true", "--set", "discovery.kubernetes.service=vllm"),
		append(slices.Clone(pickers), "--set", "endpointPicker.inferencePool.failureMode=Maybe"),
	} {
		if _, err := helmTemplate(t, bad...); err == nil {
			t.Errorf("%v rendered; want an error", bad)
		}
	}
}
