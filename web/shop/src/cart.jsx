// The cart: several products checked out together, all or nothing
// (reserveCart). A line that cannot be had fails the whole cart, holds
// nothing, and is shown on its own line with how many could be had; a held
// cart counts down like a hold, and Pay extends it once (extendCart with an
// idempotency key) before commitCart.
import { createContext, useContext, useEffect, useState } from 'react';
import { useClient, useSubscription } from 'urql';
import { CANCEL_CART, COMMIT_CART, EXTEND_CART, RESERVE_CART, WATCH, newIdempotencyKey } from './api.js';
import { formatClock, formatLeft, useNow } from './clock.js';

const CartContext = createContext(null);

const PAY_HOLD_SECONDS = 300;
const PAYMENT_STEP_MS = 2000;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// useCart gives a card the cart's add(product) and how many of its SKU are
// in it.
export function useCart() {
  return useContext(CartContext);
}

export function CartProvider({ children }) {
  // lines: [{ sku, name, price, quantity }] in the order they were added.
  const [lines, setLines] = useState([]);
  const add = (p) =>
    setLines((ls) =>
      ls.some((l) => l.sku === p.sku)
        ? ls.map((l) => (l.sku === p.sku ? { ...l, quantity: l.quantity + 1 } : l))
        : [...ls, { sku: p.sku, name: p.name, price: p.price, quantity: 1 }],
    );
  const setQuantity = (sku, q) =>
    setLines((ls) => (q <= 0 ? ls.filter((l) => l.sku !== sku) : ls.map((l) => (l.sku === sku ? { ...l, quantity: q } : l))));
  const count = (sku) => lines.find((l) => l.sku === sku)?.quantity ?? 0;
  return (
    <CartContext.Provider value={{ lines, setLines, add, setQuantity, count }}>{children}</CartContext.Provider>
  );
}

// phases: open (lines being chosen), checking, retry (the last checkout
// failed in transit: the same key is sent again), refused (lines that
// cannot be had), held, paying, cancelling, paid, cancelled, expired.
const HELD = new Set(['held', 'paying', 'cancelling']);

