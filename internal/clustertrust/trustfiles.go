package clustertrust

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"nvpair-workload-manager/internal/pairinstall"
)

// settleWindow is how old a file's modification time must be, when the
// file is read, for its stamp to be trusted. A file system with coarse
// timestamps (2 s on FAT, 1 s on some network mounts) gives a file written
// twice within one tick the same modification time; a file read within
// this window of its last change is therefore read again on every reload
// until it has settled, as git does with racily clean index entries.
const settleWindow = 2 * time.Second

// fileStamp is what a reload remembers of a file it read, to tell without
// reading it again whether it changed: its name (the path it is kept
// under), size, modification time, type and identity (os.SameFile, so a
// file renamed over it counts as a change even with the same size and
// time).
type fileStamp struct {
	info    os.FileInfo // nil when the file could not be opened: it is read again
	settled bool        // read at least settleWindow after its last change
	absent  bool        // there was no file: it stays unchanged while there is none
}

// stampOf stamps a file opened at readAt. A file that is not regular, or
// larger than pairinstall.MaxFileBytes, is settled at once: its content is never
// read, and its type and size, which the stamp holds, decide its refusal.
func stampOf(fi os.FileInfo, readAt time.Time) fileStamp {
	if fi == nil {
		return fileStamp{}
	}
	refusedUnread := !fi.Mode().IsRegular() || fi.Size() > pairinstall.MaxFileBytes
	return fileStamp{info: fi, settled: refusedUnread || readAt.Sub(fi.ModTime()) >= settleWindow}
}

// unchangedAt reports whether path still names the file the stamp was
// taken from, unchanged since, so that what was read from it still holds.
// It costs one stat.
func (s fileStamp) unchangedAt(path string) bool {
	if s.absent {
		_, err := os.Stat(path)
		return errors.Is(err, os.ErrNotExist)
	}
	if s.info == nil || !s.settled {
		return false
	}
	fi, err := os.Stat(path)
	return err == nil && fi.Size() == s.info.Size() && fi.ModTime().Equal(s.info.ModTime()) &&
		fi.Mode() == s.info.Mode() && os.SameFile(fi, s.info)
}

// trustFiles reads the cluster directory for the trust reload and keeps
// what it read with each file's stamp, so that a reload reads only the
// files that changed: 10,000 unchanged pins cost one directory listing and
// 10,000 stats per reload, no read and no certificate parse. It is not safe
// for concurrent use: ClusterTrust.readMu serializes its callers.
type trustFiles struct {
	dir string
	// read reads one file; pairinstall.ReadRegularFile, which tests replace to stall or
	// observe the reads.
	read func(path string) ([]byte, os.FileInfo, error)
	now  func() time.Time

	crt, key  cachedFile // node.crt, node.key
	ident     identityRead
	admission cachedFile          // admission.json
	adm       admission           // what it was decoded into
	pins      map[string]*pinRead // by file name in trusted/
	pass      uint64              // the current loadPins pass, to find the files that left

	// Counters for the metrics, read without the lock.
	reads      atomic.Uint64 // files opened for reading
	notRegular atomic.Uint64 // files refused as not regular
	tooLarge   atomic.Uint64 // files refused as over pairinstall.MaxFileBytes
	reloads    atomic.Uint64 // reload passes completed
}

// cachedFile is one small file's last read: its stamp and what the read
// gave.
type cachedFile struct {
	known bool
	stamp fileStamp
	b     []byte
	err   error
}

// identityRead is the last loadIdentity result.
type identityRead struct {
	known bool
	cert  *tls.Certificate
	der   []byte
	err   error
}

// pinRead is what one pin file held when it was last read: a pin, or the
// reason it is not one.
type pinRead struct {
	stamp     fileStamp
	principal string
	der       []byte
	problem   string // empty for a valid pin
	pass      uint64 // the last loadPins pass that listed the file
}

func newTrustFiles(dir string) *trustFiles {
	return &trustFiles{dir: dir, read: pairinstall.ReadRegularFile, now: time.Now, pins: map[string]*pinRead{}}
}

// readFile reads one file through f.read and stamps it, counting the read
// and a refusal by its reason.
func (f *trustFiles) readFile(path string) ([]byte, fileStamp, error) {
	at := f.now()
	f.reads.Add(1)
	b, fi, err := f.read(path)
	switch {
	case errors.Is(err, pairinstall.ErrNotRegularFile):
		f.notRegular.Add(1)
	case errors.Is(err, pairinstall.ErrFileTooLarge):
		f.tooLarge.Add(1)
	}
	if errors.Is(err, os.ErrNotExist) {
		return nil, fileStamp{absent: true}, err
	}
	return b, stampOf(fi, at), err
}

// refresh reads path into c again unless the file is unchanged since c's
// read, and reports whether it read.
func (f *trustFiles) refresh(c *cachedFile, path string) bool {
	if c.known && c.stamp.unchangedAt(path) {
		return false
	}
	b, stamp, err := f.readFile(path)
	*c = cachedFile{known: true, stamp: stamp, b: b, err: err}
	return true
}

