//go:build unix

package readmetest

import (
	"go/scanner"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// repoNames is what the repository's code defines and names, read in one
// walk: the docs and the comments that cite a test or an identifier are
// checked against it.
type repoNames struct {
	goTests map[string]bool // Test, Benchmark and Fuzz functions of _test.go files
	pyTests map[string]bool // test_ functions of Python files
	// words are the names the code and the data use: every identifier of
	// a Go file (its comments left out), every quoted word of a Go string
	// ("workloadId", a struct tag's json:"runId"; never a message's
	// prose), and every word of the other text files (the OpenAPI
	// document, the Python client, the scripts).
	words map[string]bool
	// comments are the Go files' comments, each with its file and line.
	comments []goComment
}

// goComment is one comment of a Go file.
type goComment struct {
	file string // from the module root
	line int
	text string
}

var (
	goTestFunc = regexp.MustCompile(`(?m)^func ((?:Test|Benchmark|Fuzz)[A-Za-z0-9_]*)\(`)
	pyTestFunc = regexp.MustCompile(`(?m)^\s*def (test_[a-z0-9_]+)\(`)
	anyWord    = regexp.MustCompile(`[A-Za-z_][A-Za-z0-9_]*`)
	quotedWord = regexp.MustCompile(`"([A-Za-z_][A-Za-z0-9_]*)[",]`)
)

// readRepoNames walks the repository (hidden directories left out) once.
func readRepoNames(t *testing.T) repoNames {
	t.Helper()
	root := moduleRoot(t)
	n := repoNames{goTests: map[string]bool{}, pyTests: map[string]bool{}, words: map[string]bool{}}
	err := walkRepoFiles(root, true, []string{".go", ".py", ".json", ".yml", ".yaml", ".sh", ".ps1", ".toml", ".txt", ".service", ".rules"}, func(p, rel string) error {
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		switch {
		case strings.HasSuffix(p, ".go"):
			if strings.HasSuffix(p, "_test.go") {
				for _, m := range goTestFunc.FindAllSubmatch(b, -1) {
					n.goTests[string(m[1])] = true
				}
			}
			n.readGo(rel, b)
		case strings.HasSuffix(p, ".py"):
			for _, m := range pyTestFunc.FindAllSubmatch(b, -1) {
				n.pyTests[string(m[1])] = true
			}
			fallthrough
		default:
			for _, w := range anyWord.FindAll(b, -1) {
				n.words[string(w)] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(n.goTests) == 0 || len(n.words) == 0 || len(n.comments) == 0 {
		t.Fatalf("the walk of %s found %d Go tests, %d words and %d comments", root, len(n.goTests), len(n.words), len(n.comments))
	}
	return n
}

// readGo takes a Go file's identifiers, quoted words and comments.
func (n *repoNames) readGo(rel string, src []byte) {
	fset := token.NewFileSet()
	file := fset.AddFile(rel, -1, len(src))
	var s scanner.Scanner
	s.Init(file, src, nil, scanner.ScanComments)
	for {
		pos, tok, lit := s.Scan()
		switch tok {
		case token.EOF:
			return
		case token.IDENT:
			n.words[lit] = true
		case token.STRING:
			v, err := strconv.Unquote(lit)
			if err != nil {
				continue
			}
			if anyWord.FindString(v) == v {
				n.words[v] = true
			}
			for _, m := range quotedWord.FindAllStringSubmatch(v, -1) {
				n.words[m[1]] = true
			}
		case token.COMMENT:
			n.comments = append(n.comments, goComment{rel, fset.Position(pos).Line, lit})
		}
	}
}

var (
	docTestName = regexp.MustCompile("`((?:Test|Benchmark|Fuzz)[A-Z][A-Za-z0-9_]*)(\\.\\.\\.)?`")
	docPyTest   = regexp.MustCompile("`(test_[a-z0-9_]+)`")
)

// TestEveryTestTheDocsNameExists: the docs cite tests by name (the spec,
// the decision records' "Held by", the guides), so that a test can move
// between files and packages; every Go test, benchmark or fuzz target they
// name in code quotes exists somewhere in the repository, and so does
// every Python test. A name followed by "..." names a family and is not
// checked.
func TestEveryTestTheDocsNameExists(t *testing.T) {
	root := moduleRoot(t)
	names := readRepoNames(t)
	named := 0
	for _, file := range markdownFiles(t) {
		b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(file)))
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range proseLines(string(b)) {
			for _, m := range docTestName.FindAllStringSubmatch(l.text, -1) {
				if m[2] != "" {
					continue
				}
				named++
				if !names.goTests[m[1]] {
					t.Errorf("%s:%d names %s, which no _test.go file of the repository defines", file, l.n, m[1])
				}
			}
			for _, m := range docPyTest.FindAllStringSubmatch(l.text, -1) {
				named++
				if !names.pyTests[m[1]] {
					t.Errorf("%s:%d names %s, which no Python file of the repository defines", file, l.n, m[1])
				}
			}
		}
	}
	if named == 0 {
		t.Fatal("the docs name no test")
	}
}

// foreignNames are names the comments and docs cite that belong to
// another system, not to this repository, each with whose it is.
var foreignNames = map[string]string{
	"FlushFileBuffers": "the Windows API", "MoveFileEx": "the Windows API", "TerminateProcess": "the Windows API",
	"LocalAppData": "a Windows known folder", "ClientHello": "TLS", "mTLS": "TLS",
	"ResponseController": "net/http", "parseOne": "the flag package's FlagSet",
	"MaxArraySize": "Slurm's configuration", "MaxJobCount": "Slurm's configuration", "MinJobAge": "Slurm's configuration",
	"MessageTimeout": "Slurm's configuration", "KillWait": "Slurm's configuration",
	"noderec": "PAIR's code", "DirectoryNode": "PAIR's code", "removeParams": "PAIR's code",
	"waitForStdinClose": "PAIR's broker", "workloadTerminalReplayWindowMs": "PAIR's broker",
	"stateReplayMethod": "PAIR's broker", "convergeScannerIdentity": "PAIR's broker",
	"activeMu": "the design card's name for the state table's lock, statetable.Table.mu",
	"GitHub":   "a proper name", "GiB": "a unit", "TiB": "a unit", "camelCase": "a word",
	"eE": "JSON's grammar", "uXXXX": "JSON's grammar",
}

var (
	// codeName is a code span that is a name: an identifier, or names
	// joined by dots (a package's, a type's member), a leading * or & and a
	// trailing () allowed.
	codeName = regexp.MustCompile("`[*&]?([A-Za-z_][A-Za-z0-9_]*(?:\\.[A-Za-z_][A-Za-z0-9_]*)*)(?:\\(\\))?`")
	// commentName is a word of a comment that may be a name.
	commentName = regexp.MustCompile(`(?:^|[^\w./-])([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)`)
	camelHump   = regexp.MustCompile(`[a-z0-9][A-Z]`)
	fileName    = regexp.MustCompile(`\.(md|go|json|ya?ml|sh|ps1|py|txt|toml|mod|sum)$`)
)

// looksLikeAGoName reports whether a word is one a reader takes for a name
// of the code rather than English: a camelCase word (ingestLocal,
// ingestLocalLeased), or a Type.member. An English word, a constant in
// capitals or a file name is not.
func looksLikeAGoName(w string) bool {
	if fileName.MatchString(w) {
		return false
	}
	parts := strings.Split(w, ".")
	if len(parts) > 1 && parts[0][0] >= 'A' && parts[0][0] <= 'Z' && parts[len(parts)-1] != "" {
		return true
	}
	for _, p := range parts {
		if camelHump.MatchString(p) {
			return true
		}
	}
	return false
}

// missingParts returns the parts of a dotted name that the repository
// neither defines nor uses, nor another system owns; a benchmark's name
// without its prefix (go test -bench IngressEndToEnd) is one it defines.
func (n repoNames) missingParts(name string) []string {
	var out []string
	for _, p := range strings.Split(name, ".") {
		if p != "" && !n.words[p] && !n.goTests["Benchmark"+p] && foreignNames[p] == "" {
			out = append(out, p)
		}
	}
	return out
}

// nameDocs are the documents whose code spans name the code: the spec, the
// README and the guides under docs/ (the decision records tell what was
// decided then, in the names of then).
func nameDocs(t *testing.T) []string {
	docs := []string{"README.md", "spec.md"}
	for _, f := range docFiles(t) {
		if strings.HasPrefix(f, "docs/") && !strings.HasPrefix(f, "docs/decisions/") {
			docs = append(docs, f)
		}
	}
	return docs
}

// TestEveryNameTheDocsCiteExists: a name of the code that the spec, the
// README or a guide gives in a code span (`ingestLocal`,
// `statetable.Table`) is one the repository defines or uses, so a rename
// or a deletion that leaves the prose behind fails here, not in a reader's
// search.
func TestEveryNameTheDocsCiteExists(t *testing.T) {
	root := moduleRoot(t)
	names := readRepoNames(t)
	cited := 0
	for _, file := range nameDocs(t) {
		b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(file)))
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range proseLines(string(b)) {
			for _, m := range codeName.FindAllStringSubmatch(l.text, -1) {
				if !looksLikeAGoName(m[1]) {
					continue
				}
				cited++
				if miss := names.missingParts(m[1]); len(miss) > 0 {
					t.Errorf("%s:%d cites `%s`, but nothing of the repository is named %s", file, l.n, m[1], strings.Join(miss, ", "))
				}
			}
		}
	}
	if cited == 0 {
		t.Fatal("the docs cite no name of the code")
	}
}

// TestEveryNameACommentCitesExists: a name a Go comment cites (a camelCase
// word, a Type.member) is one the repository defines or uses: a comment
// that explains the code by a name that is gone explains nothing.
func TestEveryNameACommentCitesExists(t *testing.T) {
	names := readRepoNames(t)
	cited := 0
	for _, c := range names.comments {
		for i, line := range strings.Split(c.text, "\n") {
			for _, m := range commentName.FindAllStringSubmatch(line, -1) {
				w := strings.TrimRight(m[1], ".")
				if !looksLikeAGoName(w) {
					continue
				}
				cited++
				if miss := names.missingParts(w); len(miss) > 0 {
					t.Errorf("%s:%d: a comment cites %s, but nothing of the repository is named %s", c.file, c.line+i, w, strings.Join(miss, ", "))
				}
			}
		}
	}
	if cited == 0 {
		t.Fatal("no comment cites a name")
	}
}
