package server

import (
	"encoding/json"
	"errors"
	"mime"
	"net/http"
	"net/url"
)

// DevTokenPath is where a server in dev mode mints buyer tokens for the demo
// shop's "sign in as NAME" box.
const DevTokenPath = "/dev/token"

// maxDevTokenBody bounds the request body: {"user": "…"} with a principal id
// of at most 128 bytes fits many times over.
const maxDevTokenBody = 1 << 10

// DevTokenFunc mints a buyer (never admin) token for user, or returns an
// error saying why user is not acceptable.
type DevTokenFunc func(user string) (string, error)

// devTokenRequest is the body of POST /dev/token. Unknown fields are
// refused, so {"user": "x", "admin": true} is an error, not a buyer token.
type devTokenRequest struct {
	User string `json:"user"`
}

// devTokenInfo is what GET /dev/token answers in dev mode.
type devTokenInfo struct {
	DevSignIn bool   `json:"devSignIn"`
	Usage     string `json:"usage"`
}

const devSignInUsage = `POST {"user": NAME} for a buyer token`

// devTokenHandler serves POST /dev/token {"user": NAME} -> {"token": …}.
//
// It is mounted only in dev mode, where anyone who reaches the (loopback)
// port could mint tokens with `dropline token` anyway, and where the
// server refuses a Host that is not loopback (Config.LoopbackHostOnly), so
// a page cannot reach it by rebinding its own name; still, it only mints
// buyer tokens, and refuses requests a browser would send from another
// site: those carry an Origin that is not this host, and a cross-site
// fetch with Content-Type: application/json needs a CORS preflight that is
// never granted here. GET answers {"devSignIn": true}, which is how the
// shop tells that dev sign-in exists (elsewhere the path is 404).
func devTokenHandler(mint DevTokenFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodPost:
		case http.MethodGet, http.MethodHead:
			writeJSON(w, r, http.StatusOK, devTokenInfo{DevSignIn: true, Usage: devSignInUsage})
			return
		default:
			w.Header().Set("Allow", "GET, HEAD, POST")
			writeJSON(w, r, http.StatusMethodNotAllowed, errorBody{Error: devSignInUsage})
			return
		}
		if o := r.Header.Get("Origin"); o != "" {
			if u, err := url.Parse(o); err != nil || u.Host != r.Host {
				writeJSON(w, r, http.StatusForbidden, errorBody{Error: "cross-origin requests may not mint tokens"})
				return
			}
		}
		if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
			writeJSON(w, r, http.StatusUnsupportedMediaType, errorBody{Error: "Content-Type must be application/json"})
			return
		}
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxDevTokenBody))
		dec.DisallowUnknownFields()
		var req devTokenRequest
		if err := dec.Decode(&req); err != nil {
			var tooBig *http.MaxBytesError
			if errors.As(err, &tooBig) {
				writeJSON(w, r, http.StatusRequestEntityTooLarge, errorBody{Error: "request body too large"})
				return
			}
			writeJSON(w, r, http.StatusBadRequest, errorBody{Error: "body must be {\"user\": NAME}: " + err.Error()})
			return
		}
		if req.User == "" {
			writeJSON(w, r, http.StatusBadRequest, errorBody{Error: "user is required"})
			return
		}
		tok, err := mint(req.User)
		if err != nil {
			writeJSON(w, r, http.StatusBadRequest, errorBody{Error: err.Error()})
			return
		}
		writeJSON(w, r, http.StatusOK, map[string]string{"token": tok})
	})
}
