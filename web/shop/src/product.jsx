// One product card: live stock, and the buyer's path through a drop:
// Buy (reserve, with one idempotency key per press, reused on retry) ->
// a hold with a countdown to expiresAt -> Pay (the hold is extended once
// for the payment step, then commit) or Cancel, or the hold expires and its
// unit goes back on sale.
import { useEffect, useRef, useState } from 'react';
import { useClient, useSubscription } from 'urql';
import { CANCEL, COMMIT, EXTEND, RESERVATION, RESERVE, WATCH, newIdempotencyKey } from './api.js';
import { useCart } from './cart.jsx';
import { formatClock, formatLeft, useNow } from './clock.js';
import { DrawPanel } from './draw.jsx';
import { QueuePanel } from './queue.jsx';
import { WaitlistPanel } from './waitlist.jsx';

// PAY_HOLD_SECONDS is how long "Pay" extends the hold for: the time the
// payment step may take. PAYMENT_STEP_MS stands in for the payment
// provider's answer (the demo takes no money).
const PAY_HOLD_SECONDS = 300;
const PAYMENT_STEP_MS = 2000;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const ACTIVE = new Set(['held', 'paying', 'cancelling']);

// order phases: idle, reserving, retry (the last press failed in transit: the
// same key is sent again), held, paying, cancelling, paid, cancelled,
// expired, refused (a business outcome such as out of stock).
const idle = { phase: 'idle' };

