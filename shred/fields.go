package shred

import (
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
)

// TagKey is the struct tag key that marks personal data: `stagehand:"pii,subject=CustomerID"`.
const TagKey = "stagehand"

// ErrInvalidTag is matched by the error of a type whose stagehand struct tags cannot be followed: an unknown
// option, a personal field without subject=, or a subject that names no field of the struct.
var ErrInvalidTag = errors.New("shred: invalid stagehand struct tag")

// typeInfo is what the codec knows of a Go type: its fields by JSON name, which of them are personal data, and
// whether the type holds personal data anywhere inside it.
type typeInfo struct {
	err    error
	hasPII bool
	// For structs: every encoded field by JSON name (and lower-cased, as encoding/json matches names on decode).
	fields map[string]reflect.Type
	lower  map[string]reflect.Type
	// For structs: the fields that are personal data or hold some.
	plan []planField
}

type planField struct {
	name    string // JSON name
	goName  string
	typ     reflect.Type
	pii     bool
	subject string // JSON name of the subject field, for a personal field
	subjGo  string
}

// infos caches typeInfo by type; it is per Codec, so no state is shared between codecs.
type infos struct {
	m sync.Map // reflect.Type → *typeInfo
}

// get returns t's information (pointers followed).
func (in *infos) get(t reflect.Type) *typeInfo {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil {
		return &typeInfo{}
	}
	if v, ok := in.m.Load(t); ok {
		return v.(*typeInfo)
	}
	info := in.build(t, map[reflect.Type]bool{})
	v, _ := in.m.LoadOrStore(t, info)
	return v.(*typeInfo)
}

// build computes t's information; visiting breaks cycles of recursive types.
func (in *infos) build(t reflect.Type, visiting map[reflect.Type]bool) *typeInfo {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if v, ok := in.m.Load(t); ok {
		return v.(*typeInfo)
	}
	if visiting[t] {
		// A recursive type: its own build decides; meanwhile assume it may hold personal data, so a field that
		// leads back to it is walked (never skipped).
		return &typeInfo{hasPII: true}
	}
	visiting[t] = true
	defer delete(visiting, t)
	info := &typeInfo{}
	switch t.Kind() {
	case reflect.Slice, reflect.Array, reflect.Map:
		if t.Kind() == reflect.Map && t.Key().Kind() != reflect.String && !t.Key().Implements(textMarshaler) {
			break
		}
		e := in.build(t.Elem(), visiting)
		info.err, info.hasPII = e.err, e.hasPII
	case reflect.Struct:
		in.buildStruct(t, info, visiting)
	}
	if len(visiting) == 1 { // only complete results are cached
		in.m.Store(t, info)
	}
	return info
}

var textMarshaler = reflect.TypeFor[encoding.TextMarshaler]()

type rawField struct {
	name, goName string
	typ          reflect.Type
	tag          string
	depth        int
}

