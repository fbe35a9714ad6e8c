package extract

import (
	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
)

// Every body is decoded by github.com/go-json-experiment/json, the module
// form of Go's encoding/json/v2, after the walk in scan.go has refused
// repeated and case-variant keys and checked the media fields. Like the
// engines' Python parsers (json.loads, then pydantic) it matches member
// names exactly. Two of its checks are off, each for a reason:
//
//   - Repeated names are left to the walk: it refuses them where the
//     engines read (with the path in the error), and tolerates them where
//     they read nothing (tool arguments, schemas, metadata), as Python
//     does.
//   - Invalid UTF-8 is decoded as U+FFFD: json.loads takes a lone
//     surrogate escape ("\ud800"), which the decoder counts as invalid
//     UTF-8 too, and refuses raw invalid bytes, which the engine then
//     answers itself.
//
// Fields that hold more than one JSON type, or whose text goes into the
// key as sent, are jsontext.Values: the bytes as the client sent them.
var decodeOpts = json.JoinOptions(jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true))

func unmarshal(data []byte, v any) error { return json.Unmarshal(data, v, decodeOpts) }

// compactOpts format a JSON value without its insignificant whitespace and
// nothing else changed, as encoding/json's Compact did.
var compactOpts = json.JoinOptions(decodeOpts, jsontext.PreserveRawStrings(true))

// appendCompact appends raw compacted, or reports an error with dst
// unchanged.
func appendCompact(dst, raw []byte) ([]byte, error) {
	out, err := jsontext.AppendFormat(dst, raw, compactOpts)
	if err != nil {
		return dst, err
	}
	return out, nil
}

// rawJSON is a JSON value as the client sent it: the decoder validates
// it and leaves it in place, so that a megabyte of base64 or of token ids
// is not copied out of the body (jsontext.Value copies).
type rawJSON []byte

// UnmarshalJSONFrom keeps the value's bytes in the buffer the decoder
// reads, which for json.Unmarshal is the caller's input itself
// (TestRawJSONPointsIntoTheBody checks it, since a decoder reading into a
// pooled buffer of its own would leave these bytes to be overwritten).
func (r *rawJSON) UnmarshalJSONFrom(dec *jsontext.Decoder) error {
	v, err := dec.ReadValue()
	if err != nil {
		return err
	}
	*r = rawJSON(v)
	return nil
}

// MarshalJSONTo writes the value as it came (an absent one as null).
func (r rawJSON) MarshalJSONTo(enc *jsontext.Encoder) error {
	if len(r) == 0 {
		return enc.WriteToken(jsontext.Null)
	}
	return enc.WriteValue(jsontext.Value(r))
}
