// A product sold by draw: enter (enterDraw) while entries are open, a
// countdown to the draw, the SHA-256 of the seed published before anyone
// entered, then the outcome: won (a hold to pay, which the card shows) or
// lost, with the revealed seed and how anyone can check the result. The
// entrant's result is pushed (myDrawEntryChanged) the moment the draw has
// been carried out.
import { useContext, useEffect, useRef, useState } from 'react';
import { useClient, useSubscription } from 'urql';
import { DRAW_INFO, ENTER_DRAW, LiveContext, MY_DRAW_ENTRIES, MY_DRAW_ENTRY, TokenContext, poll } from './api.js';
import { formatClock, formatLeft, useNow } from './clock.js';
import { SeedProof } from './seedproof.jsx';

// DrawPanel is the card's buying part for a draw product. entry is the
// buyer's entry as the page last saw it (null: not entered).
export function DrawPanel({ product, signedIn, entry, onEntry, onWon, holding }) {
  const client = useClient();
  const token = useContext(TokenContext);
  const socketUp = useContext(LiveContext);
  const now = useNow(1000);
  const sku = product.sku;
  const [draw, setDraw] = useState(product.draw);
  const [busy, setBusy] = useState(false);
  const [message, setMessage] = useState(null);
  const closesAt = new Date(draw.closesAt).getTime();
  const closed = now >= closesAt;
  const drawn = draw.status === 'DRAWN';
  // Until the outcome has reached the stock, a winner has no reservation yet.
  const pending = !!entry && (entry.status === 'ENTERED' || (entry.status === 'WON' && !entry.reservation));

  // The buyer's entry is pushed: first as it is, then its result once the
  // draw has been carried out (a winner's hold made, every loser queued).
  const [{ error: subError }] = useSubscription(
    { query: MY_DRAW_ENTRY, variables: { sku }, pause: !(signedIn && pending) },
    (_, d) => {
      onEntry(d.myDrawEntryChanged);
      return d;
    },
  );
  const pushed = socketUp && !subError;

  // The draw itself (its entries, then its seed and winners) has no
  // subscription: the page asks for it every few seconds until it is
  // drawn, every second once the entries have closed, and at once when the
  // buyer's result arrives. Without the websocket it asks for the buyer's
  // entry too. One ask at a time: a poll is sent only once the last one
  // has been answered.
  const wantDraw = !drawn;
  const wantEntry = signedIn && pending && (closed || drawn) && !pushed;
  const settled = entry?.status === 'WON' || entry?.status === 'LOST';
  const inFlight = useRef(Promise.resolve());
  useEffect(() => {
    if (!wantDraw && !wantEntry) return undefined;
    let stop = false;
    let timer;
    const tick = async () => {
      if (wantDraw) {
        const d = (await poll(token, DRAW_INFO, { sku }))?.product?.draw;
        if (d && !stop) setDraw(d);
      }
      if (wantEntry && !stop) {
        const mine = (await poll(token, MY_DRAW_ENTRIES, {}))?.myDrawEntries?.find((e) => e.sku === sku);
        if (mine && !stop) onEntry(mine);
      }
    };
    const next = () => {
      timer = setTimeout(() => {
        inFlight.current = inFlight.current.then(() => (stop ? undefined : tick())).catch(() => {});
        inFlight.current.then(() => !stop && next());
      }, closed ? 1000 : 5000);
    };
    next();
    return () => {
      stop = true;
      clearTimeout(timer);
    };
  }, [wantDraw, wantEntry, closed, sku, token]); // eslint-disable-line react-hooks/exhaustive-deps

  useEffect(() => {
    if (!settled || drawn) return undefined;
    let stop = false;
    inFlight.current = inFlight.current
      .then(async () => {
        const d = stop ? null : (await poll(token, DRAW_INFO, { sku }))?.product?.draw;
        if (d && !stop) setDraw(d);
      })
      .catch(() => {});
    return () => {
      stop = true;
    };
  }, [settled]); // eslint-disable-line react-hooks/exhaustive-deps

  useEffect(() => {
    if (entry?.status === 'WON' && entry.reservation?.status === 'HELD') onWon(entry.reservation);
  }, [entry?.status, entry?.reservation?.token]); // eslint-disable-line react-hooks/exhaustive-deps

  const enter = async () => {
    setBusy(true);
    setMessage(null);
    const res = await client.mutation(ENTER_DRAW, { input: { sku, quantity: 1 } }).toPromise();
    setBusy(false);
    const payload = res.data?.enterDraw;
    if (!payload) {
      // Entering again returns the same entry: pressing again is safe.
      setMessage('Could not reach the shop: try again.');
      return;
    }
    const ue = payload.userErrors[0];
    if (ue) {
      setMessage(
        ue.code === 'SALE_NOT_ACTIVE' ? 'Entries are closed.' : ue.code === 'RATE_LIMITED' ? 'Too many tries: wait a moment.' : ue.message,
      );
      return;
    }
    onEntry(payload.entry);
    setDraw((d) => ({ ...d, entries: Math.max(d.entries, 1) }));
  };

  const state = !entry ? (closed ? 'closed' : 'open') : entry.status === 'WON' ? 'won' : entry.status === 'LOST' ? 'lost' : closed ? 'drawing' : 'entered';

  return (
    <div className="draw" data-testid={`draw-${sku}`}>
      <div className="draw-head">
        <span className="draw-badge">Draw</span>
        <span className="draw-when">
          {'Drawn at '}
          <time dateTime={draw.closesAt}>{formatClock(closesAt)}</time>
          {!closed && (
            <>
              {' · in '}
              <span className="countdown small" data-testid={`draw-countdown-${sku}`} role="timer">
                {formatLeft(closesAt - now)}
              </span>
            </>
          )}
        </span>
      </div>
      <p className="draw-status" data-testid={`draw-status-${sku}`} data-state={state} aria-live="polite">
        {drawText(state, entry, draw, product, holding)}
      </p>
      {!entry && !closed && (
        <button type="button" className="btn primary wide" data-testid={`draw-enter-${sku}`} disabled={!signedIn || busy} onClick={enter}>
          {signedIn ? (busy ? 'Entering…' : 'Enter the draw') : 'Sign in to enter'}
        </button>
      )}
      {message && (
        <p className="status status-warn" role="status">
          {message}
        </p>
      )}
      <SeedProof
        kind="draw"
        id={sku}
        seedHash={draw.seedHash}
        seed={draw.seed}
        open={!!draw.seed}
        summary={draw.seed ? 'The draw is fair: check it' : 'How the draw stays fair'}
        hashLabel="Seed hash, published before the first entry"
        seedLabel="Seed, revealed after the draw"
        before="The seed that orders the entries was fixed before anyone entered; only its SHA-256 is public."
        after="The entries, sorted, were shuffled with this seed; the first places won."
        verify={`dropline verify-draw --sku ${sku}`}
      />
    </div>
  );
}

function drawText(state, entry, draw, product, holding) {
  const units = product.stock?.total;
  switch (state) {
    case 'open':
      return `No rush: everyone who enters before the draw has the same chance. ${draw.entries} entered so far${units ? ` for ${units} units` : ''}; one entry per person.`;
    case 'closed':
      return draw.status === 'DRAWN' ? `Drawn: ${draw.winners ?? 0} of ${draw.entries} entries won.` : 'Entries are closed: the draw is running.';
    case 'entered':
      return `You're in the draw (${draw.entries} entries so far). Winners get a unit held for them to pay; keep this page open.`;
    case 'drawing':
      return 'Entries are closed: drawing…';
    case 'won':
      return `You won (place ${entry.place} of ${draw.entries})${holding ? ': a unit is held for you below. Pay before the timer runs out.' : '.'}`;
    case 'lost':
      return `Not this time: place ${entry.place} of ${draw.entries}, and ${draw.winners ?? 0} won. You stay in line for this product in draw order: a unit a winner lets go comes to you.`;
    default:
      return '';
  }
}
