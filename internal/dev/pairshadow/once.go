package pairshadow

import (
	"os"
	"sync"
)

// The program a process builds, once: every test of a package, and every
// broker of a dev cluster, starts its own store from one executable.
var built struct {
	once sync.Once
	dir  string
	bin  string
	err  error
}

// Program finds PAIR's store from start (see Find) and builds the program
// against it, the first time it is called in this process, into a new
// temporary directory that RemoveProgram removes. Later calls return the
// first one's result. An error wraps ErrNotFound when there is no store.
func Program(start string) (string, error) {
	built.once.Do(func() {
		mod, err := Find(start)
		if err != nil {
			built.err = err
			return
		}
		if built.dir, built.err = os.MkdirTemp("", "nvpair-pairshadow-"); built.err != nil {
			return
		}
		built.bin, built.err = Build(mod, built.dir)
	})
	return built.bin, built.err
}

// RemoveProgram removes what Program built. A TestMain, or a tool about to
// exit, calls it once every store it started has been closed.
func RemoveProgram() {
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
}
