package deploy

import (
	"debug/elf"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// instruction is one Dockerfile instruction with continuation lines joined.
type instruction struct {
	cmd  string // upper case
	args string
	line int
}

type stage struct {
	from string // FROM arguments
	ins  []instruction
}

// parseDockerfile splits the Dockerfile into global instructions (before
// the first FROM) and stages. It knows comments, line continuations and
// nothing else, which is all this Dockerfile uses (no heredocs).
func parseDockerfile(t *testing.T, src string) (global []instruction, stages []stage) {
	t.Helper()
	var cur *instruction
	lines := strings.Split(src, "\n")
	var ins []instruction
	for i, l := range lines {
		trimmed := strings.TrimSpace(l)
		if cur == nil && (trimmed == "" || strings.HasPrefix(trimmed, "#")) {
			continue
		}
		if cur != nil && strings.HasPrefix(trimmed, "#") {
			continue // comment inside a continued instruction
		}
		cont := strings.HasSuffix(trimmed, "\\")
		body := strings.TrimSuffix(trimmed, "\\")
		if cur == nil {
			cmd, args, _ := strings.Cut(body, " ")
			cur = &instruction{cmd: strings.ToUpper(cmd), args: strings.TrimSpace(args), line: i + 1}
		} else {
			cur.args = strings.TrimSpace(cur.args + " " + strings.TrimSpace(body))
		}
		if !cont {
			ins = append(ins, *cur)
			cur = nil
		}
	}
	if cur != nil {
		t.Fatalf("Dockerfile ends inside a continued instruction (line %d)", cur.line)
	}
	for _, in := range ins {
		switch {
		case in.cmd == "FROM":
			stages = append(stages, stage{from: in.args})
		case len(stages) == 0:
			global = append(global, in)
		default:
			stages[len(stages)-1].ins = append(stages[len(stages)-1].ins, in)
		}
	}
	return global, stages
}

func argDefaults(ins []instruction) map[string]string {
	m := map[string]string{}
	for _, in := range ins {
		if in.cmd == "ARG" {
			k, v, _ := strings.Cut(in.args, "=")
			m[k] = v
		}
	}
	return m
}

func TestDockerfile(t *testing.T) {
	global, stages := parseDockerfile(t, string(readFile(t, "Dockerfile")))
	args := argDefaults(global)
	if got := args["BUILDER_IMAGE"]; got != "golang:1.26-bookworm" {
		t.Errorf("ARG BUILDER_IMAGE default = %q, want golang:1.26-bookworm", got)
	}
	if got := args["RUNTIME_IMAGE"]; got != "gcr.io/distroless/static-debian12:nonroot" {
		t.Errorf("ARG RUNTIME_IMAGE default = %q: the entrypoint and probe are static Go programs, so a shell-less static image is the runtime (deploy/README.md)", got)
	}
	// The builder's Go must be the go.mod toolchain line.
	gomod := string(readFile(t, "go.mod"))
	goLine := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindStringSubmatch(gomod)
	if goLine == nil || !strings.Contains(args["BUILDER_IMAGE"], "golang:"+goLine[1]+"-") {
		t.Errorf("BUILDER_IMAGE %q does not match go.mod's go %v", args["BUILDER_IMAGE"], goLine)
	}
	if len(stages) != 2 {
		t.Fatalf("want a builder and a runtime stage, got %d stages", len(stages))
	}
	build, rt := stages[0], stages[1]
	if !strings.Contains(build.from, "${BUILDER_IMAGE}") || !strings.HasSuffix(build.from, "AS build") {
		t.Errorf("builder stage FROM %q", build.from)
	}
	bargs := argDefaults(build.ins)
	if bargs["GOPROXY"] != "https://proxy.golang.org,direct" {
		t.Errorf("ARG GOPROXY default = %q", bargs["GOPROXY"])
	}
	hasCGO := false
	for _, in := range build.ins {
		if in.cmd == "ENV" && strings.Contains(in.args, "CGO_ENABLED=0") {
			hasCGO = true
		}
	}
	if !hasCGO {
		t.Error("builder does not set CGO_ENABLED=0: binaries would need a libc the runtime image lacks")
	}
	if !slices.ContainsFunc(build.ins, func(in instruction) bool {
		return in.cmd == "RUN" && strings.Contains(in.args, "deploy/docker/build.sh /out")
	}) {
		t.Error("builder does not run deploy/docker/build.sh /out (the script TestImageBuildScript runs)")
	}

	if rt.from != "${RUNTIME_IMAGE}" {
		t.Errorf("runtime stage FROM %q, want ${RUNTIME_IMAGE}", rt.from)
	}
	var copies []string
	var user, entrypoint, cmd string
	var expose []string
	for _, in := range rt.ins {
		switch in.cmd {
		case "RUN", "ADD":
			t.Errorf("line %d: runtime stage has %s: it must install nothing and fetch nothing", in.line, in.cmd)
		case "COPY":
			if !strings.HasPrefix(in.args, "--from=build ") {
				t.Errorf("line %d: runtime COPY %q does not come from the builder", in.line, in.args)
			}
			copies = append(copies, in.args)
		case "USER":
			user = in.args
		case "ENTRYPOINT":
			entrypoint = in.args
		case "CMD":
			cmd = in.args
		case "EXPOSE":
			expose = append(expose, strings.Fields(in.args)...)
		}
	}
	wantCopies := []string{
		"/etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt",
		"/out/usr/local/bin/ /usr/local/bin/",
		"/out/var/lib/cart/ /var/lib/cart/",
	}
	for _, w := range wantCopies {
		if !slices.ContainsFunc(copies, func(c string) bool { return strings.HasSuffix(c, w) }) {
			t.Errorf("runtime stage lacks COPY --from=build ... %s (has %q)", w, copies)
		}
	}
	for _, c := range copies {
		if strings.HasSuffix(c, "/usr/local/bin/") && strings.Contains(c, "--chown") {
			t.Errorf("binaries are chowned (%q): the runtime user must not be able to rewrite them", c)
		}
	}
	uid, _, _ := strings.Cut(user, ":")
	if uid == "" || uid == "0" || uid == "root" || !regexp.MustCompile(`^\d+$`).MatchString(uid) {
		t.Errorf("USER %q: want a numeric non-root uid (runAsNonRoot can only verify numeric users)", user)
	}
	for _, p := range []string{"6700", "6701", "6702"} {
		if !slices.Contains(expose, p) {
			t.Errorf("EXPOSE lacks %s (has %v)", p, expose)
		}
	}
	var ep, cm []string
	if err := json.Unmarshal([]byte(entrypoint), &ep); err != nil || len(ep) != 1 || ep[0] != "/usr/local/bin/cart-entrypoint" {
		t.Errorf("ENTRYPOINT %s: want exec form [\"/usr/local/bin/cart-entrypoint\"] (no shell in the image)", entrypoint)
	}
	if err := json.Unmarshal([]byte(cmd), &cm); err != nil || len(cm) == 0 || cm[0] != "cart" {
		t.Errorf("CMD %s: want exec form starting with cart", cmd)
	}
}

// makefileBinaries reads BINARIES from the Makefile.
func makefileBinaries(t *testing.T) []string {
	m := regexp.MustCompile(`(?m)^BINARIES\s*:?=\s*(.+)$`).FindStringSubmatch(string(readFile(t, "Makefile")))
	if m == nil {
		t.Fatal("Makefile has no BINARIES line")
	}
	return strings.Fields(m[1])
}

// TestImageBuildScript runs the builder stage's script on the host: every
// binary the image promises is built, static and runnable through the
// entrypoint, without a Docker engine.
func TestImageBuildScript(t *testing.T) {
	script := string(readFile(t, "deploy", "docker", "build.sh"))
	m := regexp.MustCompile(`(?m)^for b in ([^;]+); do`).FindStringSubmatch(script)
	if m == nil {
		t.Fatal("build.sh has no `for b in ...; do` binary list")
	}
	want := makefileBinaries(t)
	if got := strings.Fields(m[1]); !slices.Equal(got, want) {
		t.Errorf("build.sh builds %v, the Makefile's BINARIES are %v", got, want)
	}
	for _, b := range want {
		if _, err := os.Stat(path(t, "cli", b, "main.go")); err != nil {
			t.Errorf("the image builds %s but cli/%s/main.go is missing: %v", b, b, err)
		}
	}

	sh := tool(t, "apt-get install shellcheck", "shellcheck")
	run(t, repoRoot(t), sh, "-s", "sh", "deploy/docker/build.sh")

	if testing.Short() {
		t.Skip("-short: not building the image binaries")
	}
	out := t.TempDir()
	if o, err := runErr(repoRoot(t), []string{"VERSION=v9.9.9-test", "COMMIT=abc1234"}, "sh", "deploy/docker/build.sh", out); err != nil {
		t.Fatalf("build.sh: %v\n%s", err, o)
	}
	bin := filepath.Join(out, "usr", "local", "bin")
	for _, b := range append(want, "cart-entrypoint", "cart-probe") {
		f, err := elf.Open(filepath.Join(bin, b))
		if err != nil {
			t.Errorf("%s: %v", b, err)
			continue
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				t.Errorf("%s is dynamically linked: it cannot start in a static runtime image", b)
			}
		}
		f.Close()
	}
	for _, d := range []string{"var/lib/cart", "etc/cart"} {
		if st, err := os.Stat(filepath.Join(out, d)); err != nil || !st.IsDir() {
			t.Errorf("build.sh did not create %s for the runtime stage: %v", d, err)
		}
	}
	// The entrypoint finds the binaries through PATH, as in the image, and
	// the version stamp arrives.
	o, err := runErr(out, []string{"PATH=" + bin, "CART_MIN_OPEN_FILES=0"}, filepath.Join(bin, "cart-entrypoint"), "cart", "--version")
	if err != nil || !strings.Contains(o, "v9.9.9-test") || !strings.Contains(o, "abc1234") {
		t.Errorf("cart-entrypoint cart --version: %v: %q (want the VERSION and COMMIT build args)", err, o)
	}
}