export function ProductCard({ product, stock, signedIn, existingHold, existingEntry, existingDrawEntry, ticket, onTicket, index }) {
  const client = useClient();
  const cart = useCart();
  const [order, setOrder] = useState(idle);
  const [entry, setEntry] = useState(existingEntry ?? null);
  const [drawEntry, setDrawEntry] = useState(existingDrawEntry ?? null);
  const sku = product.sku;

  // A waitlist or draw entry made before a reload comes back with the page too.
  useEffect(() => {
    if (existingEntry && !entry) setEntry(existingEntry);
  }, [existingEntry]); // eslint-disable-line react-hooks/exhaustive-deps
  useEffect(() => {
    if (existingDrawEntry && !drawEntry) setDrawEntry(existingDrawEntry);
  }, [existingDrawEntry]); // eslint-disable-line react-hooks/exhaustive-deps

  // A unit handed over from the waitlist, or won in a draw, is a hold like
  // one from Buy; how it came is kept to say so (offer, won).
  const handed = (how) => (r) =>
    setOrder((o) => {
      if (o.reservation?.token === r.token) return ACTIVE.has(o.phase) ? { ...o, [how]: true } : o;
      if (ACTIVE.has(o.phase)) return o;
      return { phase: 'held', reservation: r, offset: 0, [how]: true };
    });
  const onOffer = handed('offer');
  const onWon = handed('won');

  // A hold made before a reload comes back with the page.
  useEffect(() => {
    if (existingHold && order.phase === 'idle') {
      setOrder({ phase: 'held', reservation: existingHold, offset: clockOffset(existingHold) });
    }
  }, [existingHold]); // eslint-disable-line react-hooks/exhaustive-deps

  const update = (patch) => setOrder((o) => ({ ...o, ...patch }));

  const buy = async () => {
    // One key per press of Buy; a retry of a press that failed in transit
    // sends the same key, so the server answers with the same hold instead
    // of taking a second unit.
    const key = order.phase === 'retry' ? order.key : newIdempotencyKey();
    setOrder({ phase: 'reserving', key });
    const sent = Date.now();
    // A queued product is bought with the pass the queue gave.
    const pass = product.queue && ticket?.status === 'ADMITTED' ? { admissionPass: ticket.pass } : {};
    const res = await client
      .mutation(RESERVE, { input: { sku, quantity: 1, idempotencyKey: key, ...pass } })
      .toPromise();
    const payload = res.data?.reserve;
    if (!payload) {
      setOrder({ phase: 'retry', key, message: transportMessage(res.error) });
      return;
    }
    const ue = payload.userErrors[0];
    if (ue) {
      if (ue.code === 'UNAVAILABLE' || ue.code === 'RATE_LIMITED') {
        setOrder({ phase: 'retry', key, message: userErrorMessage(ue, product) });
      } else {
        setOrder({ phase: 'refused', code: ue.code, message: userErrorMessage(ue, product) });
      }
      return;
    }
    setOrder({ phase: 'held', key, reservation: payload.reservation, offset: clockOffset(payload.reservation, sent) });
    if (pass.admissionPass) onTicket((t) => ({ ...t, status: 'USED' }));
  };

  // pay extends the hold once for the payment step (one idempotency key per
  // press, kept when the extension is retried, so a lost answer never
  // spends a second extension), waits for the payment, then commits.
  const pay = async () => {
    const token = order.reservation.token;
    const key = newIdempotencyKey('pay');
    update({ phase: 'paying', message: null });
    const ext = await extendHold(client, token, key);
    if (ext.reservation) {
      setOrder((o) =>
        o.reservation?.token === token
          ? { ...o, extended: true, reservation: { ...o.reservation, ...ext.reservation } }
          : o,
      );
    } else if (ext.code === 'EXPIRED') {
      setOrder((o) => ({ ...o, phase: 'expired', message: null }));
      return;
    } else if (ext.code === 'ALREADY_COMMITTED') {
      setOrder((o) => ({ ...o, phase: 'paid', message: null }));
      return;
    }
    // EXTENSION_LIMIT or an extension that could not be sent: pay within
    // the time the hold has left.
    await sleep(PAYMENT_STEP_MS);
    await settle(COMMIT, 'commit', 'paying', token);
  };

  const settle = async (doc, field, busy, token = order.reservation.token) => {
    update({ phase: busy, message: null });
    const res = await client.mutation(doc, { input: { token } }).toPromise();
    const payload = res.data?.[field];
    if (!payload) {
      // The call may or may not have arrived; both are idempotent on the
      // token, so pressing again is safe.
      setOrder((o) => (ACTIVE.has(o.phase) ? { ...o, phase: 'held', message: transportMessage(res.error) } : o));
      return;
    }
    const ue = payload.userErrors[0];
    if (!ue) {
      setOrder((o) => ({ ...o, phase: field === 'commit' ? 'paid' : 'cancelled', reservation: payload.reservation, message: null }));
      return;
    }
    switch (ue.code) {
      case 'ALREADY_COMMITTED':
        setOrder((o) => ({ ...o, phase: 'paid', message: null }));
        break;
      case 'ALREADY_CANCELLED':
        setOrder((o) => ({ ...o, phase: 'cancelled', message: null }));
        break;
      case 'EXPIRED':
        setOrder((o) => ({ ...o, phase: 'expired', message: null }));
        break;
      default:
        setOrder((o) => ({ ...o, phase: 'held', message: userErrorMessage(ue, product) }));
    }
  };

  // The server says when a hold ends (expiry, or a commit or cancel made
  // elsewhere); the countdown is only the buyer's view of it.
  const onReservation = (r) => {
    setOrder((o) => {
      if (!o.reservation || o.reservation.token !== r.token || !ACTIVE.has(o.phase)) return o;
      if (r.status === 'EXPIRED') return { ...o, phase: 'expired', message: null };
      if (r.status === 'COMMITTED') return { ...o, phase: 'paid', message: null };
      if (r.status === 'CANCELLED') return { ...o, phase: 'cancelled', message: null };
      if (r.status === 'HELD' && r.expiresAt !== o.reservation.expiresAt) {
        // An extension (this page's or another window's) moves the countdown.
        return { ...o, reservation: { ...o.reservation, expiresAt: r.expiresAt, extensions: r.extensions } };
      }
      return o;
    });
  };

  const active = ACTIVE.has(order.phase);
  const sale = saleWindow(product);
  const soldOut = stock.available === 0 && !active;
  const status = statusOf(order, soldOut && !product.draw, sale, product);

  return (
    <article className={`card${soldOut ? ' sold-out' : ''}`} data-testid={`product-${sku}`}>
      <div className={`tile tile-${index % 6}`} aria-hidden="true">
        <span>{initials(product.name)}</span>
        {soldOut && <span className="ribbon">Sold out</span>}
      </div>
      <div className="card-body">
        <div className="title-row">
          <h2>{product.name}</h2>
          <span className="price">{formatMoney(product.price)}</span>
        </div>
        <p className="meta">
          <span className="sku">{sku}</span>
          {product.maxPerUser != null && <span>Limit {product.maxPerUser} per person</span>}
          {sale.label && <span>{sale.label}</span>}
        </p>
        <StockBar stock={stock} sku={sku} />

        {product.draw && (
          <DrawPanel
            product={product}
            signedIn={signedIn}
            entry={drawEntry}
            onEntry={setDrawEntry}
            onWon={onWon}
            holding={active}
          />
        )}

        {product.queue && !product.queue.id.startsWith('drop:') && !active && (
          <QueuePanel initial={product.queue} signedIn={signedIn} ticket={ticket} onTicket={onTicket} />
        )}

        {active ? (
          <Hold
            order={order}
            sku={sku}
            price={product.price}
            onPay={pay}
            onCancel={() => settle(CANCEL, 'cancel', 'cancelling')}
            onReservation={onReservation}
          />
        ) : product.draw ? null : (
          <div className="buy-row">
            <button
              type="button"
              className="btn primary"
              data-testid={`buy-${sku}`}
              disabled={!signedIn || soldOut || order.phase === 'reserving' || !sale.open || (product.queue && ticket?.status !== 'ADMITTED')}
              onClick={buy}
            >
              {product.queue && ticket?.status !== 'ADMITTED' && !soldOut
                ? ticket?.status === 'USED'
                  ? 'Pass used'
                  : 'Buy on your turn'
                : buyLabel(order, soldOut, signedIn, sale)}
            </button>
            <button
              type="button"
              className="btn ghost"
              data-testid={`cart-add-${sku}`}
              disabled={!signedIn || soldOut || !sale.open || !!product.queue}
              onClick={() => cart.add(product)}
              aria-label={`Add ${product.name} to the cart`}
            >
              {cart.count(sku) > 0 ? `In cart (${cart.count(sku)}) +1` : 'Add to cart'}
            </button>
          </div>
        )}

        <p className={`status status-${status.tone}`} data-testid={`status-${sku}`} data-state={status.state} role="status">
          {status.text}
        </p>
        {!active && !product.draw && !product.queue && (soldOut || entry?.status === 'WAITING') && (
          <WaitlistPanel sku={sku} signedIn={signedIn} entry={entry} onEntry={setEntry} onOffer={onOffer} />
        )}
      </div>
    </article>
  );
}

