//go:build unix

package readmetest

import (
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
)

// walkRepoFiles calls visit with each file under root whose extension is
// one of exts, with its path and its slash-separated path from root.
// Hidden directories are left out, and so are testdata and dist unless
// withData: the walks that check links look at what the repository
// says, the one that gathers names at everything a name may stand in.
func walkRepoFiles(root string, withData bool, exts []string, visit func(p, rel string) error) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if p != root && (strings.HasPrefix(name, ".") || !withData && (name == "testdata" || name == "dist")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !slices.Contains(exts, filepath.Ext(p)) {
			return nil
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		return visit(p, filepath.ToSlash(rel))
	})
}
