package console

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"
)

// BasicChallenge is the Config.Challenge that makes a browser ask for the credentials BasicAuth and TokenAuth
// check.
const BasicChallenge = `Basic realm="stagehand console", charset="UTF-8"`

// BasicAuth returns a Config.Authorize that accepts HTTP basic authentication with this user name and password
// (compared in constant time) and names that user. Use it with Challenge: BasicChallenge, and serve the console
// over TLS beyond the local machine: basic credentials travel with every request.
func BasicAuth(user, password string) func(*http.Request) (string, bool) {
	wantUser, wantPass := sha256.Sum256([]byte(user)), sha256.Sum256([]byte(password))
	return func(r *http.Request) (string, bool) {
		u, p, ok := r.BasicAuth()
		if !ok {
			return "", false
		}
		gotUser, gotPass := sha256.Sum256([]byte(u)), sha256.Sum256([]byte(p))
		userOK := subtle.ConstantTimeCompare(gotUser[:], wantUser[:])
		passOK := subtle.ConstantTimeCompare(gotPass[:], wantPass[:])
		if userOK&passOK != 1 {
			return "", false
		}
		return user, true
	}
}

// TokenAuth returns a Config.Authorize that accepts a bearer token ("Authorization: Bearer TOKEN", for scripts) or,
// from a browser, HTTP basic authentication whose password is the token (any user name, which names the user;
// "token" when empty). The token is compared in constant time. Use it with Challenge: BasicChallenge.
func TokenAuth(token string) func(*http.Request) (string, bool) {
	want := sha256.Sum256([]byte(token))
	check := func(got string) bool {
		sum := sha256.Sum256([]byte(got))
		return token != "" && subtle.ConstantTimeCompare(sum[:], want[:]) == 1
	}
	return func(r *http.Request) (string, bool) {
		if h := r.Header.Get("Authorization"); len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
			if check(strings.TrimSpace(h[7:])) {
				return "token", true
			}
			return "", false
		}
		u, p, ok := r.BasicAuth()
		if !ok || !check(p) {
			return "", false
		}
		if u = strings.TrimSpace(u); u == "" {
			u = "token"
		}
		return u, true
	}
}

// csrfLifetime is how long a form's CSRF token is accepted: a page left open over a night shift still works.
const csrfLifetime = 12 * time.Hour

// csrfToken returns the CSRF token of user's forms, issued at now: the time and an HMAC of the user and the time
// under the console's key, so a token is good for one user only, for csrfLifetime, and cannot be forged without
// the key.
func (c *Console) csrfToken(user string, now time.Time) string {
	var b [8 + sha256.Size]byte
	binary.BigEndian.PutUint64(b[:8], uint64(now.Unix()))
	copy(b[8:], c.csrfMAC(user, b[:8]))
	return base64.RawURLEncoding.EncodeToString(b[:])
}

func (c *Console) csrfMAC(user string, issued []byte) []byte {
	m := hmac.New(sha256.New, c.cfg.CSRFKey)
	m.Write([]byte("stagehand console csrf\x00"))
	m.Write(issued)
	m.Write([]byte(user))
	return m.Sum(nil)
}

var (
	errCSRFMissing = errors.New("the form carries no CSRF token")
	errCSRFInvalid = errors.New("the form's CSRF token is not valid for this user (reload the page)")
	errCSRFExpired = errors.New("the form's CSRF token has expired (reload the page)")
)

// checkCSRF verifies a form's token for user at now.
func (c *Console) checkCSRF(token, user string, now time.Time) error {
	if token == "" {
		return errCSRFMissing
	}
	b, err := base64.RawURLEncoding.Strict().DecodeString(token) // one text per token
	if err != nil || len(b) != 8+sha256.Size {
		return errCSRFInvalid
	}
	if !hmac.Equal(b[8:], c.csrfMAC(user, b[:8])) {
		return errCSRFInvalid
	}
	issued := time.Unix(int64(binary.BigEndian.Uint64(b[:8])), 0)
	if now.Sub(issued) > csrfLifetime || issued.Sub(now) > time.Minute {
		return errCSRFExpired
	}
	return nil
}

// confirmLifetime is how long a confirmation stays good: long enough to read it, short enough that what it counted
// still describes the data.
const confirmLifetime = 15 * time.Minute

// unsigned are the form fields a confirmation token does not cover: the tokens themselves, and the page to return
// to (checked on its own: a path of this console).
var unsigned = map[string]bool{"csrf": true, "confirmation": true, "back": true}

// confirmToken returns the token /confirm gives an action's confirmation form: its expiry and an HMAC, under the
// console's key, of the user, the console's scope and every field the form carries (the action, its filter or
// selection, the bound and the confirmed count). /act recomputes it from what it is sent, so an action whose
// fields were changed, added or left out after the confirmation, or that was never confirmed, is refused.
func (c *Console) confirmToken(user string, form url.Values, expires time.Time) string {
	var b [8 + sha256.Size]byte
	binary.BigEndian.PutUint64(b[:8], uint64(expires.Unix()))
	copy(b[8:], c.confirmMAC(user, form, b[:8]))
	return base64.RawURLEncoding.EncodeToString(b[:])
}

func (c *Console) confirmMAC(user string, form url.Values, expires []byte) []byte {
	m := hmac.New(sha256.New, c.cfg.CSRFKey)
	field := func(s string) {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(s)))
		m.Write(n[:])
		m.Write([]byte(s))
	}
	field("stagehand console confirmation")
	field(string(expires))
	field(user)
	field(c.scopeName())
	keys := make([]string, 0, len(form))
	for k := range form {
		if !unsigned[k] {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		field(k)
		field(strconv.Itoa(len(form[k])))
		for _, v := range form[k] {
			field(v)
		}
	}
	return m.Sum(nil)
}

var (
	errConfirmMissing = errors.New("the action was not confirmed: it carries no confirmation (confirm it first)")
	errConfirmInvalid = errors.New("the action does not match its confirmation: what was confirmed (action, " +
		"filter, bound, count) was changed (confirm it again)")
	errConfirmExpired = errors.New("the confirmation has expired (confirm the action again)")
)

// checkConfirmation verifies that form is what /confirm showed user, within the confirmation's lifetime.
func (c *Console) checkConfirmation(token, user string, form url.Values, now time.Time) error {
	if token == "" {
		return errConfirmMissing
	}
	b, err := base64.RawURLEncoding.Strict().DecodeString(token) // one text per token
	if err != nil || len(b) != 8+sha256.Size {
		return errConfirmInvalid
	}
	if !hmac.Equal(b[8:], c.confirmMAC(user, form, b[:8])) {
		return errConfirmInvalid
	}
	if expires := time.Unix(int64(binary.BigEndian.Uint64(b[:8])), 0); !now.Before(expires) {
		return errConfirmExpired
	}
	return nil
}
