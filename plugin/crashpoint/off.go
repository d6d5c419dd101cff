//go:build !crashpoints

// Package crashpoint is the hook that test builds (-tags crashpoints) call at
// each step boundary of the plugin's verbs and the node agent's allocator:
// it kills the process there, as a power loss would. Release builds have
// none.
package crashpoint

// Hook is nil in a release build: no step kills anything.
func Hook() func(string) { return nil }
