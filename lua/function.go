package lua

import (
	"crypto/sha1" //nolint:gosec // a name for a text, as Redis names scripts; not a secret
	"encoding/hex"
	"strings"
)

// Functions lists the scripts the engine runs as Redis functions (FCALL)
// rather than by SHA (EVALSHA): those run so often that what a script
// does before its body on every call costs Redis more than is worth it.
var Functions = []string{Reserve}

// Function returns a script as a Redis function library (FUNCTION LOAD): its
// code and the one function it registers, which runs the script's body with
// the script's KEYS and ARGV.
//
// Redis runs a script's whole text on every EVALSHA, so the library's
// definitions (the policy's tables, lib.lua's functions: see shake) are made
// anew and collected on every call; a library's top level runs once, when it
// is loaded, and its function's calls share what it made. So the library's
// definitions must not change after they are made: the body's own state
// (everything reserve.lua declares) is still made on every call, inside the
// function.
//
// The function's name, which is also the library's, ends with the first 16
// hexadecimal digits of the SHA-1 of the script's text: builds with
// different scripts load libraries of different names side by side, so
// instances of two releases can share one Redis during a rolling upgrade,
// each calling its own.
func Function(name string) (code, function string, err error) {
	body, err := files.ReadFile(name + ".lua")
	if err != nil {
		return "", "", err
	}
	lib, err := withLibrary(string(body))
	if err != nil {
		return "", "", err
	}
	defs := strings.TrimSuffix(lib, string(body))
	sum := sha1.Sum([]byte(lib)) //nolint:gosec // see the import
	function = "dropline_" + name + "_" + hex.EncodeToString(sum[:8])
	var b strings.Builder
	b.WriteString("#!lua name=" + function + "\n")
	b.WriteString(defs)
	b.WriteString("redis.register_function('" + function + "', function(KEYS, ARGV)\n")
	b.Write(body)
	b.WriteString("\nend)\n")
	return b.String(), function, nil
}
