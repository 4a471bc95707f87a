package projection

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"unicode"

	"go.yaml.in/yaml/v3"
)

// maxIRVersion is the longest irVersion a definitions file may give, in
// bytes ("v42" is 3).
const maxIRVersion = 64

// defParser turns the YAML node tree into Definitions, checking keys and
// node kinds itself so that every problem names its projection and field
// (the yaml package's KnownFields errors name Go types and stop at the first
// document-level problem).
type defParser struct {
	file    string
	errs    []error
	refused map[string]bool // paths whose value was refused (refuse)
	lines   map[string]int  // paths of the values read → their line, for Validate's messages
	// unread: the file is empty or not YAML, so nothing of it was read and
	// Validate would only add what is missing because of that.
	unread bool
}

// refuse reports the value n at where as invalid (fail) and records where,
// so that Validate does not report the value as missing too.
func (p *defParser) refuse(where string, n *yaml.Node, format string, args ...any) {
	p.fail(where, n, format, args...)
	if p.refused == nil {
		p.refused = map[string]bool{}
	}
	p.refused[where] = true
}

// line records that the value at where is n, for Validate's messages; the
// first node recorded for a path stays.
func (p *defParser) line(where string, n *yaml.Node) {
	if n.Line <= 0 {
		return
	}
	if p.lines == nil {
		p.lines = map[string]int{}
	}
	if _, ok := p.lines[where]; !ok {
		p.lines[where] = n.Line
	}
}

func (p *defParser) fail(where string, n *yaml.Node, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if where != "" {
		msg = where + ": " + msg
	}
	if n != nil && n.Line > 0 {
		msg += fmt.Sprintf(" (line %d)", n.Line)
	}
	p.errs = append(p.errs, fmt.Errorf("%s: %s", p.file, msg))
}

func (p *defParser) parse(data []byte) *Definitions {
	d := &Definitions{}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		p.unread = true
		if errors.Is(err, io.EOF) {
			p.fail("", nil, "empty file")
		} else {
			// JSON is read as YAML: say so, a JSON file's error reads "yaml: ...".
			p.fail("", nil, "not valid YAML or JSON: %s", yamlErrorText(err, data))
		}
		return d
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		// Said alone: what the first document lacks may be in the next
		// (new-user trial: "projections: none defined" of a file whose
		// projections followed a "---").
		p.unread = true
		p.fail("", nil, "more than one YAML document (a line \"---\" starts another): put irVersion and projections in one")
		return d
	}
	root := resolve(&doc)
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = resolve(root.Content[0])
	}
	p.mapping("", root, map[string]func(*yaml.Node){
		"irVersion": func(v *yaml.Node) {
			if v.Kind == yaml.ScalarNode && v.Tag != "!!str" && v.Tag != "!!null" {
				p.refuse("irVersion", v, "must be a string (quote it: \"%s\")", v.Value)
				return
			}
			d.IRVersion = p.str("irVersion", v)
			// It goes into every dead letter's generation header and the
			// worker's log (new-user trials: "v1\u0000x", a right-to-left
			// override and 100 KB were taken).
			switch {
			case len(d.IRVersion) > maxIRVersion:
				p.refuse("irVersion", v, "is %d bytes, longer than %d", len(d.IRVersion), maxIRVersion)
			case strings.ContainsFunc(d.IRVersion, func(r rune) bool { return !unicode.IsGraphic(r) || unicode.IsSpace(r) }):
				p.refuse("irVersion", v, "%+q holds a character that is not a visible one (a control, format or space character)", d.IRVersion)
			}
		},
		"projections": func(v *yaml.Node) {
			if v.Kind != yaml.SequenceNode {
				p.refuse("projections", v, "must be a list")
				return
			}
			named := map[string]int{} // projections by name, to tell apart two of one name
			for _, pn := range v.Content {
				if name := projectionName(resolve(pn)); name != "" {
					named[name]++
				}
			}
			for i, pn := range v.Content {
				d.Projections = append(d.Projections, p.projection(i, resolve(pn), named))
			}
		},
	})
	return d
}

