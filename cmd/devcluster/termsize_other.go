//go:build !(linux || darwin)

package main

import "os"

// terminalSize returns $COLUMNS and $LINES when they are set, else 0
// (unknown).
func terminalSize(*os.File) (cols, rows int) { return columnsEnv(), linesEnv() }
