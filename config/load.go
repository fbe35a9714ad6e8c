package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

const (
	// maxNodes bounds the work done on one file after alias expansion.
	// Anchors let a tiny file describe an exponentially large tree; a real
	// config is a few hundred nodes, so this only ever stops abuse.
	maxNodes = 100_000
	// maxProblems keeps the report readable when a file is not a CART
	// config at all (every key unknown).
	maxProblems = 50
	// maxMergeDepth bounds chains of "<<" merge keys, which may also be
	// cyclic ("&a {<<: *a}").
	maxMergeDepth = 32
)

// Load reads the files in order and layers them over Default: mappings merge
// key by key, while lists and scalars are replaced wholesale, and a null
// value leaves the earlier value in place. It checks that every file is
// well-formed, uses only known keys and has values of the right type, but
// applies no value or role rules; call Validate for those.
//
// Every file is checked even after one fails so that the returned *Problems
// lists all problems, each with its file and line.
func Load(paths ...string) (*Config, error) {
	cfg := Default()
	cfg.origins = make(map[string]origin)
	var problems Problems
	for _, path := range paths {
		ps := loadFile(cfg, path)
		problems = append(problems, ps...)
	}
	cfg.Normalize()
	if len(problems) > 0 {
		// The best-effort config (every well-formed setting applied) comes
		// back too, so --config-check can validate it and list value
		// problems alongside the syntax ones. Never run with it.
		return cfg, problems.asError()
	}
	return cfg, nil
}

// loadFile checks one file and, if it has no problems, applies it to cfg.
func loadFile(cfg *Config, path string) Problems {
	data, err := os.ReadFile(path)
	if err != nil {
		return Problems{{File: path, Reason: readReason(err), cause: err}}
	}
	fc := &fileCheck{file: path, origins: make(map[string]int), budget: maxNodes}
	root := fc.parse(data)
	if len(fc.problems) > 0 || root == nil {
		return fc.problems
	}
	clean := fc.clean(root, reflect.TypeOf(Config{}), "")
	if clean == nil {
		return fc.problems
	}
	if len(fc.problems) > 0 {
		// Apply what is well-formed so later checks can still run (and
		// point at this file), then report this file's problems.
		if decodeNode(clean, cfg) == nil {
			fc.recordOrigins(cfg, path)
		}
		return fc.problems
	}
	if err := decodeNode(clean, cfg); err != nil {
		// The schema walk should have caught every type error; this is a
		// safety net so a disagreement between the walk and yaml.v3 is
		// reported instead of silently dropping a setting.
		return Problems{{File: path, Reason: fmt.Sprintf("cannot apply settings: %v", err), cause: err}}
	}
	fc.recordOrigins(cfg, path)
	return nil
}

// recordOrigins notes where this file set each key. A list replaces the
// earlier one wholesale, so origins recorded for the old list's items no
// longer describe anything.
func (fc *fileCheck) recordOrigins(cfg *Config, path string) {
	for _, list := range fc.lists {
		prefix := list + "["
		for k := range cfg.origins {
			if strings.HasPrefix(k, prefix) {
				delete(cfg.origins, k)
			}
		}
	}
	for k, line := range fc.origins {
		cfg.origins[k] = origin{file: path, line: line}
	}
}

// readReason describes a read error without repeating the path that the
// Problem already shows.
func readReason(err error) string {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return fmt.Sprintf("cannot read config file: %v", pe.Err)
	}
	return fmt.Sprintf("cannot read config file: %v", err)
}

func decodeNode(n *yaml.Node, cfg *Config) (err error) {
	defer func() {
		// yaml.v3 reports some internal failures by panicking; a config
		// file must never be able to crash the process.
		if r := recover(); r != nil {
			err = fmt.Errorf("yaml decoder panicked: %v", r)
		}
	}()
	return n.Decode(cfg)
}

