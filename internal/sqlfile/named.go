package sqlfile

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"
)

// Named is a statement written with named parameters, @name, bound to the fields of a parameter struct P: each
// field tagged `sql:"name"` is the parameter of that name. Bind numbers the parameters the statement uses in the
// order of their first use ($1, $2, ...), once; Args then lists a P's values in that order. A statement's variants
// (fragments in or out) use different subsets of P's parameters, and each gets exactly the arguments it uses.
type Named[P any] struct {
	// SQL is the statement with its parameters numbered.
	SQL    string
	fields []int // the field of P for each numbered parameter
}

// Bind numbers the @name parameters of stmt and binds them to P's fields. A name that no field of P carries is an
// error, so a renamed field or a misspelt parameter fails where the statement is written out, not at its first
// run. An @ that is not followed by a letter (the operators @>, <@, @@) is left alone, as is anything within single
// quotes.
func Bind[P any](stmt string) (Named[P], error) {
	t := reflect.TypeFor[P]()
	if t.Kind() != reflect.Struct {
		return Named[P]{}, fmt.Errorf("sqlfile: parameters of %s: not a struct", t)
	}
	byName := map[string]int{}
	for i := range t.NumField() {
		if name := t.Field(i).Tag.Get("sql"); name != "" {
			byName[name] = i
		}
	}
	var out strings.Builder
	numbers := map[string]int{}
	var fields []int
	quoted := false
	for i := 0; i < len(stmt); i++ {
		c := stmt[i]
		if c == '\'' {
			quoted = !quoted
		}
		if c != '@' || quoted || i+1 >= len(stmt) || !isLetter(stmt[i+1]) {
			out.WriteByte(c)
			continue
		}
		j := i + 1
		for j < len(stmt) && (isLetter(stmt[j]) || stmt[j] == '_' || stmt[j] >= '0' && stmt[j] <= '9') {
			j++
		}
		name := stmt[i+1 : j]
		n, ok := numbers[name]
		if !ok {
			field, known := byName[name]
			if !known {
				return Named[P]{}, fmt.Errorf("sqlfile: parameter @%s: %s has no field tagged sql:%q", name, t, name)
			}
			fields = append(fields, field)
			n = len(fields)
			numbers[name] = n
		}
		out.WriteString("$" + strconv.Itoa(n))
		i = j - 1
	}
	return Named[P]{SQL: out.String(), fields: fields}, nil
}

// Args returns p's values of the statement's parameters, in their numbered order.
func (n Named[P]) Args(p *P) []any {
	v := reflect.ValueOf(p).Elem()
	args := make([]any, len(n.fields))
	for i, f := range n.fields {
		args[i] = v.Field(f).Interface()
	}
	return args
}

func isLetter(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }
