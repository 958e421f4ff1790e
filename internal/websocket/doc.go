// Package websocket is the server side of the websocket protocol (RFC
// 6455), as much of it as Dropline's streams use, and nothing of GraphQL:
// the upgrade (CheckHandshake, Upgrade), a client's frames read one
// message at a time under a size limit (Reader), server frames built in
// memory (AppendHeader, TextFrame, CloseFrame) so that a fan-out hands
// many connections the same bytes, and writes to a socket that never wait
// (SocketWriter), which SSE streams use as well.
//
// No extension is ever negotiated (no compression), so every reserved
// bit is an error. A client's frame must be masked; a control frame must
// be final and carry at most 125 bytes; a close frame's code must be one
// a peer may send and its reason UTF-8. Each violation is a
// *ProtocolError carrying the close code to answer it with, and a message
// over the limit a *TooBigError (1009), decided from the frame's declared
// length before anything is allocated for it. What Reader accepts and
// refuses is checked against github.com/coder/websocket as the peer
// (TestDifferential*), and FuzzReader runs it over arbitrary bytes from
// a seed corpus of the protocol's edge cases (testdata/fuzz/FuzzReader).
//
// Where the two peers differ, Dropline follows the RFC: a client's
// unmasked frame, a negative 64-bit length and a close reason that is not
// UTF-8 are answered with a close frame (1002, 1002 and 1007) where
// coder/websocket drops the connection or accepts the reason. Like
// coder/websocket, Reader accepts a length written in more bytes than it
// needs and does not check that a text message is UTF-8 (the GraphQL
// layer refuses what does not decode).
package websocket
