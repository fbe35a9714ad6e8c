package extract

import (
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
)

// chatBody builds a chat request of roughly n characters of conversation,
// with the newlines and quotes real prompts have, so JSON escapes are
// exercised as in production.
func chatBody(n int) []byte {
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	line := "The quick brown fox said \"hello\" to the lazy dog.\nThen it ran away. "
	msgs := []msg{{"system", "You are a helpful assistant. Answer concisely."}}
	for size, i := 0, 0; size < n; i++ {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		c := strings.Repeat(line, 10)
		msgs = append(msgs, msg{role, c})
		size += len(c)
	}
	body, _ := json.Marshal(map[string]any{
		"model": "meta-llama/Llama-3.1-8B-Instruct", "messages": msgs,
		"temperature": 0.7, "max_tokens": 512, "stream": true,
	})
	return body
}

// imageBody builds a chat request carrying one base64 image of n bytes.
func imageBody(n int) []byte {
	img := make([]byte, n*3/4)
	for i := range img {
		img[i] = byte(i * 7)
	}
	url := "data:image/png;base64," + base64.StdEncoding.EncodeToString(img)
	body, _ := json.Marshal(map[string]any{
		"model": "Qwen/Qwen2.5-VL-7B-Instruct",
		"messages": []any{map[string]any{"role": "user", "content": []any{
			map[string]any{"type": "text", "text": "What is in this image?"},
			map[string]any{"type": "image_url", "image_url": map[string]any{"url": url}},
		}}},
	})
	return body
}

func benchExtract(b *testing.B, e Endpoint, body []byte) {
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Extract(e, body); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkExtractChat(b *testing.B) {
	benchExtract(b, ChatCompletions, chatBody(10_000))
}

func BenchmarkExtractChatImage1MB(b *testing.B) {
	benchExtract(b, ChatCompletions, imageBody(1<<20))
}

func BenchmarkExtractMessagesImage1MB(b *testing.B) {
	body := imageBody(1 << 20)
	s := strings.Replace(string(body), `{"image_url":{"url":"data:image/png;base64,`, `{"source":{"type":"base64","media_type":"image/png","data":"`, 1)
	s = strings.Replace(s, `"type":"image_url"`, `"type":"image"`, 1)
	benchExtract(b, Messages, []byte(s))
}

func BenchmarkExtractCompletionsTokens(b *testing.B) {
	ids := make([]int, 100_000)
	for i := range ids {
		ids[i] = (i * 7919) % 128_000
	}
	body, _ := json.Marshal(map[string]any{"model": "m", "prompt": ids})
	benchExtract(b, Completions, body)
}

// BenchmarkAppendKeyChat shows the cost with a reused key buffer.
func BenchmarkAppendKeyChat(b *testing.B) {
	body := chatBody(10_000)
	buf := make([]byte, 0, len(body))
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := AppendKey(buf[:0], ChatCompletions, body); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkScanMedia is the walk every passed-through body gets while the
// remote-media policy is on (and every routed body gets inside Extract).
func BenchmarkScanMedia(b *testing.B) {
	for _, bc := range []struct {
		name string
		body []byte
	}{{"chat", chatBody(64 << 10)}, {"image1MB", imageBody(1 << 20)}} {
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(int64(len(bc.body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := ScanMedia(bc.body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkExtractResponses is BenchmarkExtractChat's conversation sent to
// the Responses API (instructions + message items).
func BenchmarkExtractResponses(b *testing.B) {
	var chat struct {
		Messages []map[string]string `json:"messages"`
	}
	_ = json.Unmarshal(chatBody(10_000), &chat)
	body, _ := json.Marshal(map[string]any{
		"model": "meta-llama/Llama-3.1-8B-Instruct", "instructions": chat.Messages[0]["content"], "input": chat.Messages[1:],
		"temperature": 0.7, "max_output_tokens": 512, "stream": true,
	})
	benchExtract(b, Responses, body)
}

// BenchmarkDecoder is extraction of the proxy-overhead bench's body (one
// 512-byte user message) and of a 10 KB conversation, with a reused key
// buffer: the walk and the decode every routed chat request pays.
func BenchmarkDecoder(b *testing.B) {
	small := []byte(`{"model":"cart-sim","max_tokens":1,"messages":[{"role":"user","content":"` + strings.Repeat("lorem ipsum ", 43) + `"}]}`)
	for _, bc := range []struct {
		name string
		body []byte
	}{{"small", small}, {"conversation", chatBody(10_000)}} {
		b.Run(bc.name, func(b *testing.B) {
			buf := make([]byte, 0, len(bc.body))
			b.SetBytes(int64(len(bc.body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := AppendKey(buf[:0], ChatCompletions, bc.body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