// projectionName returns the name a projection's mapping n gives, "" when
// it has none usable: its first, the one read (eachPair refuses a key's
// repeats; new-user trial: a duplicate name key was reported under the
// second name, every other error under the first).
func projectionName(n *yaml.Node) string {
	if n.Kind == yaml.MappingNode {
		for j := 0; j+1 < len(n.Content); j += 2 {
			if k := n.Content[j]; k.Value == "name" {
				if v := resolve(n.Content[j+1]); v.Kind == yaml.ScalarNode && v.Value != "" {
					return v.Value
				}
				return ""
			}
		}
	}
	return ""
}

// projection reads the i-th projection, n; named counts the projections of
// each name in the file.
func (p *defParser) projection(i int, n *yaml.Node, named map[string]int) ProjectionDef {
	var pd ProjectionDef
	where := fmt.Sprintf("projections[%d]", i)
	// Name the projection in every message when it has a usable name; by
	// its index too when another projection has that name, as Validate does.
	if name := projectionName(n); named[name] > 1 {
		where = fmt.Sprintf("projections[%d] (%q)", i, name)
	} else if name != "" {
		where = fmt.Sprintf("projection %q", name)
	}
	notNullFalse := map[string]*yaml.Node{} // the columns that say notNull: false
	defer func() {
		// A key column is NOT NULL whatever the file says: one that says
		// otherwise is a contradiction, refused (definition-author trial).
		for _, k := range pd.PrimaryKey {
			if v := notNullFalse[k]; v != nil {
				p.fail(where+": "+memberPath("columns", k)+": notNull", v, "false, but the column is in primaryKey, and a primary-key column is always NOT NULL: remove notNull: false")
				delete(notNullFalse, k) // once, if listed twice
			}
		}
	}()
	p.mapping(where, n, map[string]func(*yaml.Node){
		"name":  func(v *yaml.Node) { pd.Name = p.str(where+": name", v) },
		"table": func(v *yaml.Node) { pd.Table = p.str(where+": table", v) },
		"primaryKey": func(v *yaml.Node) {
			if v.Kind != yaml.SequenceNode {
				p.refuse(where+": primaryKey", v, "must be a list of column names")
				return
			}
			pd.PrimaryKey = make([]string, 0, len(v.Content)) // [] is not a missing key
			for _, e := range v.Content {
				pd.PrimaryKey = append(pd.PrimaryKey, p.str(where+": primaryKey", resolve(e)))
			}
		},
		"columns": func(v *yaml.Node) {
			if v.Kind != yaml.MappingNode {
				p.refuse(where+": columns", v, "must be a mapping of column name to definition")
				return
			}
			pd.Columns = map[string]ColumnDef{}
			p.eachPair(where+": columns", v, func(k, cv *yaml.Node) {
				var nf *yaml.Node
				pd.Columns[k.Value], nf = p.column(where+": "+memberPath("columns", k.Value), cv)
				if nf != nil {
					notNullFalse[k.Value] = nf
				}
				pd.ColumnNames = append(pd.ColumnNames, k.Value)
			})
		},
		"events": func(v *yaml.Node) {
			if v.Kind != yaml.MappingNode {
				p.refuse(where+": events", v, "must be a mapping of event type to upsert or delete")
				return
			}
			pd.Events = map[string]Op{}
			p.eachPair(where+": events", v, func(k, ov *yaml.Node) {
				if k.Tag == "!!null" || k.Tag == "!!bool" {
					// YAML reads ~, null and true as no string at all
					// (new-user trial: they were taken as event types).
					p.fail(where+": events", k, "key %s is YAML's %s, not an event type name: quote it (\"%s\") if an event type is spelt so", k.Value, strings.TrimPrefix(k.Tag, "!!"), k.Value)
					return
				}
				at := where + ": " + memberPath("events", k.Value)
				switch t := k.Value; {
				// Matched exactly against the wire's eventType: a likely
				// typo, as a from path's white space is (definition-author
				// trial: " E", "E\t" and a zero-width space were taken).
				case strings.TrimSpace(t) != t:
					p.fail(at, k, "%+q starts or ends with white space, and an event's eventType is matched exactly: remove it", t)
				case strings.ContainsFunc(t, func(r rune) bool { return !unicode.IsGraphic(r) }):
					p.fail(at, k, "%+q holds a character that is not a visible one (a control or format character), and an event's eventType is matched exactly: remove it", t)
				}
				pd.Events[k.Value] = Op(p.str(at, ov))
			})
		},
	})
	return pd
}

