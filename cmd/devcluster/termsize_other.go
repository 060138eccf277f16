//go:build !(linux || darwin)

package main

import "os"

// terminalWidth returns $COLUMNS when it is set, else 0 (unknown).
func terminalWidth(*os.File) int { return columnsEnv() }