function StockBar({ stock, sku }) {
  const pct = stock.total > 0 ? Math.round((stock.available / stock.total) * 100) : 0;
  const low = stock.available > 0 && stock.available <= Math.max(3, stock.total / 10);
  return (
    <div className="stock">
      <div className="stock-line">
        <span>
          <strong data-testid={`stock-available-${sku}`}>{stock.available}</strong> of {stock.total} left
        </span>
        <span className="stock-detail">
          {stock.held > 0 && <span>{stock.held} in carts</span>}
          {stock.sold > 0 && <span>{stock.sold} sold</span>}
        </span>
      </div>
      <div className="bar" aria-hidden="true">
        <div className={`bar-fill${low ? ' low' : ''}`} style={{ width: `${pct}%` }} />
      </div>
    </div>
  );
}

function Hold({ order, sku, price, onPay, onCancel, onReservation }) {
  const r = order.reservation;
  const now = useNow(250);
  const left = new Date(r.expiresAt).getTime() - (now + (order.offset ?? 0));
  const client = useClient();

  useSubscription({ query: WATCH, variables: { token: r.token } }, (_, d) => {
    onReservation(d.reservationChanged);
    return d;
  });

  // Should the live update be lost, ask once the hold is well past its end.
  const asked = useRef(false);
  useEffect(() => {
    if (left < -3000 && !asked.current) {
      asked.current = true;
      client
        .query(RESERVATION, { token: r.token })
        .toPromise()
        .then((res) => res.data?.reservation && onReservation(res.data.reservation));
    }
  }, [left < -3000]); // eslint-disable-line react-hooks/exhaustive-deps

  // Buy is gone once the hold is there: keyboard users land on Pay, not at
  // the top of the page.
  const payRef = useRef(null);
  useEffect(() => {
    const at = document.activeElement;
    if (!at || at === document.body) payRef.current?.focus();
  }, []);

  const busy = order.phase !== 'held';
  return (
    <div className="hold">
      <div className="hold-head">
        <span>{order.phase === 'paying' ? 'Paying: held while the payment runs' : 'Reserved for you'}</span>
        <span className="countdown" data-testid={`hold-${sku}`} data-expires-at={r.expiresAt} role="timer" aria-live="off">
          {left > 0 ? formatLeft(left) : '0:00'}
        </span>
      </div>
      {order.offer && (
        <p className="offer-note" data-testid={`waitlist-offer-${sku}`}>
          A unit came back and the waitlist handed it to you: it is held for you until the timer runs out.
        </p>
      )}
      {order.extended && (
        <p className="extend-note" data-testid={`hold-extend-${sku}`} data-extensions={r.extensions ?? 1}>
          More time to pay: the hold now lasts until {formatClock(r.expiresAt)}.
        </p>
      )}
      <div className="hold-actions">
        <button type="button" className="btn primary" data-testid={`pay-${sku}`} ref={payRef} disabled={busy || left <= 0} onClick={onPay}>
          {order.phase === 'paying' ? 'Paying…' : `Pay ${formatMoney(price)}`}
        </button>
        <button type="button" className="btn ghost" data-testid={`cancel-${sku}`} disabled={busy || left <= 0} onClick={onCancel}>
          {order.phase === 'cancelling' ? 'Cancelling…' : 'Cancel'}
        </button>
      </div>
    </div>
  );
}

