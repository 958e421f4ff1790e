// A queued drop: before it opens, joining puts the buyer in the pre-queue
// (no number yet: at the opening everyone in it gets a random place from a
// seed whose hash is public); then the number, the position and an
// estimate, asked for as often as the server says (myQueueTicket's
// pollAfterSeconds), the proof of work when the queue asks for one
// (solved here, with its progress shown), "It's your turn" with the pass's
// countdown and Buy (reserve with the pass), or SOLD_OUT the moment it is.
import { useContext, useEffect, useRef, useState } from 'react';
import { useClient } from 'urql';
import { JOIN_QUEUE, MY_QUEUE_TICKET, QUEUE_CHALLENGE, QUEUE_INFO, TokenContext, poll } from './api.js';
import { solve } from './pow.js';

// QueuePanel is the card's buying part for a queued product. ticket is the
// buyer's ticket as the page last saw it (null: not in the queue); onTicket
// reports each new state. Buy (with the pass) is the card's own button,
// which the card enables once ticket.status is ADMITTED.
export function QueuePanel({ product, signedIn, ticket, onTicket }) {
  const client = useClient();
  const token = useContext(TokenContext);
  const sku = product.sku;
  const [queue, setQueue] = useState(product.queue);
  const [work, setWork] = useState(null); // { progress } while the proof runs
  const [message, setMessage] = useState(null);
  const now = useNow(1000);
  const stop = useRef(null);

  // The ticket (with the queue as it stands) is asked for every
  // pollAfterSeconds the server gives, which grows with the position (at
  // most every 5 s here, so the page stays lively); before joining, the
  // queue alone, every 5 s. One ask at a time.
  const status = ticket?.status;
  const position = ticket?.position ?? (ticket?.number != null ? ticket.number - queue.admittedThrough : null);
  const live = signedIn && ticket && ['PRE_QUEUE', 'WAITING', 'ADMITTED'].includes(status);
  const every = live ? Math.min(5, Math.max(1, ticket.pollAfterSeconds ?? 2)) : 5;
  const inFlight = useRef(Promise.resolve());
  useEffect(() => {
    if (queue.status === 'SOLD_OUT' && !live) return undefined;
    let stopped = false;
    const ask = () => {
      inFlight.current = inFlight.current
        .then(async () => {
          if (stopped) return;
          if (live) {
            const t = (await poll(token, MY_QUEUE_TICKET, { sku }))?.myQueueTicket;
            if (t && !stopped) {
              onTicket(t);
              if (t.queue) setQueue(t.queue);
            }
          } else {
            const q = (await poll(token, QUEUE_INFO, { sku }))?.product?.queue;
            if (q && !stopped) setQueue(q);
          }
        })
        .catch(() => {});
    };
    const id = setInterval(ask, every * 1000);
    return () => {
      stopped = true;
      clearInterval(id);
    };
  }, [live, every, queue.status, token, sku]); // eslint-disable-line react-hooks/exhaustive-deps

  useEffect(() => () => stop.current?.abort(), []);

  const join = async () => {
    setMessage(null);
    let proof;
    const c = (await poll(token, QUEUE_CHALLENGE, { sku }))?.queueChallenge;
    if (c && c.bits > 0) {
      stop.current = new AbortController();
      setWork({ progress: 0 });
      const found = await solve(c.challenge, c.bits, (p) => setWork({ progress: p }), stop.current.signal);
      if (found == null) return;
      proof = { challenge: c.challenge, proof: found };
    }
    const res = await client.mutation(JOIN_QUEUE, { input: { sku, ...(proof ?? {}) } }).toPromise();
    setWork(null);
    const payload = res.data?.joinQueue;
    if (!payload) {
      // Joining again returns the same ticket: pressing again is safe.
      setMessage('Could not reach the shop: try again.');
      return;
    }
    const ue = payload.userErrors[0];
    if (ue) {
      setMessage(ue.message);
      return;
    }
    onTicket(payload.ticket);
    if (payload.ticket.queue) setQueue(payload.ticket.queue);
  };

  const opensAt = new Date(queue.opensAt).getTime();
  const state = panelState(queue, ticket, position);
  const passLeft = ticket?.passExpiresAt ? new Date(ticket.passExpiresAt).getTime() - now : 0;

  return (
    <div className="queue" data-testid={`queue-${sku}`}>
      <div className="draw-head">
        <span className="queue-badge">Queue</span>
        <span className="draw-when">
          {now < opensAt ? (
            <>
              Opens at <time dateTime={queue.opensAt}>{formatClock(opensAt)}</time> · in{' '}
              <span className="countdown small">{formatLeft(opensAt - now)}</span>
            </>
          ) : (
            `${queue.waiting} waiting · ${queue.admitPerMinute} let in a minute`
          )}
        </span>
      </div>
      <p className="queue-status" data-testid={`queue-status-${sku}`} data-state={state} aria-live="polite">
        {queueText(state, queue, ticket)}
      </p>
      {state === 'waiting' && position != null && (
        <div className="queue-position" data-testid={`queue-position-${sku}`} data-position={position}>
          <strong>#{position}</strong> in line
          {ticket.etaSeconds != null || queue.admitPerMinute > 0 ? (
            <span>
              {' '}
              · about {formatEta(ticket.etaSeconds ?? Math.ceil((position / queue.admitPerMinute) * 60))}
            </span>
          ) : null}
          <div className="bar" aria-hidden="true">
            <div className="bar-fill" style={{ width: `${Math.round((queue.admittedThrough / Math.max(1, ticket.number)) * 100)}%` }} />
          </div>
        </div>
      )}
      {work && (
        <div className="queue-work" data-testid={`queue-work-${sku}`} data-progress={Math.round(work.progress * 100)}>
          Checking this browser (a puzzle the queue asks of everyone, to keep bots out): {Math.round(work.progress * 100)}%
          <div className="bar" aria-hidden="true">
            <div className="bar-fill" style={{ width: `${Math.round(work.progress * 100)}%` }} />
          </div>
        </div>
      )}
      {state === 'turn' && (
        <p className="turn" data-testid={`queue-turn-${sku}`} data-expires-at={ticket.passExpiresAt}>
          It's your turn: buy within{' '}
          <span className="countdown small" role="timer">
            {formatLeft(passLeft)}
          </span>
        </p>
      )}
      {!ticket && queue.status !== 'SOLD_OUT' && queue.status !== 'CLOSED' && (
        <button type="button" className="btn primary wide" data-testid={`queue-join-${sku}`} disabled={!signedIn || !!work} onClick={join}>
          {signedIn ? (work ? 'Joining…' : 'Join the queue') : 'Sign in to join'}
        </button>
      )}
      {message && (
        <p className="status status-warn" role="status">
          {message}
        </p>
      )}
      <QueueSeed sku={sku} queue={queue} />
    </div>
  );
}

