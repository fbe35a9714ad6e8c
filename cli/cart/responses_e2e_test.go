package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	openaiopt "github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
)

// TestOpenAISDKResponsesThroughCART drives the Responses API with the
// official SDK through the all-in-one router in front of three cart-sim
// replicas, which keep the responses they made and 404 any other id: a
// previous_response_id chain, streamed and not, each turn's input a prompt
// the prefix index has placed on another replica, must stay on the replica
// holding the chain.
func TestOpenAISDKResponsesThroughCART(t *testing.T) {
	base, _ := startAllInOne(t, 3, nil)
	client := openai.NewClient(openaiopt.WithBaseURL(base+"/v1/"), openaiopt.WithAPIKey("sk-test"), openaiopt.WithMaxRetries(0))
	ctx := context.Background()
	instructions := strings.Repeat("You are the CART Responses test assistant. ", 30)

	var raw *http.Response
	first, err := client.Responses.New(ctx, responses.ResponseNewParams{
		Model:        "sim",
		Instructions: openai.String(instructions),
		Input:        responses.ResponseNewParamsInputUnion{OfString: openai.String("What is a prefix cache?")},
	}, openaiopt.WithResponseInto(&raw))
	if err != nil {
		t.Fatal(err)
	}
	owner := raw.Header.Get("X-Routed-Peer")
	if first.OutputText() == "" || owner == "" {
		t.Fatalf("first response %+v from %q", first, owner)
	}

	// decoy returns a prompt that a fresh request sent to another replica.
	decoy := func(turn int) string {
		for i := range 20 {
			p := strings.Repeat(fmt.Sprintf("decoy %d.%d is a long unrelated prompt. ", turn, i), 40)
			var raw *http.Response
			if _, err := client.Responses.New(ctx, responses.ResponseNewParams{
				Model: "sim", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(p)},
			}, openaiopt.WithResponseInto(&raw)); err != nil {
				t.Fatal(err)
			}
			if raw.Header.Get("X-Routed-Peer") != owner {
				return p
			}
		}
		t.Fatal("every decoy landed on the chain's replica")
		return ""
	}

	prev := first.ID
	for turn := range 4 {
		params := responses.ResponseNewParams{
			Model:              "sim",
			Instructions:       openai.String(instructions),
			PreviousResponseID: openai.String(prev),
			Input: responses.ResponseNewParamsInputUnion{OfInputItemList: responses.ResponseInputParam{
				responses.ResponseInputItemParamOfMessage(decoy(turn), responses.EasyInputMessageRoleUser),
			}},
		}
		var raw *http.Response
		if turn%2 == 0 {
			r, err := client.Responses.New(ctx, params, openaiopt.WithResponseInto(&raw))
			if err != nil {
				t.Fatalf("turn %d: %v", turn, err)
			}
			prev = r.ID
		} else {
			stream := client.Responses.NewStreaming(ctx, params, openaiopt.WithResponseInto(&raw))
			var text strings.Builder
			var completed responses.Response
			for stream.Next() {
				switch ev := stream.Current(); ev.Type {
				case "response.output_text.delta":
					text.WriteString(ev.Delta)
				case "response.completed":
					completed = ev.Response
				}
			}
			if err := stream.Err(); err != nil {
				t.Fatalf("turn %d (streamed): %v", turn, err)
			}
			_ = stream.Close()
			if completed.ID == "" || completed.OutputText() != text.String() {
				t.Fatalf("turn %d: streamed %q, completed %+v", turn, text.String(), completed)
			}
			prev = completed.ID
		}
		if got := raw.Header.Get("X-Routed-Peer"); got != owner {
			t.Fatalf("turn %d went to %s, want %s", turn, got, owner)
		}
	}

	// The stored response is readable through CART, from its replica.
	got, err := client.Responses.Get(ctx, prev, responses.ResponseGetParams{}, openaiopt.WithResponseInto(&raw))
	if err != nil || got.ID != prev || raw.Header.Get("X-Routed-Peer") != owner {
		t.Fatalf("Get: %v %+v from %s", err, got, raw.Header.Get("X-Routed-Peer"))
	}
}
