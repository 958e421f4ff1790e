package graphql

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
)

// The messages of the two GraphQL websocket protocols, graphql-transport-ws
// and the legacy graphql-ws: what a client's message means, whichever
// protocol it speaks, and the server's messages spelled as each protocol
// spells them, as gqlgen's transport writes them.

// wsKind is what a protocol message means, whichever protocol named it.
type wsKind int

const (
	kindInit wsKind = iota
	kindAck
	kindKeepAlive
	kindConnError
	kindTerminate
	kindStart
	kindStop
	kindData
	kindComplete
	kindError
	kindPing
	kindPong
)

// String names a kind as gqlgen's transport does in "unexpected message".
func (k wsKind) String() string {
	return [...]string{"init", "connection ack", "keep alive", "connection error", "connection close",
		"start", "stop subscription", "data", "complete", "error", "ping", "pong"}[k]
}

var (
	errInvalidMessage = errors.New("invalid message received")
	errBadClientType  = errors.New("invalid client->server message type")
)

// transportWSType and legacyWSType are the type names each protocol knows;
// an unknown one fails the decoding of the whole message.
type (
	transportWSType string
	legacyWSType    string
)

var (
	transportWSTypes = []string{"connection_init", "connection_ack", "subscribe", "next", "error", "complete", "ping", "pong"}
	legacyWSTypes    = []string{"connection_init", "connection_terminate", "start", "stop", "connection_ack",
		"connection_error", "data", "error", "complete", "ka"}
)

func (t *transportWSType) UnmarshalText(b []byte) error {
	if !slices.Contains(transportWSTypes, string(b)) {
		return fmt.Errorf("invalid message type %s", b)
	}
	*t = transportWSType(b)
	return nil
}

func (t *legacyWSType) UnmarshalText(b []byte) error {
	if !slices.Contains(legacyWSTypes, string(b)) {
		return fmt.Errorf("invalid message type %s", b)
	}
	*t = legacyWSType(b)
	return nil
}

// decodeMessage reads a client message of either protocol.
func decodeMessage(legacy bool, data []byte) (kind wsKind, id string, payload json.RawMessage, err error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if legacy {
		var m struct {
			Payload json.RawMessage `json:"payload,omitempty"`
			ID      string          `json:"id,omitempty"`
			Type    legacyWSType    `json:"type"`
		}
		if dec.Decode(&m) != nil {
			return 0, "", nil, errInvalidMessage
		}
		k, ok := map[legacyWSType]wsKind{"connection_init": kindInit, "connection_terminate": kindTerminate,
			"start": kindStart, "stop": kindStop, "connection_ack": kindAck, "connection_error": kindConnError,
			"data": kindData, "error": kindError, "complete": kindComplete, "ka": kindKeepAlive}[m.Type]
		if !ok {
			return 0, m.ID, m.Payload, errBadClientType
		}
		return k, m.ID, m.Payload, nil
	}
	var m struct {
		Payload json.RawMessage `json:"payload,omitempty"`
		ID      string          `json:"id,omitempty"`
		Type    transportWSType `json:"type"`
	}
	if dec.Decode(&m) != nil {
		return 0, "", nil, errInvalidMessage
	}
	k, ok := map[transportWSType]wsKind{"connection_init": kindInit, "subscribe": kindStart,
		"complete": kindStop, "ping": kindPing, "pong": kindPong}[m.Type]
	if !ok {
		return 0, m.ID, m.Payload, errBadClientType
	}
	return k, m.ID, m.Payload, nil
}

// outMessage is a server message as both protocols spell it.
type outMessage struct {
	Payload json.RawMessage `json:"payload,omitempty"`
	ID      string          `json:"id,omitempty"`
	Type    string          `json:"type"`
}

// typeName is the protocol's name for a server message of kind k, or ""
// when the protocol has no such message (it is not sent).
func typeName(legacy bool, k wsKind) string {
	if legacy {
		switch k {
		case kindAck:
			return "connection_ack"
		case kindKeepAlive:
			return "ka"
		case kindConnError:
			return "connection_error"
		case kindData:
			return "data"
		case kindComplete:
			return "complete"
		case kindError:
			return "error"
		}
		return ""
	}
	switch k {
	case kindAck:
		return "connection_ack"
	case kindData:
		return "next"
	case kindComplete:
		return "complete"
	case kindError:
		return "error"
	case kindPing:
		return "ping"
	case kindPong:
		return "pong"
	}
	return ""
}

// dataMessageLen and appendDataMessage write a data message ("next", or
// "data" in the legacy protocol) as encoding/json writes outMessage: the
// payload is json.Marshal's output (compact and escaped already) and id
// is already JSON, so neither is passed over again, once per subscriber
// of every update.
func dataMessageLen(payload, id []byte, typ string) int {
	n := len(`{"payload":`) + len(payload) + len(`,"type":"`) + len(typ) + len(`"}`)
	if len(id) > 2 {
		n += len(`,"id":`) + len(id)
	}
	return n
}

func appendDataMessage(b, payload, id []byte, typ string) []byte {
	b = append(b, `{"payload":`...)
	b = append(b, payload...)
	if len(id) > 2 {
		b = append(b, `,"id":`...)
		b = append(b, id...)
	}
	b = append(b, `,"type":"`...)
	b = append(b, typ...)
	return append(b, `"}`...)
}