// fileCheck walks one file's node tree against the Config schema, recording
// problems with this file's name and lines, and builds a cleaned copy of the
// tree that can be decoded over the running config.
type fileCheck struct {
	file     string
	problems Problems
	// origins maps dotted keys set by this file to the line setting them.
	origins map[string]int
	// lists holds the keys of lists this file replaces.
	lists        []string
	budget       int
	overBudgeted bool
	mergeTooDeep bool
}

func (fc *fileCheck) add(line int, key, format string, args ...any) {
	if len(fc.problems) > maxProblems {
		return
	}
	if len(fc.problems) == maxProblems {
		fc.problems = append(fc.problems, Problem{File: fc.file, Reason: "too many problems; fix the ones above and run again"})
		return
	}
	fc.problems = append(fc.problems, Problem{
		File:   fc.file,
		Line:   line,
		Key:    key,
		Reason: fmt.Sprintf(format, args...),
	})
}

var yamlErrLine = regexp.MustCompile(`^yaml: line (\d+): (?:column \d+: )?`)

// parse returns the document's root node, nil for an empty or comment-only
// file, or nil with problems recorded.
func (fc *fileCheck) parse(data []byte) (root *yaml.Node) {
	defer func() {
		if r := recover(); r != nil {
			fc.add(0, "", "YAML parser panicked: %v", r)
			root = nil
		}
	}()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil
		}
		fc.syntaxError(err)
		return nil
	}
	var extra yaml.Node
	switch err := dec.Decode(&extra); {
	case errors.Is(err, io.EOF):
	case err != nil:
		fc.syntaxError(err)
		return nil
	default:
		// Silently ignoring later documents would drop settings the user
		// believes are in effect.
		fc.add(extra.Line, "", "file contains more than one YAML document; put all settings in one document or use several -c files")
		return nil
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) == 0 {
		return nil
	}
	root = doc.Content[0]
	if d := fc.deref(root); d == nil || isNull(d) {
		return nil
	}
	return root
}

func (fc *fileCheck) syntaxError(err error) {
	msg := err.Error()
	line := 0
	if m := yamlErrLine.FindStringSubmatch(msg); m != nil {
		line, _ = strconv.Atoi(m[1])
		msg = msg[len(m[0]):]
	} else {
		msg = strings.TrimPrefix(msg, "yaml: ")
	}
	fc.problems = append(fc.problems, Problem{File: fc.file, Line: line, Reason: "invalid YAML: " + msg, cause: err})
}

// spend charges one node against the file's budget and reports once when it
// runs out.
func (fc *fileCheck) spend() bool {
	fc.budget--
	if fc.budget >= 0 {
		return true
	}
	if !fc.overBudgeted {
		fc.overBudgeted = true
		fc.add(0, "", "document is too large after expanding aliases (more than %d nodes)", maxNodes)
	}
	return false
}

// deref follows alias nodes to the node they name.
func (fc *fileCheck) deref(n *yaml.Node) *yaml.Node {
	// An alias cannot name another alias, but bound the loop anyway so a
	// malformed tree cannot hang the process.
	for i := 0; n != nil && n.Kind == yaml.AliasNode && i < 8; i++ {
		n = n.Alias
	}
	if n != nil && n.Kind == yaml.AliasNode {
		return nil
	}
	return n
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

// clean checks n against type t at the dotted key and returns a copy with
// aliases resolved, merge keys expanded and null-valued keys dropped. It
// returns nil when n is null (meaning "not set") or has problems.
func (fc *fileCheck) clean(n *yaml.Node, t reflect.Type, key string) *yaml.Node {
	if !fc.spend() {
		return nil
	}
	n = fc.deref(n)
	if n == nil || isNull(n) {
		return nil
	}
	switch t.Kind() {
	case reflect.Struct:
		return fc.cleanMapping(n, t, key)
	case reflect.Slice:
		return fc.cleanSequence(n, t, key)
	default:
		return fc.cleanScalar(n, t, key)
	}
}

type pair struct {
	key, value *yaml.Node
	line       int // where the setting is made: the key, or the "<<" using it
}

func (fc *fileCheck) cleanMapping(n *yaml.Node, t reflect.Type, key string) *yaml.Node {
	if n.Kind != yaml.MappingNode {
		fc.typeError(n, t, key)
		return nil
	}
	out := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Line: n.Line, Column: n.Column}
	seen := make(map[string]int)
	for _, p := range fc.pairs(n, key, 0) {
		if p.key.Kind != yaml.ScalarNode {
			fc.add(p.key.Line, key, "mapping keys must be plain strings")
			continue
		}
		name := p.key.Value
		child := joinKey(key, name)
		if first, dup := seen[name]; dup {
			fc.add(p.line, child, "duplicate key (already set on line %d)", first)
			continue
		}
		seen[name] = p.line
		field, ok := fieldByName(t, name)
		if !ok {
			if why, gone := removedKeys[child]; gone {
				fc.add(p.line, child, "removed: %s; delete the key", why)
				continue
			}
			fc.add(p.line, child, "%s", unknownKeyReason(t, name))
			continue
		}
		v := fc.clean(p.value, field.Type, child)
		if v == nil {
			continue
		}
		fc.origins[child] = p.line
		// A fresh key node keeps the decoder from seeing the original's
		// anchors or tags.
		k := &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: name, Line: p.key.Line, Column: p.key.Column}
		out.Content = append(out.Content, k, v)
	}
	return out
}

