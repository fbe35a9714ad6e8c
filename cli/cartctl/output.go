package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/cartrouter/cart/config"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
)

// marshalJSON renders m as the API's canonical JSON with every field
// present (a script should not have to know proto3's zero-value rules) and
// proto field names, matching the .proto files and `buf curl`.
//
// protojson deliberately varies its whitespace between runs, so the
// result is re-indented to make the output stable and diffable.
func marshalJSON(m proto.Message) ([]byte, error) {
	raw, err := protojson.MarshalOptions{EmitUnpopulated: true, UseProtoNames: true}.Marshal(m)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, raw, "", "  "); err != nil {
		return nil, err
	}
	buf.WriteByte('\n')
	return buf.Bytes(), nil
}

func writeJSON(w io.Writer, m proto.Message) error {
	b, err := marshalJSON(m)
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

func newTable(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// maxLoadText and capacityText spell out what 0 means for these fields, so
// nobody reads "0" as "takes no requests".
func maxLoadText(n uint32) string {
	if n == 0 {
		return "unlimited"
	}
	return strconv.FormatUint(uint64(n), 10)
}

func capacityText(n int64) string {
	if n == 0 {
		return "default"
	}
	return strconv.FormatInt(n, 10)
}

func writeWorkersTable(w io.Writer, resp *cartv1.ListWorkersResponse) error {
	tw := newTable(w)
	fmt.Fprintln(tw, "URL\tHEALTHY\tLOAD\tMAX_LOAD\tPENALTY\tCAPACITY\tENGINE_CACHE\tSOURCE\tROLE")
	for _, wk := range resp.GetWorkers() {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%d\t%s\t%s\t%s\t%s\n", wk.GetUrl(), yesNo(wk.GetHealthy()), wk.GetLoad(),
			maxLoadText(wk.GetMaxLoad()), wk.GetLoadPenalty(), capacityText(wk.GetCacheCapacityTokens()), engineCacheText(wk.GetKvCache()), sourceText(wk), config.RoleShown(wk.GetRole()))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	// The version lets an operator see whether two listings (or a data
	// plane's view) reflect the same worker set.
	_, err := fmt.Fprintf(w, "\n%d worker(s), workers version %d; CAPACITY is in tokens; ENGINE_CACHE is occupied/size tokens from the engine's KV events (- without)\n",
		len(resp.GetWorkers()), resp.GetWorkersVersion())
	return err
}

// engineCacheText renders an engine's reported cache, "-" when its KV
// events do not drive the worker, "?" for a size not yet seen (no eviction).
func engineCacheText(k *cartv1.KVCache) string {
	if k == nil {
		return "-"
	}
	size := "?"
	if k.GetCapacityTokens() > 0 {
		size = strconv.FormatInt(k.GetCapacityTokens(), 10)
	}
	return strconv.FormatInt(k.GetOccupiedTokens(), 10) + "/" + size
}

// sourceText names where a worker came from, and says when it is draining
// (it left its discovery source). Control planes older than sources send
// none, and their workers were all static or admin-added.
func sourceText(wk *cartv1.Worker) string {
	s := wk.GetSource()
	if s == "" {
		s = "static"
	}
	if wk.GetDraining() {
		s += " (draining)"
	}
	return s
}

// workerSummary is the one-line confirmation after add and update.
func workerSummary(wk *cartv1.Worker) string {
	s := fmt.Sprintf("max_load %s, load_penalty %d, cache capacity %s tokens",
		maxLoadText(wk.GetMaxLoad()), wk.GetLoadPenalty(), capacityText(wk.GetCacheCapacityTokens()))
	if r := config.RoleStored(wk.GetRole()); r != "" {
		s += ", role " + r
	}
	return s
}

func writeClusterStatus(w io.Writer, st *cartv1.ClusterStatusResponse) error {
	tw := newTable(w)
	leader := "none (no quorum reachable from this node)"
	if st.GetLeaderId() != "" {
		url := st.GetLeaderUrl()
		if url == "" {
			url = "(API URL not published)"
		}
		leader = st.GetLeaderId() + " at " + url
	}
	fmt.Fprintf(tw, "node:\t%s\n", st.GetNodeId())
	fmt.Fprintf(tw, "state:\t%s\n", st.GetState())
	fmt.Fprintf(tw, "leader:\t%s\n", leader)
	fmt.Fprintf(tw, "term:\t%d\n", st.GetTerm())
	fmt.Fprintf(tw, "commit index:\t%d\n", st.GetCommitIndex())
	fmt.Fprintf(tw, "applied index:\t%d\n", st.GetAppliedIndex())
	fmt.Fprintf(tw, "last log index:\t%d\n", st.GetLastLogIndex())
	fmt.Fprintf(tw, "workers:\t%d healthy of %d\n", st.GetHealthyWorkers(), st.GetWorkers())
	fmt.Fprintf(tw, "index entries:\t%d (%d evicted since start)\n", st.GetIndexEntries(), st.GetIndexEvictions())
	if n := st.GetIndexSkippedInserts(); n > 0 {
		fmt.Fprintf(tw, "index skipped:\t%d new blocks not recorded: the index was full before an eviction pass made room (raise cache.max_tree_size)\n", n)
	}
	fmt.Fprintf(tw, "data planes:\t%d\n", st.GetDataplanes())
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	tw = newTable(w)
	fmt.Fprintln(tw, "ID\tRAFT ADDRESS\tAPI URL\tSUFFRAGE\tLEADER")
	for _, m := range st.GetMembers() {
		api := m.GetApiUrl()
		if api == "" {
			api = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", m.GetId(), m.GetRaftAddress(), api, m.GetSuffrage(), yesNo(m.GetLeader()))
	}
	return tw.Flush()
}