func (in *infos) buildStruct(t reflect.Type, info *typeInfo, visiting map[reflect.Type]bool) {
	var all []rawField
	collect(t, 0, &all, map[reflect.Type]bool{})
	info.fields = map[string]reflect.Type{}
	info.lower = map[string]reflect.Type{}
	byGo := map[string]rawField{}
	var kept []rawField
	for _, f := range all { // outer fields first: a shallower field hides a promoted one of the same name
		if _, dup := info.fields[f.name]; dup {
			continue
		}
		info.fields[f.name] = f.typ
		if _, ok := info.lower[strings.ToLower(f.name)]; !ok {
			info.lower[strings.ToLower(f.name)] = f.typ
		}
		if _, ok := byGo[f.goName]; !ok {
			byGo[f.goName] = f
		}
		kept = append(kept, f)
	}
	var errs []error
	for _, f := range kept {
		pf := planField{name: f.name, goName: f.goName, typ: f.typ}
		if f.tag != "" {
			opts := strings.Split(f.tag, ",")
			if opts[0] != "pii" {
				errs = append(errs, fmt.Errorf("%w: %s.%s: %q (want `stagehand:\"pii,subject=Field\"`)",
					ErrInvalidTag, t, f.goName, f.tag))
				continue
			}
			for _, o := range opts[1:] {
				name, ok := strings.CutPrefix(o, "subject=")
				if !ok || name == "" || pf.subjGo != "" {
					errs = append(errs, fmt.Errorf("%w: %s.%s: option %q (want subject=Field, once)",
						ErrInvalidTag, t, f.goName, o))
					continue
				}
				pf.subjGo = name
			}
			if pf.subjGo == "" {
				errs = append(errs, fmt.Errorf("%w: %s.%s is personal data without a subject: write "+
					"`stagehand:\"pii,subject=Field\"` naming the field that holds the subject's ID", ErrInvalidTag, t,
					f.goName))
				continue
			}
			subj, ok := byGo[pf.subjGo]
			switch {
			case !ok:
				errs = append(errs, fmt.Errorf("%w: %s.%s: subject %q is not an encoded field of %s",
					ErrInvalidTag, t, f.goName, pf.subjGo, t))
				continue
			case subj.tag != "":
				errs = append(errs, fmt.Errorf("%w: %s.%s: subject %q is itself personal data: a subject's ID "+
					"stays in clear to find its key", ErrInvalidTag, t, f.goName, pf.subjGo))
				continue
			}
			pf.pii, pf.subject = true, subj.name
			info.plan = append(info.plan, pf)
			continue
		}
		sub := in.build(f.typ, visiting)
		if sub.err != nil {
			errs = append(errs, sub.err)
		}
		if sub.hasPII {
			info.plan = append(info.plan, pf)
		}
	}
	info.err = errors.Join(errs...)
	info.hasPII = len(info.plan) > 0
}

// collect lists the fields encoding/json encodes for struct t, promoting the fields of embedded structs.
func collect(t reflect.Type, depth int, out *[]rawField, seen map[reflect.Type]bool) {
	if seen[t] {
		return
	}
	seen[t] = true
	defer delete(seen, t)
	var embedded []reflect.StructField
	for i := range t.NumField() {
		sf := t.Field(i)
		jsonTag := sf.Tag.Get("json")
		if jsonTag == "-" {
			continue
		}
		name, _, _ := strings.Cut(jsonTag, ",")
		ft := sf.Type
		if sf.Anonymous && name == "" {
			et := ft
			if et.Kind() == reflect.Pointer {
				et = et.Elem()
			}
			if et.Kind() == reflect.Struct {
				embedded = append(embedded, sf)
				continue
			}
		}
		if !sf.IsExported() {
			continue
		}
		if name == "" {
			name = sf.Name
		}
		*out = append(*out, rawField{name: name, goName: sf.Name, typ: ft, tag: sf.Tag.Get(TagKey), depth: depth})
	}
	for _, sf := range embedded {
		et := sf.Type
		if et.Kind() == reflect.Pointer {
			et = et.Elem()
		}
		collect(et, depth+1, out, seen)
	}
}

// child returns the type a JSON value under key has inside a value of type t, or nil when unknown.
func (in *infos) child(t reflect.Type, key string) reflect.Type {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil {
		return nil
	}
	switch t.Kind() {
	case reflect.Map:
		return t.Elem()
	case reflect.Struct:
		info := in.get(t)
		if ft, ok := info.fields[key]; ok {
			return ft
		}
		return info.lower[strings.ToLower(key)]
	}
	return nil
}

// elem returns the element type of a JSON array inside a value of type t, or nil.
func elem(t reflect.Type) reflect.Type {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t != nil && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
		return t.Elem()
	}
	return nil
}

var (
	jsonUnmarshaler = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// redacted returns the JSON a forgotten field of type t reads as: the string Redacted for a plain string type,
// null (the zero value) for everything else.
func redacted(t reflect.Type) json.RawMessage {
	if t != nil && t.Kind() == reflect.String {
		pt := reflect.PointerTo(t)
		if !t.Implements(jsonUnmarshaler) && !pt.Implements(jsonUnmarshaler) && !t.Implements(textUnmarshaler) &&
			!pt.Implements(textUnmarshaler) {
			return redactedString
		}
	}
	return jsonNull
}

var (
	redactedString = json.RawMessage(`"` + Redacted + `"`)
	jsonNull       = json.RawMessage("null")
)
