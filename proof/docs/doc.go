// Package docs holds the checks that keep the repository's documents true to its code: every Go snippet in every
// README compiles against the current API, every configuration table lists each field of its struct with the
// default the code applies, and the list of metrics names every instrument the library creates. It has tests only.
//
//	go test ./proof/docs
package docs