// pairs lists the key/value pairs of a mapping with "<<" merge keys
// expanded. Explicit keys come first and shadow merged ones, and earlier
// merge sources shadow later ones, as the YAML merge-key spec requires.
// Duplicate explicit keys are kept so cleanMapping can report them.
func (fc *fileCheck) pairs(n *yaml.Node, key string, depth int) []pair {
	if !fc.spend() {
		return nil
	}
	var explicit, merged []pair
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind == yaml.ScalarNode && k.ShortTag() == "!!merge" {
			for _, src := range fc.mergeSources(v, key) {
				if depth >= maxMergeDepth {
					if !fc.mergeTooDeep {
						fc.mergeTooDeep = true
						fc.add(k.Line, key, "merge keys (<<) nested too deeply, or a mapping merged into itself")
					}
					break
				}
				for _, mp := range fc.pairs(src, key, depth+1) {
					mp.line = k.Line
					merged = append(merged, mp)
				}
			}
			continue
		}
		explicit = append(explicit, pair{key: k, value: v, line: k.Line})
	}
	if len(merged) == 0 {
		return explicit
	}
	present := make(map[string]bool, len(explicit))
	for _, p := range explicit {
		if p.key.Kind == yaml.ScalarNode {
			present[p.key.Value] = true
		}
	}
	for _, mp := range merged {
		if !fc.spend() {
			break
		}
		if mp.key.Kind == yaml.ScalarNode && present[mp.key.Value] {
			continue
		}
		if mp.key.Kind == yaml.ScalarNode {
			present[mp.key.Value] = true
		}
		explicit = append(explicit, mp)
	}
	return explicit
}

// mergeSources returns the mappings named by a "<<" value: one mapping or a
// list of them.
func (fc *fileCheck) mergeSources(v *yaml.Node, key string) []*yaml.Node {
	v = fc.deref(v)
	if v == nil {
		return nil
	}
	switch v.Kind {
	case yaml.MappingNode:
		return []*yaml.Node{v}
	case yaml.SequenceNode:
		var srcs []*yaml.Node
		for _, item := range v.Content {
			if m := fc.deref(item); m != nil && m.Kind == yaml.MappingNode {
				srcs = append(srcs, m)
			} else {
				fc.add(item.Line, key, "merge key (<<) list items must be mappings")
			}
		}
		return srcs
	}
	fc.add(v.Line, key, "merge key (<<) value must be a mapping or a list of mappings")
	return nil
}

