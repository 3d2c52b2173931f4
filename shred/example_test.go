package shred_test

import (
	"context"
	"fmt"
	"strings"

	"github.com/stagehand-es/stagehand/aggregate"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/shred"
)

// AccountOpened carries personal data: the holder's name and email, encrypted with the key of the subject its
// HolderID names. HolderID and Currency stay in clear.
type AccountOpened struct {
	HolderID string
	Name     string `stagehand:"pii,subject=HolderID"`
	Email    string `stagehand:"pii,subject=HolderID"`
	Currency string
}

// Plug the codec into the registry: every event it encodes has its personal fields encrypted, and every load,
// projection and staged message decodes them. Forgetting the subject deletes its keys: the same stored payload
// then reads as redacted, without an error.
func Example() {
	ctx := context.Background()
	keys := shred.NewMemoryKeyStore() // in production: shred.NewPostgresKeyStore(pool, nil)
	codec, err := shred.NewCodec(keys, nil)
	if err != nil {
		panic(err)
	}
	reg := aggregate.NewRegistry(&aggregate.RegistryConfig{Codec: codec})
	if err := aggregate.RegisterEvent[AccountOpened](reg, "account.opened"); err != nil {
		panic(err)
	}
	if err := codec.Check(AccountOpened{}); err != nil { // the tags, checked at start-up
		panic(err)
	}

	name, version, payload, err := reg.Encode(AccountOpened{HolderID: "holder-42", Name: "Ada Lovelace",
		Email: "ada@example.com", Currency: "EUR"})
	if err != nil {
		panic(err)
	}
	fmt.Println("stored in clear:", strings.Contains(string(payload), "ada@example.com"))
	stored := eventstore.Record{StreamID: "acc-1", Type: name, TypeVersion: version, Payload: payload}

	ev, err := reg.Decode(stored)
	if err != nil {
		panic(err)
	}
	fmt.Printf("%+v\n", ev)

	if _, err := codec.Forget(ctx, "holder-42", shred.Audit{Actor: "dpo", Reason: "erasure request"}); err != nil {
		panic(err)
	}
	ev, err = reg.Decode(stored)
	if err != nil {
		panic(err)
	}
	fmt.Printf("%+v\n", ev)
	// Output:
	// stored in clear: false
	// {HolderID:holder-42 Name:Ada Lovelace Email:ada@example.com Currency:EUR}
	// {HolderID:holder-42 Name:[forgotten] Email:[forgotten] Currency:EUR}
}
