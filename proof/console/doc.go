// Package console proves the operator console (package console of the library) as a person uses it: its tests
// drive a real headless Chromium (Debian's chromium package; .ci/run installs it when absent) through the pages of
// a console mounted over a running shop (event-sourced orders staged into the outbox, a relay to an in-process
// broker, an inbox consumer, a projection), and its benchmark measures each page's data load on a large
// installation.
//
//	go test ./proof/console                                   # the browser tests
//	go test ./proof/console -update-screenshots               # and rewrite console/screenshots/*.png
//	go test ./proof/console -run '^$' -bench Pages -benchtime 1x  # the large-installation benchmark
//
// The browser tests fail, never skip, when no Chromium can be found (set CHROMIUM to use another binary).
package console
