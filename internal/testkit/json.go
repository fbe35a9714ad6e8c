package testkit

import (
	"bytes"
	"encoding/json"
)

// SameJSON reports whether a and b are the same JSON value, whatever
// their formatting and member order.
func SameJSON(a, b string) bool {
	var x, y any
	if json.Unmarshal([]byte(a), &x) != nil || json.Unmarshal([]byte(b), &y) != nil {
		return false
	}
	xb, _ := json.Marshal(x)
	yb, _ := json.Marshal(y)
	return bytes.Equal(xb, yb)
}
