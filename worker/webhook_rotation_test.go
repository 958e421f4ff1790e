package worker

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/webhooktest"
	"github.com/dropline/dropline/webhook"
)

// TestWebhookSecretRotation: a new secret keeps the one it replaces
// signing beside it (webhook-signature "v1,<new> v1,<old>"), so a receiver
// verifying with either secret (the Standard Webhooks library) accepts
// every delivery during the overlap; once the overlap is over only the new
// secret signs, and a receiver still on the old one refuses until it moves.
func TestWebhookSecretRotation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	oldSecret, newSecret := webhook.NewSecret(), webhook.NewSecret()
	recv := webhooktest.New(t, oldSecret, nil)
	e := b.subscribe(t, recv.URL, oldSecret)
	b.product(t, "ROTATE-1", 10)
	d, _ := b.startDispatcher(t, fastWebhooks("rotator"))

	svc := webhook.NewService(b.engine.Ledger())
	began := time.Now()
	rotated, err := svc.UpdateEndpoint(b.ctx, admin, strconv.FormatInt(e.ID, 10), webhook.EndpointUpdate{Secret: &newSecret})
	require.NoError(t, err)
	require.Equal(t, newSecret, rotated.Secret)
	require.Equal(t, oldSecret, rotated.PreviousSecret)
	require.NotNil(t, rotated.PreviousSecretUntil)
	require.WithinDuration(t, began.Add(webhook.SecretOverlap), *rotated.PreviousSecretUntil, time.Minute)
	require.Equal(t, []string{newSecret, oldSecret}, rotated.Secrets(time.Now()))

	// During the overlap: a receiver on the old secret, then on the new one.
	b.sell(t, "ROTATE-1", 1)
	b.waitSettled(t, e.ID, 10*time.Second, d)
	recv.SetSecret(t, newSecret)
	b.sell(t, "ROTATE-1", 1)
	b.waitSettled(t, e.ID, 10*time.Second, d)
	require.Empty(t, recv.BadSignatures(), "both secrets sign during the overlap")
	require.Len(t, recv.Accepted(), 2)

	// After it: the old secret signs no more.
	_, err = b.pool.Exec(b.ctx, `UPDATE webhook_endpoints SET previous_secret_until = now() - interval '1 second' WHERE id = $1`, e.ID)
	require.NoError(t, err)
	recv.SetSecret(t, oldSecret)
	b.sell(t, "ROTATE-1", 1)
	waitUntil(t, 10*time.Second, "the receiver on the old secret refuses", func() bool { return len(recv.BadSignatures()) > 0 },
		d.attempted.C())
	recv.SetSecret(t, newSecret)
	b.waitSettled(t, e.ID, 10*time.Second, d)
	require.Len(t, recv.Accepted(), 3, "delivered once the receiver moved to the new secret")

	// A secret set again to itself, or another field changed, keeps the rotation as it was.
	again, err := svc.UpdateEndpoint(b.ctx, admin, strconv.FormatInt(e.ID, 10), webhook.EndpointUpdate{Secret: &newSecret})
	require.NoError(t, err)
	require.Equal(t, oldSecret, again.PreviousSecret)
	require.Equal(t, []string{newSecret}, again.Secrets(time.Now()))
}