// memberPath returns the path of key in the mapping prefix, as errors name
// it: "prefix.key", or `prefix["key"]` (Go-quoted) when key holds a
// character Go quotes (a control character, invalid UTF-8), so that a
// path in an error can carry no terminal escape sequence or new line
// (security trial: a column key "v\x1b[2J..." cleared the screen of
// whoever read validate's error, "E\nX" forged a line); so is a key that
// is empty or starts or ends with white space, which reads as no key or
// none at all after the dot.
func memberPath(prefix, key string) string {
	if q := strconv.Quote(key); q[1:len(q)-1] != key || key == "" || strings.TrimSpace(key) != key {
		return prefix + "[" + q + "]"
	}
	return prefix + "." + key
}

// column reads the column definition n, and returns its notNull node
// when it is false (nil otherwise), which a primary-key column may not
// say.
func (p *defParser) column(where string, n *yaml.Node) (c ColumnDef, notNullFalse *yaml.Node) {
	p.mapping(where, n, map[string]func(*yaml.Node){
		"type":   func(v *yaml.Node) { c.Type = p.str(where+": type", v) },
		"from":   func(v *yaml.Node) { c.From = p.str(where+": from", v) },
		"derive": func(v *yaml.Node) { c.Derive = p.str(where+": derive", v) },
		"notNull": func(v *yaml.Node) {
			if v.Kind != yaml.ScalarNode || v.Tag != "!!bool" || v.Decode(&c.NotNull) != nil {
				p.refuse(where+": notNull", v, "must be true or false")
			} else if !c.NotNull {
				notNullFalse = v
			}
		},
	})
	return c, notNullFalse
}

// mapping calls fields[key] for each key of the mapping n; unknown and
// duplicate keys are errors.
func (p *defParser) mapping(where string, n *yaml.Node, fields map[string]func(*yaml.Node)) {
	if n.Kind != yaml.MappingNode {
		p.refuse(where, n, "must be a mapping")
		return
	}
	p.eachPair(where, n, func(k, v *yaml.Node) {
		f, ok := fields[k.Value]
		if !ok {
			p.fail(where, k, "unknown key %q (want one of %s)", k.Value, strings.Join(sortedKeys(fields), ", "))
			return
		}
		if where == "" {
			p.line(k.Value, v)
		} else {
			p.line(where+": "+k.Value, v)
		}
		f(v)
	})
}

// eachPair calls f for each key/value pair of the mapping n, reporting
// non-scalar and duplicate keys.
func (p *defParser) eachPair(where string, n *yaml.Node, f func(k, v *yaml.Node)) {
	if where != "" {
		p.line(where, n)
	}
	seen := map[string]*yaml.Node{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := resolve(n.Content[i]), resolve(n.Content[i+1])
		if k.Kind != yaml.ScalarNode {
			p.fail(where, k, "keys must be strings")
			continue
		}
		if k.Tag == "!!merge" {
			// Definition-author trial: `unknown key "<<"` said nothing of
			// why.
			p.fail(where, k, "YAML merge keys (<<) are not supported: write the keys out, or make the whole value an alias (*name)")
			continue
		}
		if first, dup := seen[k.Value]; dup {
			if first.Line == k.Line {
				// One line ({ from: a, from: b }): the columns tell them
				// apart (new-user trial: "line 9; first at line 9").
				p.fail(where, nil, "duplicate key %q (line %d, column %d; first at column %d)", k.Value, k.Line, k.Column, first.Column)
			} else {
				p.fail(where, nil, "duplicate key %q (line %d; first at line %d)", k.Value, k.Line, first.Line)
			}
			continue
		}
		seen[k.Value] = k
		f(k, v)
	}
}

