package graphql

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// protocolMessage has the shape of gqlgen's websocket messages (both
// protocols): three exported fields in this order and an unexported one.
type protocolMessage struct {
	Payload json.RawMessage `json:"payload,omitempty"`
	ID      string          `json:"id,omitempty"`
	Type    messageKind     `json:"type"`
	noOp    bool
}

type messageKind string

// TestDataMessagesEncodeLikeJSONMarshal: the fast encoding of data messages
// writes exactly what encoding/json writes, ids that need escaping
// included, and leaves every other message to encoding/json.
func TestDataMessagesEncodeLikeJSONMarshal(t *testing.T) {
	t.Parallel()
	payload, err := json.Marshal(map[string]any{"data": map[string]any{"stockChanged": map[string]any{
		"sku": "A<b>&c", "available": 3, "note": "\u2028 \"quoted\""}}})
	require.NoError(t, err)
	for _, m := range []protocolMessage{
		{Payload: payload, ID: "1", Type: "next"},
		{Payload: payload, ID: `we"ird<id>&\u2028`, Type: "next"},
		{Payload: payload, ID: "7", Type: "data"},
		{Payload: payload, Type: "next"},
	} {
		want, err := json.Marshal(&m)
		require.NoError(t, err)
		got, ok := encodeDataMessage(&m)
		require.True(t, ok, "%+v", m)
		require.Equal(t, string(want), string(got))
	}
	for _, m := range []any{
		&protocolMessage{Payload: json.RawMessage(`{ "spaced" : 1 }`), Type: "pong"},
		&protocolMessage{ID: "1", Type: "complete"},
		&protocolMessage{Payload: payload, ID: "1", Type: "error"},
		&struct{ A, B, C string }{"a", "b", "next"},
		protocolMessage{Payload: payload, Type: "next"},
	} {
		_, ok := encodeDataMessage(m)
		require.False(t, ok, "%+v goes to encoding/json", m)
	}
	_ = protocolMessage{}.noOp
}

// MarshalText is what gqlgen's message types have: the name itself.
func (k messageKind) MarshalText() ([]byte, error) { return []byte(string(k)), nil }
