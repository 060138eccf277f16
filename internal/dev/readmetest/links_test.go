//go:build unix

package readmetest

import (
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// markdownFiles are the repository's Markdown files, from the module root,
// the nested modules' included; hidden directories and testdata are not.
func markdownFiles(t *testing.T) []string {
	t.Helper()
	root := moduleRoot(t)
	var out []string
	err := walkRepoFiles(root, false, []string{".md"}, func(_, rel string) error {
		out = append(out, rel)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(out)
	return out
}

var (
	inlineLink   = regexp.MustCompile(`!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^()\s<>]*)>?(?:\s+"[^"]*")?\s*\)`)
	refLink      = regexp.MustCompile(`^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+"[^"]*")?\s*$`)
	codeSpan     = regexp.MustCompile("`+[^`]*`+")
	htmlAnchor   = regexp.MustCompile(`<a\s+(?:name|id)="([^"]+)"`)
	headingLink  = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)
	specOrReadme = regexp.MustCompile(`\b(spec|README)\.md#([A-Za-z0-9_-]+)`)
)

// mdLine is one line of a Markdown file outside its fenced blocks.
type mdLine struct {
	n    int
	text string
}

// proseLines returns the lines of a Markdown text that are not inside a
// fenced block.
func proseLines(text string) []mdLine {
	var out []mdLine
	fence := ""
	for i, l := range strings.Split(text, "\n") {
		trimmed := strings.TrimSpace(l)
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
			continue
		}
		if strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
			fence = trimmed[:3]
			continue
		}
		out = append(out, mdLine{i + 1, l})
	}
	return out
}

// githubAnchor is the anchor GitHub gives a heading's text: markup and
// punctuation dropped, letters lowered, spaces turned to hyphens (letters,
// digits, marks, hyphens and underscores kept).
func githubAnchor(heading string) string {
	heading = headingLink.ReplaceAllString(heading, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors returns the anchors of a Markdown text: one per ATX heading (a
// repeated one numbered -1, -2, ... as GitHub numbers it) and every
// <a name> or <a id>.
func anchors(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, l := range proseLines(text) {
		for _, m := range htmlAnchor.FindAllStringSubmatch(l.text, -1) {
			out[m[1]] = true
		}
		trimmed := strings.TrimLeft(l.text, " ")
		if len(l.text)-len(trimmed) > 3 {
			continue
		}
		level := len(trimmed) - len(strings.TrimLeft(trimmed, "#"))
		if level == 0 || level > 6 || (len(trimmed) > level && trimmed[level] != ' ') {
			continue
		}
		h := strings.TrimSpace(trimmed[level:])
		h = strings.TrimSpace(strings.TrimRight(h, "#"))
		a := githubAnchor(h)
		if n := seen[a]; n > 0 {
			out[a+"-"+strconv.Itoa(n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}

func TestGitHubAnchor(t *testing.T) {
	for heading, want := range map[string]string{
		"3.5.1 Producer leases":                            "351-producer-leases",
		"Try it: a cluster and a job in two commands":      "try-it-a-cluster-and-a-job-in-two-commands",
		"The ingress's OpenAPI document":                   "the-ingresss-openapi-document",
		"Local interface (broker <-> daemon)":              "local-interface-broker---daemon",
		"0021. Refusing web pages on the `loopback` ports": "0021-refusing-web-pages-on-the-loopback-ports",
		"See [the spec](spec.md), section_2":               "see-the-spec-section_2",
	} {
		if got := githubAnchor(heading); got != want {
			t.Errorf("githubAnchor(%q) = %q, want %q", heading, got, want)
		}
	}
	a := anchors("# A\n\n```\n# Not a heading\n```\n## A\n<a id=\"x\"></a>\n")
	for _, want := range []string{"a", "a-1", "x"} {
		if !a[want] {
			t.Errorf("anchors lack %q: %v", want, a)
		}
	}
	if a["not-a-heading"] {
		t.Error("a line in a fenced block was taken for a heading")
	}
}

// TestEveryRelativeLinkResolves: every relative link of the repository's
// Markdown files (the README, spec.md, docs/ and the rest) points at a file
// or directory that exists and, with an #anchor into a Markdown file, at a
// heading of it, by GitHub's anchor rule; and every anchor into spec.md or
// README.md that the repository's other text files name (code comments,
// the OpenAPI document, the rules file) is a heading too.
func TestEveryRelativeLinkResolves(t *testing.T) {
	root := moduleRoot(t)
	texts := map[string]string{}
	read := func(name string) (string, bool) {
		if s, ok := texts[name]; ok {
			return s, true
		}
		b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(name)))
		if err != nil {
			return "", false
		}
		texts[name] = string(b)
		return string(b), true
	}
	checked := 0
	for _, file := range markdownFiles(t) {
		text, _ := read(file)
		for _, l := range proseLines(text) {
			var targets []string
			line := codeSpan.ReplaceAllString(l.text, "")
			for _, m := range inlineLink.FindAllStringSubmatch(line, -1) {
				targets = append(targets, m[1])
			}
			if m := refLink.FindStringSubmatch(line); m != nil {
				targets = append(targets, m[1])
			}
			for _, target := range targets {
				if target == "" || strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				checked++
				ref, anchor, _ := strings.Cut(target, "#")
				dest := file
				if ref != "" {
					dest = path.Clean(path.Join(path.Dir(file), ref))
				}
				info, err := os.Stat(filepath.Join(root, filepath.FromSlash(dest)))
				if err != nil {
					t.Errorf("%s:%d: the link %q points at %s, which does not exist", file, l.n, target, dest)
					continue
				}
				if anchor == "" || info.IsDir() || !strings.HasSuffix(dest, ".md") {
					continue
				}
				destText, _ := read(dest)
				if !anchors(destText)[anchor] {
					t.Errorf("%s:%d: the link %q names #%s, which is no heading of %s", file, l.n, target, anchor, dest)
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("no relative link found")
	}
	// Anchors into the spec and the README named in code and data files.
	err := walkRepoFiles(root, false, []string{".go", ".py", ".json", ".yml", ".yaml", ".sh", ".ps1", ".toml"}, func(p, rel string) error {
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, m := range specOrReadme.FindAllStringSubmatch(string(b), -1) {
			destText, _ := read(m[1] + ".md")
			if !anchors(destText)[m[2]] {
				t.Errorf("%s names %s.md#%s, which is no heading of %s.md", rel, m[1], m[2], m[1])
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
