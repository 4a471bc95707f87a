package redact

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ParsePostgres parses connString with pgxpool.ParseConfig: a URL
// (postgres://user:password@host:port/db?param=value) or key=value pairs,
// with PGPASSWORD, PGPASSFILE and the other PG* variables read as libpq
// reads them. Its errors never hold connString nor any part of it that
// PostgresSecrets names:
//   - a string pgx cannot parse gives pgx's reason without pgx's rendering
//     of the string (which pgx masks on a best-effort basis only), redacted;
//   - a URL whose host holds '@' is refused: an unencoded '@' in the
//     password makes pgx read the rest of the password as the host, which
//     every connection error, log line and dead letter would then print;
//   - so is a URL with a raw '@' after its host (in the database name) or
//     with a '#': an unencoded '/' or '#' in the password ends the host
//     early, and the rest of the password becomes the host, the database
//     name or a fragment (new-user trial: postgres://wk:Tr0ub4dor@vault-pw/
//     Zx9q7Lm2@127.0.0.1/wdb printed host=vault-pw database=Zx9q7Lm2@...).
//
// White space around connString is ignored: a Kubernetes Secret made from
// a file ends in a newline, which pgx read into the database name
// (fresh-user trial: `database "db\n" does not exist` over two lines).
func ParsePostgres(connString string) (*pgxpool.Config, error) {
	connString = strings.TrimSpace(connString)
	cfg, err := pgxpool.ParseConfig(connString)
	if err != nil {
		reason := err.Error()
		var pce *pgconn.ParseConfigError
		if errors.As(err, &pce) {
			blank := *pce // pgx's own reason, rendered without the string
			blank.ConnString = ""
			reason = strings.TrimPrefix(blank.Error(), "cannot parse ``: ")
		}
		secrets := PostgresSecrets(connString)
		reason = New(secrets...).String(maskQuotedParts(reason))
		if isURL(connString) && (strings.Count(connString, "@") > 1 || strings.Contains(connString, "#")) {
			// The parse failed on a piece of the password (final
			// fresh-user check: `missing key/value separator "=" in URI
			// query parameter` alone, or `invalid port`).
			reason += ": " + encodingHint
		}
		return nil, fmt.Errorf("cannot parse the %s connection string: %s", form(connString), reason)
	}
	if isURL(connString) {
		if unencodedAfterHost(connString) {
			return nil, errors.New("the URL has an '@' after its host or a '#': " + encodingHint)
		}
		for _, h := range hosts(cfg.ConnConfig.Config) {
			if strings.Contains(h, "@") && !strings.HasPrefix(h, "/") {
				return nil, errors.New("the URL's host holds an '@': " + encodingHint)
			}
		}
	}
	return cfg, nil
}

// quotedPart matches a double-quoted part of a reason (no escapes: the
// URL parser quotes the part it refuses as it is).
var quotedPart = regexp.MustCompile(`"[^"]*"`)

// maskQuotedParts returns reason with every double-quoted part masked
// whole, but for a bit of punctuation (`"="`, `"&"`): a parse error quotes
// a piece of the string (`unexpected spaces found in "abc def@127.0.0.1"`),
// which can hold any part of a password, whatever its length (third
// new-user trial: a piece of 7 bytes after an unencoded '@'; security
// trial: the part after an unencoded '?' or '&', which holds no whole
// secret, so that masking the pieces that hold one missed it).
func maskQuotedParts(reason string) string {
	return quotedPart.ReplaceAllStringFunc(reason, func(q string) string {
		if len(q) <= 2+3 && strings.Trim(q, `"=&@:/?#;,`) == "" {
			return q
		}
		return `"` + Mask + `"`
	})
}

// Describe returns the host, port, database and user cfg connects to, for
// logs: "host=H port=P database=D user=U" (first host only).
func Describe(cfg *pgconn.Config) string {
	return fmt.Sprintf("host=%s port=%d database=%s user=%s", cfg.Host, cfg.Port, cfg.Database, cfg.User)
}

func hosts(cfg pgconn.Config) []string {
	hs := []string{cfg.Host}
	for _, f := range cfg.Fallbacks {
		hs = append(hs, f.Host)
	}
	return hs
}

// unencodedAfterHost reports whether the URL s has a raw '@' in its path
// (the database name), a fragment ('#'), or, when its userinfo holds a
// password, a raw '@' in its query, which a connection URL never needs:
// the signs of a password whose '/', '?' or '#' was not percent-encoded
// (final fresh-user check: in u:S3cr3t@p/s?application_name=W0rd@h/x the
// rest of the password became application_name). A query's '@' without a
// password before the host is left alone: ?user=name@server is a user.
func unencodedAfterHost(s string) bool {
	_, rest, _ := strings.Cut(s, "://")
	if strings.Contains(rest, "#") {
		return true
	}
	i := strings.IndexAny(rest, "/?")
	if i < 0 {
		return false
	}
	path, query, _ := strings.Cut(rest[i:], "?") // path "" when the query comes first
	if strings.Contains(path, "@") {
		return true
	}
	userinfo, _, hasUser := strings.Cut(rest[:i], "@")
	return hasUser && strings.Contains(userinfo, ":") && strings.Contains(query, "@")
}

// encodingHint is said of a URL with a sign of a user name or password not
// percent-encoded: an '@' after the host or in it, a '#', or, when the URL
// does not parse, more than one '@'.
const encodingHint = "an '@', '/', '?', '#' or ':' in the user name or password must be percent-encoded (%40 for '@', %2F for '/', %3F for '?', %23 for '#', %3A for ':')"

