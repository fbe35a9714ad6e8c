package main

import (
	"context"

	"github.com/spf13/cobra"

	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/gen/cart/v1/cartv1connect"
)

func (a *app) clusterCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cluster",
		Short: "Inspect and change the control plane's Raft cluster",
		Args:  cobra.ArbitraryArgs,
		RunE:  groupRunE,
	}
	cmd.AddCommand(a.clusterStatusCmd(), a.clusterJoinCmd(), a.clusterRemoveCmd(), a.clusterTransferCmd())
	return cmd
}

func (a *app) clusterStatusCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Show Raft state, leader, indexes and members",
		Long: withExitCodes(`Show the cluster as seen by the node that answers (the first reachable
--server): its Raft state, the leader, term and log indexes, worker health,
prefix-index size, connected data planes, and the members.

A node whose commit index lags the leader's is catching up; a node that
reports no leader cannot reach a quorum. With -o json the output is the
ClusterStatusResponse message.`),
		Args: checkArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.withSession(cmd, func(ctx context.Context, s *session) error {
				resp, err := adminCall(ctx, s.cp, cartv1connect.AdminServiceClient.ClusterStatus, &cartv1.ClusterStatusRequest{})
				if err != nil {
					return err
				}
				if s.output == outputJSON {
					return writeJSON(s.out, resp)
				}
				return writeClusterStatus(s.out, resp)
			})
		},
	}
}

func (a *app) clusterJoinCmd() *cobra.Command {
	var apiURL string
	cmd := &cobra.Command{
		Use:   "join NODE_ID RAFT_ADDR",
		Short: "Add a node to the cluster as a voter",
		Long: withExitCodes(`Add a node to the Raft cluster as a voter. RAFT_ADDR is the host:port the
node's Raft transport listens on.

Give --api-url (the node's control-plane API URL) so that, once the node
leads, followers and clients can find it; without it, forwarding to that
node fails until it publishes its URL itself.`),
		Example: "  cartctl cluster join n3 10.0.0.3:6702 --api-url http://10.0.0.3:6701",
		Args:    checkArgs(cobra.ExactArgs(2)),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, addr := args[0], args[1]
			return a.withSession(cmd, func(ctx context.Context, s *session) error {
				resp, err := adminCall(ctx, s.cp, cartv1connect.AdminServiceClient.AddVoter, &cartv1.AddVoterRequest{Id: id, RaftAddress: addr, ApiUrl: apiURL})
				if err != nil {
					return err
				}
				return s.report(resp, "node %s (raft %s) joined as a voter", id, addr)
			})
		},
	}
	cmd.Flags().StringVar(&apiURL, "api-url", "", "the node's control-plane API URL")
	return cmd
}

func (a *app) clusterRemoveCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "remove NODE_ID",
		Short: "Remove a node from the cluster",
		Long: withExitCodes(`Remove a node from the Raft cluster. Removing the leader makes the
remaining members elect a new one; keep a majority of voters reachable
throughout.`),
		Args: checkArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			id := args[0]
			return a.withSession(cmd, func(ctx context.Context, s *session) error {
				resp, err := adminCall(ctx, s.cp, cartv1connect.AdminServiceClient.RemoveServer, &cartv1.RemoveServerRequest{Id: id})
				if err != nil {
					return err
				}
				return s.report(resp, "node %s removed from the cluster", id)
			})
		},
	}
}

func (a *app) clusterTransferCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "transfer-leader [NODE_ID]",
		Short: "Hand leadership to another node",
		Long: withExitCodes(`Make another node the leader, e.g. before restarting the current one.
Without NODE_ID, Raft picks the most up-to-date follower.`),
		Args: checkArgs(cobra.MaximumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			var id string
			if len(args) == 1 {
				id = args[0]
			}
			return a.withSession(cmd, func(ctx context.Context, s *session) error {
				resp, err := adminCall(ctx, s.cp, cartv1connect.AdminServiceClient.TransferLeadership, &cartv1.TransferLeadershipRequest{Id: id})
				if err != nil {
					return err
				}
				return s.report(resp, "leadership transferred to %s", resp.GetLeaderId())
			})
		},
	}
}