// QueueSeed shows the hash of the seed that shuffles the pre-queue, public
// from the product's creation, and once the queue has opened the seed, with
// a check made here (Web Crypto, where the page has it) and the command
// that recomputes the order.
function QueueSeed({ sku, queue }) {
  const [check, setCheck] = useState(null);
  useEffect(() => {
    if (!queue.seed || !globalThis.crypto?.subtle) return;
    const bytes = new Uint8Array(queue.seed.match(/../g).map((h) => parseInt(h, 16)));
    crypto.subtle.digest('SHA-256', bytes).then((d) => {
      const hex = Array.from(new Uint8Array(d), (x) => x.toString(16).padStart(2, '0')).join('');
      setCheck(hex === queue.seedHash);
    });
  }, [queue.seed, queue.seedHash]);
  return (
    <details className="seed" data-testid={`queue-proof-${sku}`}>
      <summary>How the pre-queue is shuffled</summary>
      <dl>
        <dt>Seed hash, published when the drop was created</dt>
        <dd>
          <code data-testid={`queue-seed-hash-${sku}`}>{queue.seedHash}</code>
        </dd>
        {queue.seed && (
          <>
            <dt>Seed, revealed at the opening</dt>
            <dd>
              <code data-testid={`queue-seed-${sku}`}>{queue.seed}</code>
            </dd>
          </>
        )}
      </dl>
      <p>
        {check === true && (
          <strong className="ok" data-testid={`queue-seed-check-${sku}`}>
            ✓ SHA-256 of the seed is the published hash.{' '}
          </strong>
        )}
        {check === false && <strong className="bad">✗ The seed does not hash to the published hash. </strong>}
        Everyone who joins before the opening gets a place drawn from this seed, fixed before anyone joined;{' '}
        <code>dropline verify-queue --sku {sku}</code> recomputes the order once it is revealed. After the opening,
        first come, first served.
      </p>
    </details>
  );
}

function panelState(queue, ticket, position) {
  if (queue.status === 'SOLD_OUT' || ticket?.status === 'SOLD_OUT') return 'soldout';
  if (!ticket) return queue.status === 'PRE_QUEUE' ? 'pre' : 'open';
  switch (ticket.status) {
    case 'PRE_QUEUE':
      return 'prequeue';
    case 'WAITING':
      return position != null && position <= 0 ? 'admitting' : queue.status === 'PAUSED' ? 'paused' : 'waiting';
    case 'ADMITTED':
      return 'turn';
    case 'USED':
      return 'used';
    case 'EXPIRED':
      return 'expired';
    default:
      return 'open';
  }
}

function queueText(state, queue, ticket) {
  switch (state) {
    case 'pre':
      return 'Join before it opens: everyone who joins before the opening gets a random place then, so there is no need to be quick at the exact second.';
    case 'open':
      return 'Join the queue: places are given in the order people join, and buying needs your turn.';
    case 'prequeue':
      return "You're in the queue. Before it opens everyone joins the pre-queue; at the opening each gets a random place, drawn from a seed whose hash is published now.";
    case 'waiting':
      return `Your number is ${ticket.number}. People are let in in order, as fast as there are units to sell; keep this page open.`;
    case 'paused':
      return 'Paused: every unit is held right now. Holds that end come back, and the queue moves again.';
    case 'admitting':
      return 'Your number is up: your pass is on its way.';
    case 'turn':
      return 'Your pass lets you buy (Buy below).';
    case 'used':
      return 'Your pass bought your hold.';
    case 'expired':
      return 'Your pass expired before it was used.';
    case 'soldout':
      return 'Sold out: every unit is sold. The queue has stopped.';
    default:
      return '';
  }
}

function useNow(every) {
  const [now, setNow] = useState(Date.now);
  useEffect(() => {
    const id = setInterval(() => setNow(Date.now()), every);
    return () => clearInterval(id);
  }, [every]);
  return now;
}

function formatClock(t) {
  return new Date(t).toLocaleTimeString('en-GB', { hour: '2-digit', minute: '2-digit', second: '2-digit' });
}

function formatLeft(ms) {
  const s = Math.max(0, Math.ceil(ms / 1000));
  return `${Math.floor(s / 60)}:${String(s % 60).padStart(2, '0')}`;
}

function formatEta(seconds) {
  if (seconds < 60) return `${Math.max(1, seconds)} s`;
  return `${Math.round(seconds / 60)} min`;
}