// TestDockerignore keeps every file a build needs in the context: the
// packages of each image binary and everything they import from this
// module.
func TestDockerignore(t *testing.T) {
	patterns := parseDockerignore(string(readFile(t, ".dockerignore")))
	// go test puts its own GOROOT/bin first in PATH.
	goTool := "go"
	pkgs := []string{"./deploy/docker/entrypoint", "./deploy/docker/probe"}
	for _, b := range makefileBinaries(t) {
		pkgs = append(pkgs, "./cli/"+b)
	}
	listArgs := append([]string{"list", "-deps", "-f", "{{if .Module}}{{if .Module.Main}}{{.Dir}}{{range .GoFiles}} {{.}}{{end}}{{end}}{{end}}"}, pkgs...)
	out := run(t, repoRoot(t), goTool, listArgs...)
	root := repoRoot(t)
	needed := []string{"go.mod", "go.sum", "deploy/docker/build.sh"}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		rel, err := filepath.Rel(root, f[0])
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range f[1:] {
			needed = append(needed, filepath.ToSlash(filepath.Join(rel, g)))
		}
	}
	if len(needed) < 10 {
		t.Fatalf("go list found only %d files; the test is not looking at the build", len(needed))
	}
	for _, n := range needed {
		if dockerignored(patterns, n) {
			t.Errorf(".dockerignore excludes %s, which the image build needs", n)
		}
	}
	for _, n := range []string{".git/HEAD", "bin/cart", ".tools/helm", "deploy/helm/cart/Chart.yaml"} {
		if !dockerignored(patterns, n) {
			t.Errorf(".dockerignore lets %s into the build context", n)
		}
	}
}