export function CartPanel({ signedIn }) {
  const client = useClient();
  const { lines, setLines, setQuantity } = useCart();
  const [state, setState] = useState({ phase: 'open' });
  const held = HELD.has(state.phase);
  const now = useNow(held ? 250 : 1000);

  if (lines.length === 0 && !held && !['paid', 'cancelled', 'expired'].includes(state.phase)) return null;

  const units = lines.reduce((n, l) => n + l.quantity, 0);
  const total = lines.reduce((n, l) => n + l.quantity * l.price.amount, 0);
  const currency = lines[0]?.price.currency ?? 'EUR';

  const checkout = async () => {
    const key = state.phase === 'retry' ? state.key : newIdempotencyKey('cart');
    const sent = lines.map((l) => ({ sku: l.sku, quantity: l.quantity }));
    setState({ phase: 'checking', key });
    const res = await client.mutation(RESERVE_CART, { input: { lines: sent, idempotencyKey: key } }).toPromise();
    const payload = res.data?.reserveCart;
    if (!payload) {
      setState({ phase: 'retry', key, message: 'Could not reach the shop: try again (nothing is held twice).' });
      return;
    }
    if (payload.userErrors.length) {
      // Each refused line has its own error, with the index of the line sent.
      const errors = {};
      let message = null;
      for (const ue of payload.userErrors) {
        const i = ue.field?.[0] === 'input' && ue.field[1] === 'lines' ? Number(ue.field[2]) : NaN;
        if (Number.isInteger(i) && sent[i]) errors[sent[i].sku] = ue;
        else message = ue.message;
      }
      const retry = payload.userErrors.some((ue) => ue.code === 'RATE_LIMITED' || ue.code === 'UNAVAILABLE');
      setState(retry ? { phase: 'retry', key, message } : { phase: 'refused', errors, message });
      return;
    }
    setState({ phase: 'held', cart: payload.cart });
  };

  const settle = async (doc, field, busy, token) => {
    setState((s) => ({ ...s, phase: busy, message: null }));
    const res = await client.mutation(doc, { input: { token } }).toPromise();
    const payload = res.data?.[field];
    const ue = payload?.userErrors[0];
    if (!payload) {
      setState((s) => ({ ...s, phase: 'held', message: 'Could not reach the shop: try again.' }));
    } else if (!ue || ue.code === 'ALREADY_COMMITTED' || ue.code === 'ALREADY_CANCELLED') {
      const done = field === 'commitCart' || ue?.code === 'ALREADY_COMMITTED' ? 'paid' : 'cancelled';
      setState((s) => ({ ...s, phase: done, cart: payload.cart ?? s.cart }));
      setLines([]);
    } else if (ue.code === 'EXPIRED') {
      setState((s) => ({ ...s, phase: 'expired' }));
    } else {
      setState((s) => ({ ...s, phase: 'held', message: ue.message }));
    }
  };

  const pay = async () => {
    const token = state.cart.token;
    const input = { token, holdSeconds: PAY_HOLD_SECONDS, idempotencyKey: newIdempotencyKey('pay') };
    setState((s) => ({ ...s, phase: 'paying', message: null }));
    for (let attempt = 0; attempt < 2; attempt++) {
      const res = await client.mutation(EXTEND_CART, { input }).toPromise();
      const payload = res.data?.extendCart;
      if (!payload) {
        await sleep(300);
        continue;
      }
      const ue = payload.userErrors[0];
      if (!ue) setState((s) => ({ ...s, extended: true, cart: { ...s.cart, ...payload.cart } }));
      else if (ue.code === 'EXPIRED') return setState((s) => ({ ...s, phase: 'expired' }));
      break;
    }
    await sleep(PAYMENT_STEP_MS);
    await settle(COMMIT_CART, 'commitCart', 'paying', token);
  };

  // A line ends with its cart: watching the first is watching the cart.
  const onLine = (r) =>
    setState((s) => {
      if (!HELD.has(s.phase)) return s;
      if (r.status === 'EXPIRED') return { ...s, phase: 'expired' };
      if (r.status === 'COMMITTED') return { ...s, phase: 'paid' };
      if (r.status === 'CANCELLED') return { ...s, phase: 'cancelled' };
      return s;
    });

  const errors = state.phase === 'refused' ? state.errors : {};
  // Changing a refused cart starts over: its errors were about the old lines.
  const change = (sku, q) => {
    setQuantity(sku, q);
    if (state.phase === 'refused') setState({ phase: 'open' });
  };
  const left = held ? new Date(state.cart.expiresAt).getTime() - now : 0;

  return (
    <section className="cart" aria-labelledby="cart-title" data-testid="cart" data-state={state.phase}>
      <div className="cart-head">
        <h2 id="cart-title">Your cart</h2>
        {held && (
          <span className="countdown" data-testid="cart-hold" data-expires-at={state.cart.expiresAt} role="timer">
            {left > 0 ? formatLeft(left) : '0:00'}
          </span>
        )}
      </div>
      {held && <WatchLine token={state.cart.lines[0].token} onChange={onLine} />}
      {held ? (
        <ul className="cart-lines">
          {state.cart.lines.map((l) => (
            <li key={l.sku} className="cart-line" data-testid={`cart-line-${l.sku}`}>
              <span className="cart-name">
                {lines.find((x) => x.sku === l.sku)?.name ?? l.sku} <span className="sku">{l.sku}</span>
              </span>
              <span className="cart-qty">× {l.quantity}</span>
            </li>
          ))}
        </ul>
      ) : (
        <ul className="cart-lines">
          {lines.map((l) => (
            <li key={l.sku} className="cart-line" data-testid={`cart-line-${l.sku}`}>
              <span className="cart-name">
                {l.name} <span className="sku">{l.sku}</span>
              </span>
              <span className="stepper">
                <button
                  type="button"
                  className="btn ghost tiny"
                  aria-label={`One ${l.name} fewer`}
                  data-testid={`cart-minus-${l.sku}`}
                  disabled={state.phase === 'checking'}
                  onClick={() => change(l.sku, l.quantity - 1)}
                >
                  −
                </button>
                <span className="cart-qty" data-testid={`cart-qty-${l.sku}`} aria-live="polite">
                  {l.quantity}
                </span>
                <button
                  type="button"
                  className="btn ghost tiny"
                  aria-label={`One ${l.name} more`}
                  data-testid={`cart-plus-${l.sku}`}
                  disabled={state.phase === 'checking'}
                  onClick={() => change(l.sku, l.quantity + 1)}
                >
                  +
                </button>
              </span>
              {errors[l.sku] && (
                <p className="cart-line-error" data-testid={`cart-line-error-${l.sku}`} data-available={errors[l.sku].available ?? ''} role="alert">
                  {lineError(errors[l.sku], l)}
                </p>
              )}
            </li>
          ))}
        </ul>
      )}
      {state.extended && held && (
        <p className="extend-note" data-testid="cart-extend">
          More time to pay: every line is held until {formatClock(state.cart.expiresAt)}.
        </p>
      )}
      <p className={`status status-${cartTone(state.phase)}`} data-testid="cart-status" data-state={state.phase} role="status">
        {cartText(state, units)}
      </p>
      <div className="cart-actions">
        {held ? (
          <>
            <button type="button" className="btn primary" data-testid="cart-pay" disabled={state.phase !== 'held' || left <= 0} onClick={pay}>
              {state.phase === 'paying' ? 'Paying…' : `Pay ${formatMoney(total, currency)}`}
            </button>
            <button
              type="button"
              className="btn ghost"
              data-testid="cart-cancel"
              disabled={state.phase !== 'held' || left <= 0}
              onClick={() => settle(CANCEL_CART, 'cancelCart', 'cancelling', state.cart.token)}
            >
              Cancel
            </button>
          </>
        ) : lines.length > 0 ? (
          <button
            type="button"
            className="btn primary"
            data-testid="cart-checkout"
            disabled={!signedIn || state.phase === 'checking'}
            onClick={checkout}
          >
            {state.phase === 'checking'
              ? 'Holding…'
              : state.phase === 'retry'
                ? 'Try again'
                : `Check out ${units} ${units === 1 ? 'item' : 'items'} · ${formatMoney(total, currency)}`}
          </button>
        ) : (
          <button type="button" className="btn ghost" data-testid="cart-done" onClick={() => setState({ phase: 'open' })}>
            Close
          </button>
        )}
      </div>
    </section>
  );
}

