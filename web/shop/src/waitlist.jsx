// The waitlist of a sold-out SKU: "Notify me" joins it (joinWaitlist), the
// buyer's position comes live over waitlistChanged, and a unit that comes
// back (a cancel, an expiry, a restock) arrives as a HELD reservation, which
// the card shows as a hold with its countdown.
import { useEffect, useState } from 'react';
import { useClient, useSubscription } from 'urql';
import { JOIN_WAITLIST, LEAVE_WAITLIST, WAITLIST } from './api.js';

// OFFER_HOLD_SECONDS is how long a unit handed over from the waitlist is
// held for the buyer.
const OFFER_HOLD_SECONDS = 300;

// WaitlistPanel is shown on a sold-out card (and while the buyer waits).
// entry is the buyer's entry as the page last saw it (null: not in line);
// onEntry reports every new state of it, onOffer the reservation of an
// offer.
export function WaitlistPanel({ sku, signedIn, entry, onEntry, onOffer }) {
  const client = useClient();
  const [busy, setBusy] = useState(false);
  const [message, setMessage] = useState(null);
  const waiting = entry?.status === 'WAITING';

  // Once in line, the server pushes every change of the entry: the position
  // as waiters ahead are served or leave, then the offer.
  useSubscription({ query: WAITLIST, variables: { sku }, pause: !waiting }, (_, d) => {
    onEntry(d.waitlistChanged);
    return d;
  });

  useEffect(() => {
    if (entry?.status === 'OFFERED' && entry.reservation?.status === 'HELD') onOffer(entry.reservation);
  }, [entry?.status, entry?.reservation?.token]); // eslint-disable-line react-hooks/exhaustive-deps

  const join = async () => {
    setBusy(true);
    setMessage(null);
    const res = await client
      .mutation(JOIN_WAITLIST, { input: { sku, quantity: 1, holdSeconds: OFFER_HOLD_SECONDS } })
      .toPromise();
    setBusy(false);
    const payload = res.data?.joinWaitlist;
    if (!payload) {
      // Joining twice returns the same entry: pressing again is safe.
      setMessage('Could not reach the shop: try again.');
      return;
    }
    const ue = payload.userErrors[0];
    if (ue) {
      setMessage(waitlistRefusal(ue));
      return;
    }
    onEntry(payload.entry);
  };

  const leave = async () => {
    setBusy(true);
    const res = await client.mutation(LEAVE_WAITLIST, { input: { sku } }).toPromise();
    setBusy(false);
    const payload = res.data?.leaveWaitlist;
    if (payload && !payload.userErrors.length) onEntry(payload.entry);
    else setMessage('Could not leave the line: try again.');
  };

  return (
    <div className="waitlist-slot" data-testid={`waitlist-${sku}`} data-state={waiting ? 'waiting' : 'out'}>
      {waiting ? (
        <>
          <p className="waitlist-line" aria-live="polite">
            <span className="waitlist-pos" data-testid={`waitlist-position-${sku}`} data-position={entry.position ?? ''}>
              {entry.position != null ? `You are #${entry.position} in line` : 'You are in line'}
            </span>
            <span className="waitlist-hint">
              {entry.position === 1
                ? 'The next unit that comes back is yours: it will be held for you here.'
                : 'Units that expire, are cancelled or restocked go to the line in order: keep this page open.'}
            </span>
          </p>
          <button type="button" className="btn ghost small" data-testid={`waitlist-leave-${sku}`} disabled={busy} onClick={leave}>
            Leave the line
          </button>
        </>
      ) : (
        <>
          <p className="waitlist-line">
            Sold out for now. Holds that expire or are cancelled come back: queue for a returned unit and it is held
            for you the moment it does.
          </p>
          <button
            type="button"
            className="btn ghost small"
            data-testid={`waitlist-join-${sku}`}
            disabled={!signedIn || busy}
            onClick={join}
          >
            {signedIn ? (busy ? 'Joining…' : 'Notify me: queue for a returned unit') : 'Sign in to queue'}
          </button>
        </>
      )}
      {message && (
        <p className="status status-warn" role="status">
          {message}
        </p>
      )}
    </div>
  );
}

function waitlistRefusal(ue) {
  switch (ue.code) {
    case 'QUOTA_EXCEEDED':
      return 'You already have your limit of this product: there is nothing to queue for.';
    case 'WAITLIST_FULL':
      return 'The line is full right now.';
    case 'SALE_NOT_ACTIVE':
      return 'This sale is not open.';
    case 'RATE_LIMITED':
      return `Too many tries: wait ${ue.retryAfterSeconds ?? 1}s, then try again.`;
    default:
      return ue.message;
  }
}