type ignorePattern struct {
	negate bool
	glob   string
}

func parseDockerignore(src string) []ignorePattern {
	var ps []ignorePattern
	for _, l := range strings.Split(src, "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		p := ignorePattern{}
		if strings.HasPrefix(l, "!") {
			p.negate, l = true, l[1:]
		}
		p.glob = strings.Trim(filepath.ToSlash(filepath.Clean(l)), "/")
		ps = append(ps, p)
	}
	return ps
}

// dockerignored applies the patterns as Docker does for the cases this
// file uses: the last matching pattern wins, a pattern matching a
// directory matches everything below it, and "**/" matches any depth.
func dockerignored(ps []ignorePattern, file string) bool {
	ignored := false
	parts := strings.Split(file, "/")
	for _, p := range ps {
		for i := 1; i <= len(parts); i++ {
			prefix := strings.Join(parts[:i], "/")
			if globMatch(p.glob, prefix) {
				ignored = !p.negate
				break
			}
		}
	}
	return ignored
}

func globMatch(glob, name string) bool {
	if rest, ok := strings.CutPrefix(glob, "**/"); ok {
		parts := strings.Split(name, "/")
		for i := range parts {
			if ok, _ := filepath.Match(rest, strings.Join(parts[i:], "/")); ok {
				return true
			}
		}
		return false
	}
	ok, _ := filepath.Match(glob, name)
	return ok
}