function WatchLine({ token, onChange }) {
  useSubscription({ query: WATCH, variables: { token } }, (_, d) => {
    onChange(d.reservationChanged);
    return d;
  });
  return null;
}

function lineError(ue, line) {
  if (ue.code === 'OUT_OF_STOCK' || ue.code === 'QUOTA_EXCEEDED') {
    const n = ue.available ?? 0;
    const why = ue.code === 'QUOTA_EXCEEDED' ? 'your limit allows' : 'are left';
    if (n === 0) return ue.code === 'QUOTA_EXCEEDED' ? 'You already have your limit of this one: remove it.' : 'None left right now: remove it.';
    return `Only ${n} ${why} (you asked for ${line.quantity}): lower it to ${n} and check out again.`;
  }
  return ue.message;
}

function cartText(state, units) {
  switch (state.phase) {
    case 'open':
      return `All or nothing: check out holds all ${units} ${units === 1 ? 'item' : 'items'} together, or none.`;
    case 'checking':
      return 'Holding every line…';
    case 'retry':
      return state.message ?? 'Try again.';
    case 'refused':
      return state.message ?? 'Nothing was held: a line could not be had (see below). Change it and check out again.';
    case 'held':
      return state.message ?? 'Every line is held for you: pay before the timer runs out.';
    case 'paying':
      return state.extended ? 'Paying… every line was extended while the payment runs.' : 'Paying…';
    case 'cancelling':
      return 'Cancelling…';
    case 'paid':
      return 'Paid. Your order is confirmed.';
    case 'cancelled':
      return 'Cancelled: every unit is back on sale.';
    case 'expired':
      return 'Your cart expired: every unit is back on sale.';
    default:
      return '';
  }
}

function cartTone(phase) {
  if (phase === 'paid') return 'ok';
  if (phase === 'refused' || phase === 'retry' || phase === 'expired') return 'warn';
  return 'muted';
}




function formatMoney(amount, currency) {
  try {
    const f = new Intl.NumberFormat('en-IE', { style: 'currency', currency });
    return f.format(amount / 10 ** f.resolvedOptions().maximumFractionDigits);
  } catch {
    return `${(amount / 100).toFixed(2)} ${currency}`;
  }
}
