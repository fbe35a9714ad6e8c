package models

import (
	"encoding/json"
	"errors"
	"slices"
	"testing"
)

func cards(t *testing.T, body string) []Card {
	t.Helper()
	c, err := Parse([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestExcludeRules(t *testing.T) {
	r := New()
	r.SetWorkers([]Worker{{URL: "a"}, {URL: "b"}, {URL: "c", Declared: []string{"d"}}})
	// c is known (declared), a and b unknown.
	check := func(model string, want []string, wantErr bool) {
		t.Helper()
		got, err := r.Exclude(model)
		if wantErr != (err != nil) || (err != nil && !errors.Is(err, ErrNotServed)) || !slices.Equal(got, want) {
			t.Fatalf("Exclude(%q) = %v, %v; want %v, error %v", model, got, err, want, wantErr)
		}
	}
	check("", nil, false)
	check("d", nil, false)           // a base model: a and b, not read yet, likely serve it too
	check("x", []string{"c"}, false) // maybe served by a worker whose list is unknown
	r.SetLearned("a", cards(t, `{"data":[{"id":"base"},{"id":"lora"}]}`))
	r.SetLearned("b", cards(t, `{"data":[{"id":"base"}]}`))
	check("lora", []string{"b", "c"}, false)
	check("base", []string{"c"}, false)
	check("x", nil, true) // every list is known, none serves it
	// An unloaded adapter is seen at the next report.
	r.SetLearned("a", cards(t, `{"data":[{"id":"base"}]}`))
	check("lora", nil, true)
	// Removing a worker forgets what it learned; a late report is ignored.
	r.SetWorkers([]Worker{{URL: "b"}})
	if r.SetLearned("a", cards(t, `{"data":[{"id":"lora"}]}`)) {
		t.Fatal("a removed worker's report was recorded")
	}
	check("base", nil, false)
	check("lora", nil, true)
}

// An adapter goes only where it is known to be loaded; a base model also to
// workers whose list is not read yet (just added, or mid first round), so
// they are not all excluded until the first probe round completes.
func TestAdapterStrictBaseLenient(t *testing.T) {
	r := New()
	r.SetWorkers([]Worker{{URL: "a"}, {URL: "b"}, {URL: "new"}})
	r.SetLearned("a", cards(t, `{"data":[{"id":"base","parent":null},{"id":"sql-lora","root":"/adapters/sql","parent":"base"}]}`))
	r.SetLearned("b", cards(t, `{"data":[{"id":"base","parent":null},{"id":"other"}]}`))
	for model, want := range map[string][]string{
		"base":     nil,          // new is unknown: not excluded
		"sql-lora": {"b", "new"}, // an adapter: only where it is loaded
		"other":    {"a"},        // a base model of b: a is known not to serve it
		"x":        {"a", "b"},   // listed nowhere: maybe on the unknown worker
	} {
		got, err := r.Exclude(model)
		if err != nil || !slices.Equal(got, want) {
			t.Fatalf("Exclude(%q) = %v, %v; want %v", model, got, err, want)
		}
	}
}

func TestNothingKnownFiltersNothing(t *testing.T) {
	r := New()
	r.SetWorkers([]Worker{{URL: "a"}, {URL: "b"}})
	if ex, err := r.Exclude("anything"); err != nil || ex != nil || r.Known() {
		t.Fatalf("Exclude = %v, %v; Known %v", ex, err, r.Known())
	}
	var nilReg *Registry
	if ex, err := nilReg.Exclude("m"); err != nil || ex != nil {
		t.Fatal("a nil registry must not filter")
	}
}

func TestListUnionFirstCardWins(t *testing.T) {
	r := New()
	r.SetWorkers([]Worker{{URL: "a"}, {URL: "b", Declared: []string{"decl"}}, {URL: "c"}})
	r.SetLearned("a", cards(t, `{"data":[{"id":"base","owned_by":"a"}]}`))
	r.SetLearned("b", cards(t, `{"data":[{"id":"base","owned_by":"b"},{"id":"lora","parent":"base"}]}`))
	r.SetLearned("c", cards(t, `{"data":[{"id":"only-c"}]}`))
	var out struct {
		Object string
		Data   []map[string]any
	}
	if err := json.Unmarshal(r.List(func(w string) bool { return w != "c" }), &out); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, d := range out.Data {
		ids = append(ids, d["id"].(string))
	}
	if out.Object != "list" || !slices.Equal(ids, []string{"base", "lora", "decl"}) || out.Data[0]["owned_by"] != "a" || out.Data[1]["parent"] != "base" {
		t.Fatalf("List = %+v", out)
	}
	if got := r.IDs("b"); !slices.Equal(got, []string{"base", "lora", "decl"}) {
		t.Fatalf("IDs(b) = %v", got)
	}
}

func TestParseRejectsMalformedLists(t *testing.T) {
	for _, body := range []string{``, `[]`, `{"object":"list"}`, `{"data":[{"object":"model"}]}`, `{"data":[{"id":5}]}`, `{"data":[1]}`} {
		if _, err := Parse([]byte(body)); err == nil {
			t.Errorf("Parse(%q) accepted", body)
		}
	}
	if c, err := Parse([]byte(`{"data":[]}`)); err != nil || len(c) != 0 {
		t.Fatalf("empty list: %v %v", c, err)
	}
}

func TestSetLearnedIDsSynthesizesCards(t *testing.T) {
	r := New()
	r.SetWorkers([]Worker{{URL: "a"}})
	if !r.SetLearnedIDs("a", []string{"m"}) || r.SetLearnedIDs("a", []string{"m"}) {
		t.Fatal("SetLearnedIDs must report a change once")
	}
	var out struct{ Data []map[string]any }
	_ = json.Unmarshal(r.List(nil), &out)
	if len(out.Data) != 1 || out.Data[0]["id"] != "m" || out.Data[0]["object"] != "model" {
		t.Fatalf("List = %+v", out)
	}
}