function statusOf(order, soldOut, sale, product) {
  switch (order.phase) {
    case 'reserving':
      return { state: 'reserving', tone: 'muted', text: 'Reserving…' };
    case 'retry':
      return { state: 'retry', tone: 'warn', text: order.message };
    case 'held':
      return order.message
        ? { state: 'held', tone: 'warn', text: order.message }
        : { state: 'held', tone: 'muted', text: 'Held for you: pay before the timer runs out.' };
    case 'paying':
      return {
        state: 'paying',
        tone: 'muted',
        text: order.extended ? 'Paying… the hold was extended while the payment runs.' : 'Paying…',
      };
    case 'cancelling':
      return { state: 'cancelling', tone: 'muted', text: 'Cancelling…' };
    case 'paid':
      return { state: 'paid', tone: 'ok', text: 'Paid. Your order is confirmed.' };
    case 'cancelled':
      return { state: 'cancelled', tone: 'muted', text: 'Cancelled: the unit is back on sale.' };
    case 'expired':
      return { state: 'expired', tone: 'warn', text: 'Your hold expired: the unit is back on sale.' };
    case 'refused':
      if (soldOut) return { state: 'soldout', tone: 'bad', text: 'Sold out' };
      return { state: 'refused', tone: 'bad', text: order.message };
    default:
      if (soldOut) return { state: 'soldout', tone: 'bad', text: 'Sold out' };
      if (product.draw) return { state: 'draw', tone: 'muted', text: '' };
      if (!sale.open) return { state: 'closed', tone: 'muted', text: sale.label };
      return { state: 'idle', tone: 'muted', text: product.maxPerUser ? `Limit ${product.maxPerUser} per person.` : 'In stock.' };
  }
}

