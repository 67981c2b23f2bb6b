package examples_test

// The documents as a reader finds their way in them: every relative link
// and anchor resolves (TestDocsLinks), and the README stays a short page
// that maps the others, each of which opens with its contents
// (TestDocsLayout). The blocks of the documents are readme_test.go's.

import (
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// readmeMaxLines bounds the README: what it is, the two commands, the
// quickstart, the library in one example, how to depend on the module, and
// the map of the documents.
const readmeMaxLines = 250

// markdownFiles returns the Markdown files of the repository at root, from
// root, but those of hidden directories and testdata.
func markdownFiles(t *testing.T, root string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, ".md") {
			rel, err := filepath.Rel(root, path)
			if err != nil {
				return err
			}
			files = append(files, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// mdLink is a link of a Markdown document's prose.
type mdLink struct {
	line   int
	target string
}

var (
	inlineLink = regexp.MustCompile(`!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^()\s<>]*(?:\([^()\s]*\)[^()\s<>]*)*)>?(?:\s+"[^"]*")?\s*\)`)
	refLink    = regexp.MustCompile(`^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+"[^"]*")?\s*$`)
	htmlLink   = regexp.MustCompile(`<a\s[^>]*href="([^"]*)"`)
	codeSpan   = regexp.MustCompile("(`+)(?:[^`]|[^`].*?[^`])`+")
)

// links returns the links of a Markdown document's prose: inline links and
// images, reference definitions and HTML anchors, outside code blocks and
// code spans.
func links(src string) []mdLink {
	var out []mdLink
	for i, l := range proseLines(src) {
		l = codeSpan.ReplaceAllStringFunc(l, func(s string) string { return strings.Repeat(" ", len(s)) })
		for _, m := range inlineLink.FindAllStringSubmatch(l, -1) {
			out = append(out, mdLink{i + 1, m[1]})
		}
		if m := refLink.FindStringSubmatch(l); m != nil {
			out = append(out, mdLink{i + 1, m[1]})
		}
		for _, m := range htmlLink.FindAllStringSubmatch(l, -1) {
			out = append(out, mdLink{i + 1, m[1]})
		}
	}
	return out
}

// headingText returns the text of an ATX heading line ("## The `x` (y)"),
// as GitHub renders it ("The x (y)"), and its level; level 0 is no
// heading.
func headingText(line string) (string, int) {
	m := regexp.MustCompile(`^ {0,3}(#{1,6})(?:\s+(.*?))?(?:\s+#+)?\s*$`).FindStringSubmatch(line)
	if m == nil {
		return "", 0
	}
	text := m[2]
	text = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`).ReplaceAllString(text, "$1") // links: their text
	text = regexp.MustCompile(`<[^>]+>`).ReplaceAllString(text, "")                   // HTML tags
	text = strings.NewReplacer("`", "", "*", "").Replace(text)                        // code, emphasis
	return text, len(m[1])
}

// slug returns the anchor GitHub makes of a heading's text: in lower
// case, without what is neither a letter, a number, a space, a hyphen nor
// an underscore, each space a hyphen.
func slug(text string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(text) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsNumber(r) || unicode.IsMark(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// heading is a heading of a Markdown document.
type heading struct {
	line   int
	level  int
	text   string
	anchor string // as GitHub makes it, numbered when it repeats
}

// headings returns the headings of a Markdown document, outside its code
// blocks.
func headings(src string) []heading {
	var out []heading
	seen := map[string]int{}
	for i, l := range proseLines(src) {
		text, level := headingText(l)
		if level == 0 {
			continue
		}
		a := slug(text)
		if n := seen[a]; n > 0 {
			seen[a]++
			a += "-" + strconv.Itoa(n)
		} else {
			seen[a] = 1
		}
		out = append(out, heading{line: i + 1, level: level, text: text, anchor: a})
	}
	return out
}

// anchors returns the anchors of a Markdown document: its headings', and
// the id and name attributes of its HTML.
func anchors(src string) map[string]bool {
	set := map[string]bool{}
	for _, h := range headings(src) {
		set[h.anchor] = true
	}
	for _, m := range regexp.MustCompile(`<[a-z]+\s[^>]*(?:id|name)="([^"]+)"`).FindAllStringSubmatch(src, -1) {
		set[m[1]] = true
	}
	return set
}

// TestDocsLinks checks every relative link of every Markdown file of the
// repository: its file or directory is one of the repository's, and its
// anchor, if any, is a heading of the Markdown file it names (or of its
// own), as GitHub spells anchors; a link into another kind of file takes
// a line's anchor (#L12) alone. Links with a scheme (https:, mailto:) are
// left alone.
func TestDocsLinks(t *testing.T) {
	p := readme(t)
	files := markdownFiles(t, p.root)
	if !slices.Contains(files, "README.md") || !slices.Contains(files, "docs/PROTOCOL.md") {
		t.Fatalf("markdown files: %q: README.md and docs/PROTOCOL.md missing", files)
	}
	read := map[string]string{}
	source := func(path string) string {
		if s, ok := read[path]; ok {
			return s
		}
		b, err := os.ReadFile(filepath.Join(p.root, path))
		if err != nil {
			t.Fatal(err)
		}
		read[path] = string(b)
		return read[path]
	}
	var checked int
	for _, file := range files {
		for _, l := range links(source(file)) {
			if l.target == "" || regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`).MatchString(l.target) {
				continue
			}
			checked++
			where := file + ":" + strconv.Itoa(l.line)
			pathPart, anchor, _ := strings.Cut(l.target, "#")
			target := file
			if pathPart != "" {
				unescaped, err := url.PathUnescape(pathPart)
				if err != nil {
					t.Errorf("%s: link %q: %v", where, l.target, err)
					continue
				}
				if strings.HasPrefix(unescaped, "/") {
					target = filepath.ToSlash(filepath.Clean(strings.TrimPrefix(unescaped, "/")))
				} else {
					target = filepath.ToSlash(filepath.Join(filepath.Dir(file), unescaped))
				}
				if target == ".." || strings.HasPrefix(target, "../") {
					t.Errorf("%s: link %q leaves the repository", where, l.target)
					continue
				}
				if _, err := os.Stat(filepath.Join(p.root, target)); err != nil {
					t.Errorf("%s: link %q: no %s in the repository", where, l.target, target)
					continue
				}
			}
			if anchor == "" {
				continue
			}
			if !strings.HasSuffix(target, ".md") {
				if !regexp.MustCompile(`^L\d+(-L\d+)?$`).MatchString(anchor) {
					t.Errorf("%s: link %q: an anchor into %s, which is no Markdown file", where, l.target, target)
				}
				continue
			}
			if !anchors(source(target))[anchor] {
				var have []string
				for _, h := range headings(source(target)) {
					have = append(have, "#"+h.anchor)
				}
				t.Errorf("%s: link %q: %s has no heading of anchor #%s; it has %s", where, l.target, target, anchor, strings.Join(have, " "))
			}
		}
	}
	if checked == 0 {
		t.Error("no relative link checked: the reading of links is broken")
	}
}

// TestDocsLayout checks the shape of the documents: the README is at most
// readmeMaxLines lines, its first two indented go commands are the demo
// and the test command (.ci/run runs the second), and it links every
// document of docs/ and every file of deploy/; each document of docs/
// opens with a table of contents, "## Contents", that links every other
// section (##) of it, in order.
func TestDocsLayout(t *testing.T) {
	p := readme(t)
	src, err := os.ReadFile(filepath.Join(p.root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	readme := string(src)
	if n := strings.Count(strings.TrimSuffix(readme, "\n"), "\n") + 1; n > readmeMaxLines {
		t.Errorf("README.md: %d lines; at most %d: what is more goes into a document of docs/", n, readmeMaxLines)
	}

	// The two commands, as .ci/run reads them: the indented lines that
	// start with "go ".
	var gos []string
	for _, l := range strings.Split(readme, "\n") {
		if strings.HasPrefix(l, "    go ") {
			gos = append(gos, strings.TrimPrefix(l, "    "))
		}
	}
	if len(gos) < 2 || gos[0] != "go run ./examples/demo" || !strings.HasPrefix(gos[1], "go test ") {
		t.Errorf("README.md: the first two indented go lines are %q; want go run ./examples/demo, then the test command (.ci/run runs the second)", gos[:min(2, len(gos))])
	}

	// The map.
	linked := map[string]bool{}
	for _, l := range links(readme) {
		path, _, _ := strings.Cut(l.target, "#")
		linked[filepath.ToSlash(filepath.Clean(path))] = true
	}
	want := slices.Clone(p.docs[1:])
	deploy, err := os.ReadDir(filepath.Join(p.root, "deploy"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range deploy {
		want = append(want, "deploy/"+f.Name())
	}
	if len(p.docs) < 2 || len(deploy) == 0 {
		t.Errorf("documents %q, deploy/ %d files: the README's map has nothing to map", p.docs, len(deploy))
	}
	for _, w := range want {
		if !linked[w] {
			t.Errorf("README.md: no link to %s: its map of the documents names each", w)
		}
	}

	// Each document's contents.
	for _, doc := range p.docs[1:] {
		src, err := os.ReadFile(filepath.Join(p.root, doc))
		if err != nil {
			t.Fatal(err)
		}
		hs := headings(string(src))
		var sections []heading
		contents := -1
		for _, h := range hs {
			if h.level != 2 {
				continue
			}
			if h.text == "Contents" && contents < 0 && len(sections) == 0 {
				contents = h.line
				continue
			}
			sections = append(sections, h)
		}
		if contents < 0 {
			t.Errorf("%s: no table of contents: a section \"## Contents\" before the others", doc)
			continue
		}
		// The links of the contents: its lines up to the next heading.
		var listed []string
		lines := strings.Split(string(src), "\n")
		for _, l := range lines[contents:] {
			if _, level := headingText(l); level > 0 {
				break
			}
			for _, m := range inlineLink.FindAllStringSubmatch(l, -1) {
				if a, ok := strings.CutPrefix(m[1], "#"); ok {
					listed = append(listed, a)
				}
			}
		}
		var at int
		for _, s := range sections {
			i := slices.Index(listed[at:], s.anchor)
			if i < 0 {
				t.Errorf("%s:%d: the contents do not link the section %q (#%s), or not in order", doc, s.line, s.text, s.anchor)
				continue
			}
			at += i + 1
		}
	}
}

// TestSlug checks the anchors made of headings against GitHub's for the
// headings of these documents.
func TestSlug(t *testing.T) {
	for text, want := range map[string]string{
		"## The agent's state":                           "the-agents-state",
		"## https:// endpoints":                          "https-endpoints",
		"### Traffic policy (`bind.policy`)":             "traffic-policy-bindpolicy",
		"# The agent–edge protocol, version 5":           "the-agentedge-protocol-version-5",
		"## What .ci/run adds":                           "what-cirun-adds",
		"## Several edges: the Router and the Dialer":    "several-edges-the-router-and-the-dialer",
		"## Encrypted ClientHello (ECH)":                 "encrypted-clienthello-ech",
		"### Ping streams (`0x05`), version 3 and later": "ping-streams-0x05-version-3-and-later",
		"## A [linked](x.md) *title* ##":                 "a-linked-title",
		"## snake_case":                                  "snake_case",
	} {
		h, level := headingText(text)
		if level == 0 {
			t.Errorf("headingText(%q): no heading", text)
			continue
		}
		if got := slug(h); got != want {
			t.Errorf("slug(%q) = %q, want %q", text, got, want)
		}
	}
	src := "# A\n\n```\n# not a heading\n```\n\n## A\n\n    # not one either\n\n## a\n"
	var got []string
	for _, h := range headings(src) {
		got = append(got, h.anchor)
	}
	if want := []string{"a", "a-1", "a-2"}; !slices.Equal(got, want) {
		t.Errorf("headings: anchors %q, want %q", got, want)
	}
	ls := links("[a](x.md#b) `[not](y.md)` ![i](img.png \"t\")\n\n    [not](z.md)\n\n[r]: ref.md#c\n")
	var targets []string
	for _, l := range ls {
		targets = append(targets, l.target)
	}
	if want := []string{"x.md#b", "img.png", "ref.md#c"}; !slices.Equal(targets, want) {
		t.Errorf("links: %q, want %q", targets, want)
	}
}