// str returns the value of a scalar node, reporting other nodes, null and
// an empty string (every string of the file names or holds something).
func (p *defParser) str(where string, n *yaml.Node) string {
	p.line(where, n)
	if n.Kind != yaml.ScalarNode || n.Tag == "!!null" {
		p.refuse(where, n, "must be a string")
		return ""
	}
	if n.Value == "" {
		// Given, but empty: not "missing" (new-user trial: derive: ""
		// was reported as neither from nor derive set).
		p.refuse(where, n, "is empty")
	}
	return n.Value
}

// resolve follows YAML aliases.
func resolve(n *yaml.Node) *yaml.Node {
	for i := 0; n.Kind == yaml.AliasNode && n.Alias != nil && i < 100; i++ {
		n = n.Alias
	}
	return n
}

// yamlLine is the line the YAML parser names in its error ("yaml: line 3:
// found character that cannot start any token").
var yamlLine = regexp.MustCompile(`^(?:yaml: )?line ([0-9]+): (.*)$`)

// yamlParserProblems are the problems of the YAML library's parser (not
// its scanner), whose "line N" it numbers from 0: the line of the flow
// collection or block it was parsing. The scanner's lines are numbered
// from 1. (Fresh-helper trial: an unclosed [ on line 9 was reported at
// line 8, an unclosed quote inside { on line 17 at line 16, a comment.)
var yamlParserProblems = map[string]bool{
	"did not find expected ',' or ']'":       true,
	"did not find expected ',' or '}'":       true,
	"did not find expected '-' indicator":    true,
	"did not find expected <document start>": true,
	"did not find expected <stream-start>":   true,
	"did not find expected key":              true,
	"did not find expected node content":     true,
	"found duplicate %TAG directive":         true,
	"found duplicate %YAML directive":        true,
	"found incompatible YAML document":       true,
	"found undefined tag handle":             true,
}

// yamlHints say what usually causes a YAML problem whose words name only
// what the library expected.
var yamlHints = map[string]string{
	"did not find expected ',' or ']'": "a [ opened on this line is not closed, or a quote inside it is not",
	"did not find expected ',' or '}'": "a { opened on this line is not closed, or a quote inside it is not",
	"found unexpected end of stream":   "the file ends inside a quoted string or a [ or { opened on this line",
}

// yamlErrorText returns the YAML parser's error err about data as the
// other problems of a definitions file read: its message, then "(line N)"
// when it names a line, and what is wrong when that line holds a tab (YAML
// indents with spaces; new-user trial: "found character that cannot start
// any token" did not say so).
func yamlErrorText(err error, data []byte) string {
	msg := err.Error()
	m := yamlLine.FindStringSubmatch(msg)
	if m == nil {
		return strings.TrimPrefix(msg, "yaml: ")
	}
	n, _ := strconv.Atoi(m[1])
	if yamlParserProblems[m[2]] {
		// Not past the last line: the end of the file is marked on the
		// line after it.
		lines := bytes.Count(data, []byte("\n"))
		if len(data) > 0 && data[len(data)-1] != '\n' {
			lines++
		}
		n = min(n+1, max(lines, 1))
	}
	text := m[2] + " (line " + strconv.Itoa(n) + ")"
	if hint := yamlHints[m[2]]; hint != "" {
		// The library's words name what it expected, not the likely fault
		// (fresh-helper trial: an unclosed quote read as a missing ,).
		text += ": " + hint
	}
	if n > 0 {
		if lines := bytes.Split(data, []byte("\n")); n <= len(lines) && bytes.IndexByte(lines[n-1], '\t') >= 0 {
			text += ": the line holds a tab; YAML indents with spaces"
		}
	}
	return text
}