// loadIdentity returns the node's certificate and its leaf's DER, or nil and
// no error when node.crt is absent, or errKeyMissing when node.key alone is.
// Each file is read again only when it changed, and node.key only when
// node.crt could be read.
func (f *trustFiles) loadIdentity() (*tls.Certificate, []byte, error) {
	certFile, keyFile := filepath.Join(f.dir, "node.crt"), filepath.Join(f.dir, "node.key")
	reread := f.refresh(&f.crt, certFile)
	if f.crt.err == nil {
		reread = f.refresh(&f.key, keyFile) || reread
	}
	if f.ident.known && !reread {
		return f.ident.cert, f.ident.der, f.ident.err
	}
	cert, der, err := identityFrom(certFile, f.crt.b, f.crt.err, keyFile, f.key.b, f.key.err)
	f.ident = identityRead{known: true, cert: cert, der: der, err: err}
	return cert, der, err
}

// identityFrom decodes node.crt and node.key as read: an absent node.crt
// is no identity and no error, an absent node.key beside it is
// errKeyMissing, any other failure names the file.
func identityFrom(certFile string, crtPEM []byte, crtErr error, keyFile string, keyPEM []byte, keyErr error) (*tls.Certificate, []byte, error) {
	switch {
	case errors.Is(crtErr, os.ErrNotExist):
		return nil, nil, nil
	case crtErr != nil:
		return nil, nil, fmt.Errorf("load %s: %w", certFile, crtErr)
	case errors.Is(keyErr, os.ErrNotExist):
		return nil, nil, fmt.Errorf("load %s: %w", keyFile, errKeyMissing)
	case keyErr != nil:
		return nil, nil, fmt.Errorf("load %s: %w", keyFile, keyErr)
	}
	cert, err := tls.X509KeyPair(crtPEM, keyPEM)
	if err != nil {
		return nil, nil, fmt.Errorf("load %s: %w", certFile, err)
	}
	return &cert, cert.Leaf.Raw, nil
}

// loadAdmission returns what admission.json says, read again only when it
// changed.
func (f *trustFiles) loadAdmission() admission {
	path := filepath.Join(f.dir, admissionFileName)
	if f.refresh(&f.admission, path) {
		f.adm = admissionFrom(path, f.admission.b, f.admission.err)
	}
	return f.adm
}

// loadPins lists trusted/ and reads the pin files that appeared or changed
// since the last pass. When a file appeared, left or holds something else
// than before, it returns every valid pin (principal -> certificate DER)
// and every invalid file (name -> why) with changed true; otherwise it
// returns changed false and nil maps, and the caller keeps what it has. A
// missing directory trusts no one; any other error is returned so the
// caller keeps its previous pins.
func (f *trustFiles) loadPins() (pins map[string][]byte, invalid map[string]string, changed bool, err error) {
	dir := filepath.Join(f.dir, "trusted")
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		entries, err = nil, nil // every pin held leaves
	}
	if err != nil {
		return nil, nil, false, fmt.Errorf("read %s: %w", dir, err)
	}
	f.pass++
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".json") {
			continue // also skips the cluster manager's .tmp files
		}
		path := filepath.Join(dir, name)
		prev := f.pins[name]
		if prev != nil && prev.stamp.unchangedAt(path) {
			prev.pass = f.pass
			continue
		}
		next := f.readPin(path, strings.TrimSuffix(name, ".json"))
		next.pass = f.pass
		changed = changed || prev == nil || !prev.holdsTheSameAs(next)
		f.pins[name] = next
	}
	for name, r := range f.pins {
		if r.pass != f.pass {
			delete(f.pins, name)
			changed = true
		}
	}
	if !changed {
		return nil, nil, false, nil
	}
	// Fresh maps: the caller keeps them, and the cache changes on.
	pins, invalid = map[string][]byte{}, map[string]string{}
	for name, r := range f.pins {
		if r.problem != "" {
			invalid[name] = r.problem
		} else {
			pins[r.principal] = r.der
		}
	}
	return pins, invalid, true, nil
}

// readPin reads one pin file named name.json.
func (f *trustFiles) readPin(path, name string) *pinRead {
	b, stamp, err := f.readFile(path)
	r := &pinRead{stamp: stamp}
	if err == nil {
		r.principal, r.der, err = decodePin(name, b)
	}
	if err != nil {
		r.problem = err.Error()
	}
	return r
}

// holdsTheSameAs reports whether two reads of a pin file found the same
// pin, or the same problem.
func (r *pinRead) holdsTheSameAs(o *pinRead) bool {
	return r.principal == o.principal && bytes.Equal(r.der, o.der) && r.problem == o.problem
}

// FileStats is what the trust reloads read and refused, counted since
// the daemon started.
type FileStats struct {
	Reloads    uint64 // reload passes completed
	Reads      uint64 // files opened for reading
	NotRegular uint64 // files refused as not regular
	TooLarge   uint64 // files refused as over pairinstall.MaxFileBytes
}

// stats returns the counters; each is read atomically, without the lock.
func (f *trustFiles) stats() FileStats {
	return FileStats{Reloads: f.reloads.Load(), Reads: f.reads.Load(), NotRegular: f.notRegular.Load(), TooLarge: f.tooLarge.Load()}
}
