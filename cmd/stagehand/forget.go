package main

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/stagehand-es/stagehand/shred"
)

type forgetJSON struct {
	Schema   string `json:"schema"`
	Subject  string `json:"subject"`
	Versions []int  `json:"versions"`
	Actor    string `json:"actor"`
	Reason   string `json:"reason"`
}

func (a *app) forgetCommand() *cobra.Command {
	var subjects []string
	var actor, reason string
	c := &cobra.Command{
		Use:   "forget --subject ID...",
		Short: "Crypto-shred subjects: delete every key of their personal data, with an audit record",
		Long: `Forget subjects whose personal data package shred encrypts: every version of each subject's key is
deleted from the shred_keys table and the forget is recorded in shred_audit (who, why, which versions), in one
transaction per subject. From then on their personal fields read as redacted values ("[forgotten]" for strings,
the zero value otherwise) in loads, projections, rebuilds, redrives and the console, never as an error.
Processes that cached a key read on for at most their codec's CacheTTL (default 5s). Messages already delivered
to a broker or a consumer are out of stagehand's reach. A subject without keys is recorded as forgotten all the
same.`,
		Example: `  stagehand forget --subject customer-42 --reason "erasure request 2026-118"
  stagehand forget --subject c-1 --subject c-2 --actor alice --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if len(subjects) == 0 {
				return usageErrorf("--subject is required")
			}
			for _, s := range subjects {
				if err := shred.CheckSubject(s); err != nil {
					return usageErrorf("--subject %q: %w", s, err)
				}
			}
			if strings.TrimSpace(actor) == "" {
				actor = a.opts.getenv("USER")
			}
			if strings.TrimSpace(actor) == "" {
				actor = "stagehand-cli"
			}
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			keys, err := shred.NewPostgresKeyStore(pool, &shred.PostgresConfig{Schema: a.schema})
			if err != nil {
				return err
			}
			var out []forgetJSON
			for _, s := range slices.Compact(slices.Sorted(slices.Values(subjects))) {
				versions, err := keys.Forget(ctx, s, shred.Audit{Actor: actor, Reason: reason})
				if err != nil {
					return fmt.Errorf("forget (after %d of %d subjects): %w", len(out), len(subjects), a.dbError(err))
				}
				out = append(out, forgetJSON{Schema: a.schema, Subject: s, Versions: versions, Actor: actor,
					Reason: reason})
			}
			if a.json {
				return a.writeJSON(out)
			}
			for _, f := range out {
				deleted := "no key to delete"
				if len(f.Versions) > 0 {
					vs := make([]string, len(f.Versions))
					for i, v := range f.Versions {
						vs[i] = strconv.Itoa(v)
					}
					deleted = "deleted key version(s) " + strings.Join(vs, ", ")
				}
				if err := a.printf("Forgot subject %s: %s; recorded in the audit.\n", f.Subject, deleted); err != nil {
					return err
				}
			}
			return nil
		},
	}
	f := c.Flags()
	f.StringArrayVar(&subjects, "subject", nil, "the subject's ID, as its events' subject field holds it (repeatable)")
	f.StringVar(&actor, "actor", "", "who asks, for the audit record (default: $USER, else stagehand-cli)")
	f.StringVar(&reason, "reason", "", "why, for the audit record (a ticket, a request's reference)")
	return c
}
