package aggregate

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
)

// Validate returns Err's registration errors joined with those of the upcaster chains, or nil. It is meant for a
// complete registry (registration order is free, so a chain may only be whole once every part is registered):
// NewRepository and projection.New call it and refuse a registry it rejects, so a gap in a chain shows when the
// program starts rather than when an old event is first loaded. A chain is checked for:
//
//   - a missing version: an event registered at Version(n) with upcasters for some older versions needs one for
//     every version from 1 to n-1 (a renamed event's old name, every version from 1 to its highest upcaster);
//   - a dead end: each upcaster's result must be a registered event type or the input of another upcaster (not
//     checkable when the upcaster returns an interface);
//   - a loop: following the results must reach a registered event type.
//
// Every error names the event type and the version, and matches ErrRegistration.
func (r *Registry) Validate() error {
	r.mu.RLock()
	defer r.mu.RUnlock()
	errs := slices.Clone(r.errs)

	versions := map[string][]int{} // stored name -> versions with an upcaster
	for k := range r.upcasters {
		versions[k.name] = append(versions[k.name], k.version)
	}
	names := make([]string, 0, len(versions))
	for name := range versions {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		vs := versions[name]
		slices.Sort(vs)
		last, why := vs[len(vs)-1], fmt.Sprintf("its upcasters go up to version %d", vs[len(vs)-1])
		if et := r.events[name]; et != nil {
			last, why = et.version-1, fmt.Sprintf("it is at version %d", et.version)
		}
		for v := 1; v <= last; v++ {
			if _, ok := r.upcasters[upcastKey{name, v}]; !ok {
				errs = append(errs, fmt.Errorf("%w: the upcaster chain of event %q has a gap: %s, so every "+
					"older version needs an upcaster, and version %d has none", ErrRegistration, name, why, v))
			}
		}
		for _, v := range vs {
			if err := r.checkChain(r.upcasters[upcastKey{name, v}]); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// checkChain follows u's results to a registered event type.
func (r *Registry) checkChain(u *upcaster) error {
	seen := map[*upcaster]bool{}
	for cur := u; ; {
		if cur.out.Kind() == reflect.Interface {
			return nil // decided at run time
		}
		if _, ok := r.eventTypes[cur.out]; ok {
			return nil
		}
		next := r.upByInput[cur.out]
		if next == nil {
			return fmt.Errorf("%w: the upcaster chain of event %q version %d ends at %s (from the upcaster of "+
				"%q version %d), which is neither a registered event type nor the input of another upcaster",
				ErrRegistration, u.key.name, u.key.version, cur.out, cur.key.name, cur.key.version)
		}
		if seen[next] {
			return fmt.Errorf("%w: the upcaster chain of event %q version %d loops back to the upcaster of %q "+
				"version %d", ErrRegistration, u.key.name, u.key.version, next.key.name, next.key.version)
		}
		seen[cur] = true
		cur = next
	}
}
