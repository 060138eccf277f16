//go:build !unix

package statejournal

import "testing"

// platformPlants is empty outside Unix: Windows named pipes live in their
// own namespace, not in a directory.
var platformPlants []struct {
	name  string
	plant func(t *testing.T, path, target string)
}
