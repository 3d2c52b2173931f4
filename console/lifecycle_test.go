package console_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/eventstore"
)

// TestStreamPageShowsTheLifecycle: an archived stream's page says so, with who archived it, when and why, beside
// its events (read from the archive); a deleted stream's page shows its deletion record instead of "no stream", and
// none of its events; an active stream's page shows no lifecycle.
func TestStreamPageShowsTheLifecycle(t *testing.T) {
	t.Parallel()
	w := newWorld(t, nil)
	ctx := context.Background()
	w.appendEvents("acme", "kept", 2, nil)
	w.appendEvents("acme", "shelved", 3, func(int) string { return `{"shelved":"yes"}` })
	w.appendEvents("acme", "erased", 2, func(int) string { return `{"secret":"Ada Lovelace"}` })
	_, err := w.store.ArchiveStream(ctx, eventstore.LifecycleRequest{Tenant: "acme", StreamID: "shelved",
		Actor: "ops-anna", Reason: "order closed <b>2024</b>"})
	require.NoError(t, err)
	_, err = w.store.DeleteStream(ctx, eventstore.LifecycleRequest{Tenant: "acme", StreamID: "erased",
		Actor: "dpo-bob", Reason: "erasure request 4711"})
	require.NoError(t, err)

	page := w.page("/events?stream=kept&tenant=acme")
	require.NotContains(t, page, `id="lifecycle"`)

	page = w.page("/events?stream=shelved&tenant=acme")
	require.Contains(t, page, `<strong class="state">archived</strong>`)
	require.Contains(t, page, "ops-anna")
	require.Contains(t, page, "order closed &lt;b&gt;2024&lt;/b&gt;", "the reason is escaped")
	require.Contains(t, page, "3 moved out of the hot table")
	require.Contains(t, page, `&#34;shelved&#34;: &#34;yes&#34;`, "its events, read from the archive")

	code, page := w.get("/events?stream=erased&tenant=acme")
	require.Equal(t, http.StatusOK, code, page)
	require.Contains(t, page, `<strong class="state">deleted</strong>`)
	require.Contains(t, page, "dpo-bob")
	require.Contains(t, page, "erasure request 4711")
	require.Contains(t, page, `href="/events?position=`, "a link to the deletion marker")
	require.NotContains(t, page, "Lovelace")

	code, _ = w.get("/events?stream=never&tenant=acme")
	require.Equal(t, http.StatusNotFound, code)
}
