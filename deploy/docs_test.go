package deploy

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// docPages are the pages a reader follows from the README: the README,
// the design map and docs/, relative to the repository root.
func docPages(t *testing.T) []string {
	t.Helper()
	pages, err := filepath.Glob(path(t, "docs", "*.md"))
	if err != nil || len(pages) == 0 {
		t.Fatalf("no docs/*.md pages (%v)", err)
	}
	out := []string{"README.md", "DESIGN.md"}
	for _, p := range pages {
		out = append(out, filepath.ToSlash(strings.TrimPrefix(p, repoRoot(t)+string(filepath.Separator))))
	}
	return out
}

var (
	fence      = regexp.MustCompile("(?ms)^```.*?^```")
	codeSpan   = regexp.MustCompile("`[^`\n]*`")
	mdLink     = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	mdHeading  = regexp.MustCompile(`(?m)^#{1,6} +(.+?)\s*$`)
	notInSlugs = regexp.MustCompile(`[^\p{L}\p{N} _-]`)
)

// prose is a page without its code: links and headings in code blocks and
// spans are examples, not navigation.
func prose(page string) string {
	return codeSpan.ReplaceAllString(fence.ReplaceAllString(page, ""), "")
}

// anchors are the fragment ids GitHub gives a page's headings: lower case,
// punctuation dropped, spaces to hyphens, repeats numbered.
func anchors(page string) map[string]bool {
	ids, seen := map[string]bool{}, map[string]int{}
	for _, m := range mdHeading.FindAllStringSubmatch(fence.ReplaceAllString(page, ""), -1) {
		text := strings.NewReplacer("`", "", "**", "", "*", "").Replace(m[1])
		id := strings.ReplaceAll(notInSlugs.ReplaceAllString(strings.Map(unicode.ToLower, text), ""), " ", "-")
		if n := seen[id]; n > 0 {
			ids[id+"-"+strconv.Itoa(n)] = true
		} else {
			ids[id] = true
		}
		seen[id]++
	}
	return ids
}

// Every relative link of the README, DESIGN.md and docs/ points at a file
// that exists, and a link into a Markdown page at one of its headings:
// moving a section must move the links to it.
func TestDocsLinks(t *testing.T) {
	for _, page := range docPages(t) {
		for _, m := range mdLink.FindAllStringSubmatch(prose(string(readFile(t, page))), -1) {
			target := m[1]
			if strings.HasPrefix(target, "http://") || strings.HasPrefix(target, "https://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, frag, _ := strings.Cut(target, "#")
			abs := path(t, page)
			if file != "" {
				abs = filepath.Join(filepath.Dir(path(t, page)), filepath.FromSlash(file))
			}
			if _, err := os.Stat(abs); err != nil {
				t.Errorf("%s links to %s, which does not exist", page, target)
				continue
			}
			if frag == "" || !strings.HasSuffix(abs, ".md") {
				continue
			}
			b, err := os.ReadFile(abs)
			if err != nil {
				t.Fatal(err)
			}
			if !anchors(string(b))[frag] {
				t.Errorf("%s links to %s, which has no heading #%s", page, target, frag)
			}
		}
	}
}

// The README's quick start keeps its two set-up commands, and CI runs the
// same test command the README gives.
func TestReadmeQuickStartCommands(t *testing.T) {
	readme := string(readFile(t, "README.md"))
	i := strings.Index(readme, "## Quick start")
	if i < 0 {
		t.Fatal("README has no quick start")
	}
	quick := readme[i:]
	if j := strings.Index(quick[1:], "\n## "); j >= 0 {
		quick = quick[:j+1]
	}
	for _, cmd := range []string{"make run ", "make test "} {
		if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(cmd)).MatchString(quick) {
			t.Errorf("the README's quick start has no line starting %q", cmd)
		}
	}
	if !regexp.MustCompile(`(?m)^make test\b`).Match(readFile(t, ".ci", "run")) {
		t.Error(".ci/run does not run make test, the README's test command")
	}
	makefile := string(readFile(t, "Makefile"))
	for _, target := range []string{"run", "test"} {
		if !regexp.MustCompile(`(?m)^` + target + `:`).MatchString(makefile) {
			t.Errorf("Makefile has no %s target", target)
		}
	}
}