func (fc *fileCheck) cleanSequence(n *yaml.Node, t reflect.Type, key string) *yaml.Node {
	if n.Kind != yaml.SequenceNode {
		fc.typeError(n, t, key)
		return nil
	}
	out := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq", Line: n.Line, Column: n.Column}
	fc.lists = append(fc.lists, key)
	for i, item := range n.Content {
		itemKey := fmt.Sprintf("%s[%d]", key, i)
		if d := fc.deref(item); d == nil || isNull(d) {
			// Dropping the item would shift later indexes and make every
			// later error message point at the wrong item.
			fc.add(item.Line, itemKey, "empty list item")
			continue
		}
		v := fc.clean(item, t.Elem(), itemKey)
		if v == nil {
			continue
		}
		fc.origins[itemKey] = item.Line
		out.Content = append(out.Content, v)
	}
	return out
}

func (fc *fileCheck) cleanScalar(n *yaml.Node, t reflect.Type, key string) *yaml.Node {
	if n.Kind != yaml.ScalarNode {
		fc.typeError(n, t, key)
		return nil
	}
	if !scalarFits(n, t) {
		fc.typeError(n, t, key)
		return nil
	}
	return n
}

// scalarFits reports whether n decodes into a value of type t without loss.
func scalarFits(n *yaml.Node, t reflect.Type) (ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	if err := n.Decode(reflect.New(t).Interface()); err != nil {
		return false
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		// yaml.v3 truncates floats into integer fields ("port: 80.9"
		// becomes 80) and converts negative floats into unsigned fields;
		// only accept floats that are exact, in-range integers.
		if n.ShortTag() != "!!float" {
			return true
		}
		var f float64
		if err := n.Decode(&f); err != nil || f != math.Trunc(f) {
			return false
		}
		switch t.Kind() {
		case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
			return f >= 0 && f < math.Ldexp(1, t.Bits())
		default:
			return f >= -math.Ldexp(1, t.Bits()-1) && f < math.Ldexp(1, t.Bits()-1)
		}
	}
	return true
}

func (fc *fileCheck) typeError(n *yaml.Node, t reflect.Type, key string) {
	fc.add(n.Line, key, "expected %s, got %s", describeType(t), describeNode(n))
}

func describeType(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Struct:
		return "a mapping"
	case reflect.Slice:
		return "a list"
	case reflect.Bool:
		return "true or false"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a non-negative integer"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	}
	return t.String()
}

func describeNode(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	}
	v := n.Value
	if r := []rune(v); len(r) > 40 {
		v = string(r[:40]) + "…"
	}
	return strconv.Quote(v)
}

func joinKey(prefix, name string) string {
	if prefix == "" {
		return name
	}
	return prefix + "." + name
}

// yamlName returns the YAML key of a struct field, or "" for fields that are
// not part of the schema.
func yamlName(f reflect.StructField) string {
	if !f.IsExported() {
		return ""
	}
	name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
	if name == "-" {
		return ""
	}
	if name == "" {
		return strings.ToLower(f.Name)
	}
	return name
}

func fieldByName(t reflect.Type, name string) (reflect.StructField, bool) {
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if yamlName(f) == name {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

// removedKeys are keys earlier versions took, with what became of them: a
// config written for them is refused with the reason rather than as a
// typo.
var removedKeys = map[string]string{
	"server.own_http1_loop": "CART serves every request with Go's net/http (its own HTTP/1.1 loop was taken out: a second parser in front of net/http is a request-smuggling surface)",
}

// unknownKeyReason suggests the closest valid key, because most unknown
// keys are typos of a real one.
func unknownKeyReason(t reflect.Type, name string) string {
	best, bestDist := "", 0
	for i := 0; i < t.NumField(); i++ {
		cand := yamlName(t.Field(i))
		if cand == "" {
			continue
		}
		d := editDistance(strings.ToLower(name), cand)
		if best == "" || d < bestDist {
			best, bestDist = cand, d
		}
	}
	limit := 2
	if len(name) > 12 {
		limit = 3
	}
	if best != "" && bestDist <= limit {
		return fmt.Sprintf("unknown key (did you mean %q?)", best)
	}
	return "unknown key"
}

// editDistance is the Levenshtein distance between a and b, in bytes; keys
// are ASCII so bytes are characters.
func editDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		// Far too long to be a typo of a real key; skip the quadratic work.
		return math.MaxInt32
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
