package clustertrust

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// waitTimeout bounds every wait in these tests: a read that should return
// at once is given this long before the test calls it blocked.
const waitTimeout = 10 * time.Second

// writeFile writes content to path, making its directory first.
func writeFile(t testing.TB, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}
