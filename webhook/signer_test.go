package webhook_test

import (
	"net/http"
	"strconv"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/webhook"
)

// The example the Standard Webhooks specification and its reference
// libraries publish: this secret, id, timestamp and body sign to this.
const (
	specSecret    = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	specID        = "msg_p5jXN8AQM9LWM0D4loKWxJek"
	specTimestamp = 1614265330
	specBody      = `{"test": 2432232314}`
	specSignature = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
)

func TestSignMatchesTheSpecExample(t *testing.T) {
	s, err := webhook.NewSigner(specSecret)
	require.NoError(t, err)
	require.Equal(t, specSignature, s.Sign(specID, time.Unix(specTimestamp, 0), []byte(specBody)))
}

// TestReferenceLibraryVerifiesWhatWeSign signs fresh messages under fresh
// secrets and has the specification's own Go library verify them, and the
// reverse.
func TestReferenceLibraryVerifiesWhatWeSign(t *testing.T) {
	for i := range 20 {
		secret := webhook.NewSecret()
		require.NoError(t, webhook.ValidSecret(secret))
		s, err := webhook.NewSigner(secret)
		require.NoError(t, err)
		ref, err := standardwebhooks.NewWebhook(secret)
		require.NoError(t, err)

		id, now := "msg_"+strconv.Itoa(i), time.Now()
		body := []byte(`{"type":"sale.committed","data":{"n":` + strconv.Itoa(i) + `}}`)
		sig := s.Sign(id, now, body)
		hdr := http.Header{}
		hdr.Set(webhook.HeaderID, id)
		hdr.Set(webhook.HeaderTimestamp, strconv.FormatInt(now.Unix(), 10))
		hdr.Set(webhook.HeaderSignature, sig)
		require.NoError(t, ref.Verify(body, hdr))

		refSig, err := ref.Sign(id, now, body)
		require.NoError(t, err)
		require.Equal(t, refSig, sig)
		require.NoError(t, s.Verify(id, strconv.FormatInt(now.Unix(), 10), "v1,bogus "+refSig, body, now, 5*time.Minute))
		require.Error(t, s.Verify(id, strconv.FormatInt(now.Unix(), 10), refSig, append(body, ' '), now, 5*time.Minute), "a changed body")
		require.Error(t, s.Verify(id, strconv.FormatInt(now.Add(-10*time.Minute).Unix(), 10), s.Sign(id, now.Add(-10*time.Minute), body), body, now, 5*time.Minute), "an old timestamp")
	}
}

func TestSecretsAreChecked(t *testing.T) {
	for _, bad := range []string{"", "whsec_", "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_c2hvcnQ=", "whsec_!!!!", "whsec_" + string(make([]byte, 200))} {
		require.ErrorIs(t, webhook.ValidSecret(bad), webhook.ErrBadSecret, bad)
	}
	require.NoError(t, webhook.ValidSecret(specSecret))
	require.NotEqual(t, webhook.NewSecret(), webhook.NewSecret())
}
