package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/spf13/cobra"

	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/gen/cart/v1/cartv1connect"
)

func (a *app) queueCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "queue",
		Short: "Show the flow-control queue: requests waiting for a worker, and the pool's saturation",
		Long: withExitCodes(`Show the leader's flow-control queue: the requests waiting for a worker
with room, in the order they would be dispatched (priority, then the
tenant that was served the fewest tokens, then deadline), how long each has
waited, the tenants' served-token counters, and the pool's saturation:
(in flight + queued) / the known slots (healthy workers' limits). Above 1
the pool is saturated and requests wait. With -o json the output is the
QueueResponse message.`),
		Args: checkArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.withSession(cmd, func(ctx context.Context, s *session) error {
				resp, err := adminCall(ctx, s.cp, cartv1connect.AdminServiceClient.Queue, &cartv1.QueueRequest{})
				if err != nil {
					return err
				}
				if s.output == outputJSON {
					return writeJSON(s.out, resp)
				}
				return writeQueue(s.out, resp)
			})
		},
	}
}

// maxQueueRows bounds the requests listed in text (the queue may hold
// thousands); the totals count them all.
const maxQueueRows = 50

func writeQueue(w io.Writer, q *cartv1.QueueResponse) error {
	if q.GetSlots() > 0 {
		fmt.Fprintf(w, "pool: %d slots, demand %.2f (in flight + queued over slots; above 1 requests wait)\n", q.GetSlots(), q.GetDemand())
	} else {
		fmt.Fprintln(w, "pool: no worker's limit known yet (max_load, max_concurrency or learned): nothing waits")
	}
	fmt.Fprintf(w, "waiting: %d requests, %d body bytes\n", len(q.GetRequests()), q.GetBytes())
	if len(q.GetRequests()) == 0 {
		return nil
	}
	tw := newTable(w)
	fmt.Fprintln(tw, "\n#\tPRIORITY\tTENANT\tWAITED\tBYTES")
	for i, r := range q.GetRequests() {
		if i == maxQueueRows {
			fmt.Fprintf(tw, "…\t%d more\t\t\t\n", len(q.GetRequests())-i)
			break
		}
		fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%d\n", i+1, r.GetPriority(), r.GetTenant(),
			(time.Duration(r.GetWaitedMicros()) * time.Microsecond).Round(time.Millisecond), r.GetBytes())
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	tenants := make([]string, 0, len(q.GetServed()))
	for t := range q.GetServed() {
		tenants = append(tenants, t)
	}
	slices.Sort(tenants)
	tw = newTable(w)
	fmt.Fprintln(tw, "\nTENANT\tTOKENS SERVED (weighted)")
	for _, t := range tenants {
		fmt.Fprintf(tw, "%s\t%.0f\n", t, q.GetServed()[t])
	}
	return tw.Flush()
}