function buyLabel(order, soldOut, signedIn, sale) {
  if (soldOut) return 'Sold out';
  if (!sale.open) return sale.closedLabel;
  if (!signedIn) return 'Sign in to buy';
  if (order.phase === 'reserving') return 'Reserving…';
  if (order.phase === 'retry') return 'Try again';
  if (order.phase === 'paid') return 'Buy another';
  return 'Buy now';
}

function userErrorMessage(ue, product) {
  switch (ue.code) {
    case 'OUT_OF_STOCK':
      return 'Someone was faster: none left right now.';
    case 'QUOTA_EXCEEDED':
      return product.maxPerUser != null
        ? `You already have your limit (${product.maxPerUser} per person).`
        : 'You already have your limit.';
    case 'SALE_NOT_ACTIVE':
      return 'This sale is not open.';
    case 'RATE_LIMITED':
      return `Too many tries: wait ${ue.retryAfterSeconds ?? 1}s, then try again.`;
    case 'UNAVAILABLE':
      return 'The shop is busy: try again.';
    case 'UNAUTHENTICATED':
      return 'Your session ended: sign in again.';
    default:
      return ue.message;
  }
}

// extendHold gives the hold PAY_HOLD_SECONDS more, with key; an answer lost
// in transit is asked again once with the same key, which extends once.
async function extendHold(client, token, key) {
  const input = { token, holdSeconds: PAY_HOLD_SECONDS, idempotencyKey: key };
  for (let attempt = 0; attempt < 2; attempt++) {
    const res = await client.mutation(EXTEND, { input }).toPromise();
    const payload = res.data?.extendReservation;
    if (payload) {
      const ue = payload.userErrors[0];
      return ue ? { code: ue.code } : { reservation: payload.reservation };
    }
    await sleep(300);
  }
  return { code: 'UNREACHABLE' };
}

function transportMessage(error) {
  if (error?.graphQLErrors?.length) return error.graphQLErrors[0].message;
  return 'Could not reach the shop: try again.';
}

// clockOffset estimates server time minus local time from a reservation's
// createdAt, so the countdown is right even when this device's clock is off.
function clockOffset(r, sent) {
  const created = new Date(r.createdAt).getTime();
  if (!sent || Number.isNaN(created)) return 0;
  const mid = (sent + Date.now()) / 2;
  const off = created - mid;
  return Math.abs(off) < 1000 ? 0 : off;
}


function saleWindow(p) {
  const now = Date.now();
  const starts = p.saleStartsAt ? new Date(p.saleStartsAt).getTime() : null;
  const ends = p.saleEndsAt ? new Date(p.saleEndsAt).getTime() : null;
  if (starts && now < starts) return { open: false, label: `Opens ${formatWhen(starts)}`, closedLabel: 'Not open yet' };
  if (ends && now >= ends) return { open: false, label: 'Sale ended', closedLabel: 'Sale ended' };
  if (ends) return { open: true, label: `Ends ${formatWhen(ends)}` };
  return { open: true, label: null };
}

function formatWhen(t) {
  return new Date(t).toLocaleString('en-GB', { day: 'numeric', month: 'short', hour: '2-digit', minute: '2-digit' });
}



const money = new Map();
export function formatMoney({ amount, currency }) {
  let f = money.get(currency);
  if (!f) {
    try {
      f = new Intl.NumberFormat('en-IE', { style: 'currency', currency });
    } catch {
      f = { format: (v) => `${v.toFixed(2)} ${currency}`, resolvedOptions: () => ({ maximumFractionDigits: 2 }) };
    }
    money.set(currency, f);
  }
  return f.format(amount / 10 ** f.resolvedOptions().maximumFractionDigits);
}

function initials(name) {
  return name
    .split(/\s+/)
    .filter((w) => /^[A-Za-z0-9]/.test(w))
    .slice(0, 2)
    .map((w) => w[0].toUpperCase())
    .join('');
}