func isURL(s string) bool {
	return strings.HasPrefix(s, "postgres://") || strings.HasPrefix(s, "postgresql://")
}

func form(s string) string {
	if isURL(s) {
		return "URL"
	}
	return "key=value"
}

// PostgresSecrets returns what may be a password in connString, read
// generously so that it holds even for a string pgx cannot parse: connString
// itself; the password pgx resolves when it parses (from the string,
// PGPASSWORD or the passfile); PGPASSWORD; in a URL, the text
// between the first ':' of the userinfo and each '@' (an unencoded '@' makes
// the boundary ambiguous), each of its '@'-separated parts, and the values of
// password and sslpassword query parameters, each as written and decoded;
// in key=value form, the value of password and sslpassword (spaces allowed
// around '=', quoted or not) and, when an unquoted value is followed by
// words that are not key=value, the whole run and each of those words (the
// rest of a password with a space in it).
func PostgresSecrets(connString string) []string {
	secrets := []string{connString, os.Getenv("PGPASSWORD")}
	if cfg, err := pgconn.ParseConfig(connString); err == nil {
		secrets = append(secrets, cfg.Password)
	}
	add := func(vs ...string) {
		for _, v := range vs {
			secrets = append(secrets, v)
			if d, err := url.PathUnescape(v); err == nil {
				secrets = append(secrets, d)
			}
		}
	}
	if isURL(connString) {
		rest := connString[strings.Index(connString, "://")+len("://"):]
		for i := range len(rest) {
			if rest[i] != '@' {
				continue
			}
			if _, pw, found := strings.Cut(rest[:i], ":"); found {
				add(pw)
				add(strings.Split(pw, "@")...)
			}
		}
		if _, query, found := strings.Cut(rest, "?"); found {
			for _, kv := range strings.Split(query, "&") {
				k, v, _ := strings.Cut(kv, "=")
				if d, err := url.QueryUnescape(k); err == nil {
					k = d
				}
				if IsPasswordKey(k) {
					add(v)
				}
			}
		}
	}
	secrets = append(secrets, keywordValues(connString)...)
	return secrets
}

// keywordValues returns the values of every password and sslpassword
// keyword of a key=value connection string, as PostgresSecrets describes.
func keywordValues(s string) []string {
	var out []string
	lower := strings.ToLower(s)
	for i := 0; ; {
		j := strings.Index(lower[i:], "password")
		if j < 0 {
			return out
		}
		p := i + j + len("password")
		i = p
		p = skipSpace(s, p)
		if p >= len(s) || s[p] != '=' {
			continue
		}
		p = skipSpace(s, p+1)
		if p < len(s) && s[p] == '\'' {
			end := p + 1
			for end < len(s) && s[end] != '\'' {
				if s[end] == '\\' {
					end++
				}
				end++
			}
			end = min(end, len(s))
			v := s[p+1 : end]
			out = append(out, v, strings.NewReplacer(`\'`, `'`, `\\`, `\`).Replace(v))
			continue
		}
		end := p
		for end < len(s) && !isSpace(s[end]) {
			end++
		}
		out = append(out, s[p:end])
		// Words up to the next key=value may be the rest of the password.
		runEnd := end
		for q := skipSpace(s, end); q < len(s); q = skipSpace(s, runEnd) {
			w := q
			for w < len(s) && !isSpace(s[w]) && s[w] != '=' {
				w++
			}
			if w == q || (skipSpace(s, w) < len(s) && s[skipSpace(s, w)] == '=') {
				break
			}
			out = append(out, s[q:w])
			runEnd = w
		}
		if runEnd > end {
			out = append(out, s[p:runEnd])
		}
	}
}

func skipSpace(s string, p int) int {
	for p < len(s) && isSpace(s[p]) {
		p++
	}
	return p
}

func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'
}

// WithoutPassword returns connString without its password, for a command
// line to show (psql then reads PGPASSWORD or asks for it): a URL keeps
// its user and loses the password of its userinfo and its password and
// sslpassword parameters; a key=value string loses its password and
// sslpassword pairs (a masked value would be sent as the password). A URL
// that net/url cannot parse is masked whole. Unlike Redactor.String, it
// never masks text that merely equals the password (a user named as the
// password stays readable).
func WithoutPassword(connString string) string {
	if !isURL(connString) {
		return strings.TrimSpace(keyPasswordPair.ReplaceAllString(connString, ""))
	}
	u, err := url.Parse(connString)
	if err != nil {
		return Mask
	}
	if u.User != nil {
		u.User = url.User(u.User.Username())
	}
	if q := u.Query(); len(q) > 0 {
		dropped := false
		for k := range q {
			if IsPasswordKey(k) {
				q.Del(k)
				dropped = true
			}
		}
		if dropped {
			u.RawQuery = q.Encode()
		}
	}
	return u.String()
}

// keyPasswordPair matches a key=value string's password or sslpassword
// pair: the key, '=' (spaces allowed around it) and the value, quoted
// (backslash escapes) or up to a space.
var keyPasswordPair = regexp.MustCompile(`(?i)(?:^|\s)(?:ssl)?password\s*=\s*(?:'(?:[^'\\]|\\.)*'|[^\s']\S*|)`)

// IsPasswordKey reports whether the key k (a connection string's query
// parameter, a log attribute, a flag's name) holds a password: it ends in
// "password", in any case (password, sslpassword, kafka-sasl-password).
func IsPasswordKey(k string) bool {
	return strings.HasSuffix(strings.ToLower(k), "password")
}
