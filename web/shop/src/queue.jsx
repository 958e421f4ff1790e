// A queued drop, of one product or of a whole drop (one queue in front of
// all its SKUs: one pass buys any of them). Before it opens, joining puts
// the buyer in the pre-queue (no number yet: at the opening everyone in it
// gets a random place from a seed whose hash is public); then the number,
// and the position and an estimate kept live by queueChanged, which sends
// every waiter the same value per admission step (position = number −
// admittedThrough). The ticket itself is asked for only when that value
// says it changed (the opening gave it a number, admittedThrough reached
// it: the pass is waiting) and, while the websocket is down, every
// pollAfterSeconds as the API asks of clients that cannot subscribe. The
// proof of work runs here when the queue asks for one, with its progress
// shown; a presale queue asks for an access code. Then "It's your turn"
// with the pass's countdown and Buy (reserve with the pass), or SOLD_OUT
// the moment the queue says so.
import { useContext, useEffect, useId, useRef, useState } from 'react';
import { useClient, useSubscription } from 'urql';
import {
  DROP_QUEUE_INFO,
  JOIN_QUEUE,
  LiveContext,
  MY_QUEUE_TICKET,
  QUEUE_CHALLENGE,
  QUEUE_CHANGED,
  QUEUE_INFO,
  TokenContext,
  poll,
} from './api.js';
import { formatClock, formatLeft, useNow } from './clock.js';
import { solve } from './pow.js';
import { SeedProof } from './seedproof.jsx';

// queueTarget is what the API takes to name a queue ({sku} or {drop}),
// from its id ("sku:<sku>" or "drop:<dropId>").
export function queueTarget(queue) {
  return queue.id.startsWith('drop:') ? { drop: queue.id.slice(5) } : { sku: queue.id.slice(4) };
}

// QueuePanel is the buying part of a queued product's card, or the head of
// a queued drop. ticket is the buyer's ticket as the page last saw it
// (null: not in the queue); onTicket reports each new one. Buy (with the
// pass) is each card's own button, which the card enables once
// ticket.status is ADMITTED.
export function QueuePanel({ initial, signedIn, ticket, onTicket }) {
  const client = useClient();
  const token = useContext(TokenContext);
  const socketUp = useContext(LiveContext);
  const target = queueTarget(initial);
  const key = target.sku ?? target.drop;
  const [queue, setQueueState] = useState(initial);
  const setQueue = (q) => setQueueState((cur) => newer(cur, q));
  const [work, setWork] = useState(null); // { progress } while the proof runs
  const [busy, setBusy] = useState(false);
  const [message, setMessage] = useState(null);
  const [needsCode, setNeedsCode] = useState(false);
  const [code, setCode] = useState('');
  const [codeError, setCodeError] = useState(null);
  const now = useNow(1000);
  const stop = useRef(null);
  const proofRef = useRef(null);
  const codeInput = useRef(null);
  const codeId = useId();

  // The queue as every waiter sees it, pushed at each admission step.
  const [{ error: subError }] = useSubscription({ query: QUEUE_CHANGED, variables: target }, (_, d) => {
    setQueue(d.queueChanged);
    return d;
  });
  const live = socketUp && !subError;

  const status = ticket?.status;
  const position = ticket?.number != null ? ticket.number - queue.admittedThrough : (ticket?.position ?? null);
  const active = signedIn && ticket && ['PRE_QUEUE', 'WAITING', 'ADMITTED'].includes(status);

  // refresh asks for the ticket once (one ask at a time).
  const asking = useRef(false);
  const refresh = async (stopped) => {
    if (asking.current) return;
    asking.current = true;
    try {
      const t = (await poll(token, MY_QUEUE_TICKET, target))?.myQueueTicket;
      if (t && !stopped()) {
        onTicket(t);
        setQueue(t.queue);
      }
    } finally {
      asking.current = false;
    }
  };

  // What the pushed queue says of this ticket that only the ticket can
  // tell: its number once the pre-queue is shuffled, its pass once
  // admittedThrough has reached it, its end once the pass has run out.
  // Asked for at once, then every second until the answer moves on.
  const needTicket =
    live &&
    active &&
    ((status === 'PRE_QUEUE' && queue.status !== 'PRE_QUEUE') ||
      (status === 'WAITING' && position != null && position <= 0 && queue.status !== 'SOLD_OUT') ||
      (status === 'ADMITTED' && ticket.passExpiresAt && now > Date.parse(ticket.passExpiresAt) + 1000));
  useEffect(() => {
    if (!needTicket) return undefined;
    let stopped = false;
    const ask = () => refresh(() => stopped).catch(() => {});
    ask();
    const id = setInterval(ask, 1000);
    return () => {
      stopped = true;
      clearInterval(id);
    };
  }, [needTicket]); // eslint-disable-line react-hooks/exhaustive-deps

  // Without the websocket: the ticket (with the queue) every
  // pollAfterSeconds the server gives (at most 5 s apart here), or before
  // joining the queue alone every 5 s.
  const every = active ? Math.min(5, Math.max(1, ticket.pollAfterSeconds ?? 2)) : 5;
  useEffect(() => {
    if (live || (queue.status === 'SOLD_OUT' && !active)) return undefined;
    let stopped = false;
    const ask = async () => {
      if (active) {
        await refresh(() => stopped);
      } else {
        const q = target.drop
          ? (await poll(token, DROP_QUEUE_INFO, { drop: target.drop }))?.drop?.queue
          : (await poll(token, QUEUE_INFO, { sku: target.sku }))?.product?.queue;
        if (q && !stopped) setQueue(q);
      }
    };
    const id = setInterval(() => ask().catch(() => {}), every * 1000);
    return () => {
      stopped = true;
      clearInterval(id);
    };
  }, [live, active, every, queue.status, token, key]); // eslint-disable-line react-hooks/exhaustive-deps

  useEffect(() => () => stop.current?.abort(), []);
  useEffect(() => {
    if (needsCode) codeInput.current?.focus();
  }, [needsCode]);

  const join = async (e) => {
    e?.preventDefault();
    setMessage(null);
    setCodeError(null);
    const sentCode = needsCode ? code.trim() : '';
    if (needsCode && !sentCode) {
      setCodeError('Enter your access code first.');
      codeInput.current?.focus();
      return;
    }
    setBusy(true);
    try {
      // A proof found for this queue stays good until its challenge
      // expires: a second try (another code) does not solve it again.
      let proof = proofRef.current;
      if (!proof || Date.parse(proof.expiresAt) - Date.now() < 5000) {
        proof = null;
        const c = (await poll(token, QUEUE_CHALLENGE, target))?.queueChallenge;
        if (!c) {
          setMessage('Could not reach the shop: try again.');
          return;
        }
        if (c.bits > 0) {
          stop.current = new AbortController();
          setWork({ progress: 0 });
          const found = await solve(c.challenge, c.bits, (p) => setWork({ progress: p }), stop.current.signal);
          if (found == null) return;
          proof = { challenge: c.challenge, proof: found, expiresAt: c.expiresAt };
          proofRef.current = proof;
        }
      }
      const input = {
        ...target,
        ...(proof ? { challenge: proof.challenge, proof: proof.proof } : {}),
        ...(sentCode ? { accessCode: sentCode } : {}),
      };
      const res = await client.mutation(JOIN_QUEUE, { input }).toPromise();
      const payload = res.data?.joinQueue;
      if (!payload) {
        // Joining again returns the same ticket: pressing again is safe.
        setMessage('Could not reach the shop: try again.');
        return;
      }
      const ue = payload.userErrors[0];
      if (ue?.code === 'ACCESS_CODE_INVALID') {
        if (!sentCode) setNeedsCode(true);
        else setCodeError(`“${sentCode}” is not a code for this sale, or another buyer has used it already.`);
        return;
      }
      if (ue?.code === 'PROOF_INVALID') proofRef.current = null;
      if (ue) {
        setMessage(joinMessage(ue));
        return;
      }
      onTicket(payload.ticket);
      if (payload.ticket.queue) setQueue(payload.ticket.queue);
    } finally {
      setWork(null);
      setBusy(false);
    }
  };

  const opensAt = new Date(queue.opensAt).getTime();
  const state = panelState(queue, ticket, position);
  const passLeft = ticket?.passExpiresAt ? new Date(ticket.passExpiresAt).getTime() - now : 0;
  const canJoin = !ticket && queue.status !== 'SOLD_OUT' && queue.status !== 'CLOSED';

  return (
    <div className="queue" data-testid={`queue-${key}`} data-live={live ? 'push' : 'poll'}>
      <div className="draw-head">
        <span className="queue-badge">{target.drop ? 'Drop queue' : 'Queue'}</span>
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
      <p className="queue-status" data-testid={`queue-status-${key}`} data-state={state} aria-live="polite">
        {queueText(state, ticket, !!target.drop)}
      </p>
      {state === 'waiting' && position != null && (
        <div className="queue-position" data-testid={`queue-position-${key}`} data-position={position} aria-live="polite">
          <strong>#{position}</strong> in line
          {queue.admitPerMinute > 0 && <span> · about {formatEta(Math.ceil((position * 60) / queue.admitPerMinute))}</span>}
          <div className="bar" aria-hidden="true">
            <div className="bar-fill" style={{ width: `${Math.round((queue.admittedThrough / Math.max(1, ticket.number)) * 100)}%` }} />
          </div>
        </div>
      )}
      {work && (
        <div
          className="queue-work"
          data-testid={`queue-work-${key}`}
          data-progress={Math.round(work.progress * 100)}
          role="progressbar"
          aria-valuemin={0}
          aria-valuemax={100}
          aria-valuenow={Math.round(work.progress * 100)}
          aria-label="Checking this browser"
        >
          Checking this browser (a puzzle the queue asks of everyone, to keep bots out): {Math.round(work.progress * 100)}%
          <div className="bar" aria-hidden="true">
            <div className="bar-fill" style={{ width: `${Math.round(work.progress * 100)}%` }} />
          </div>
        </div>
      )}
      {state === 'turn' && (
        <p className="turn" data-testid={`queue-turn-${key}`} data-expires-at={ticket.passExpiresAt}>
          It's your turn: buy within{' '}
          <span className="countdown small" role="timer">
            {formatLeft(passLeft)}
          </span>
        </p>
      )}
      {canJoin && !needsCode && (
        <button type="button" className="btn primary wide" data-testid={`queue-join-${key}`} disabled={!signedIn || busy} onClick={join}>
          {signedIn ? (busy ? 'Joining…' : 'Join the queue') : 'Sign in to join'}
        </button>
      )}
      {canJoin && needsCode && (
        <form className="queue-code" onSubmit={join} noValidate>
          <label htmlFor={codeId}>This is a presale: joining takes an access code, one per buyer.</label>
          <div className="queue-code-row">
            <input
              id={codeId}
              ref={codeInput}
              data-testid={`queue-code-${key}`}
              value={code}
              onChange={(e) => {
                setCode(e.target.value);
                setCodeError(null);
              }}
              autoComplete="off"
              autoCapitalize="characters"
              spellCheck={false}
              placeholder="Access code"
              aria-invalid={codeError ? 'true' : undefined}
              aria-describedby={codeError ? `${codeId}-error` : undefined}
            />
            <button type="submit" className="btn primary" data-testid={`queue-code-submit-${key}`} disabled={busy}>
              {busy ? 'Joining…' : 'Join with this code'}
            </button>
          </div>
          {codeError && (
            <p className="queue-code-error" id={`${codeId}-error`} data-testid={`queue-code-error-${key}`} role="alert">
              {codeError}
            </p>
          )}
        </form>
      )}
      {message && (
        <p className="status status-warn" role="status">
          {message}
        </p>
      )}
      <SeedProof
        kind="queue"
        id={key}
        seedHash={queue.seedHash}
        seed={queue.seed}
        open={false}
        summary="How the pre-queue is shuffled"
        hashLabel="Seed hash, published when the drop was created"
        seedLabel="Seed, revealed at the opening"
        before="Everyone who joins before the opening gets a place drawn from this seed, fixed before anyone joined; after the opening, first come, first served."
        after="The pre-queue was shuffled with this seed at the opening; after it, first come, first served."
        verify={`dropline verify-queue ${target.drop ? `--drop ${key}` : `--sku ${key}`}`}
      />
    </div>
  );
}

// newer is the later of two states of one queue: admittedThrough never
// goes back, and a ticket's answer may be older than the last push.
function newer(cur, q) {
  if (!q) return cur;
  if (!cur) return q;
  if (q.admittedThrough < cur.admittedThrough) return cur;
  if (cur.status === 'SOLD_OUT' && q.status !== 'SOLD_OUT' && q.admittedThrough === cur.admittedThrough) return cur;
  return { ...q, seed: q.seed ?? cur.seed };
}

function joinMessage(ue) {
  switch (ue.code) {
    case 'PROOF_INVALID':
      return 'The browser check ran out of time: press Join again.';
    case 'QUEUE_FULL':
      return 'The queue is full: no more places are given.';
    case 'RATE_LIMITED':
      return `Too many tries: wait ${ue.retryAfterSeconds ?? 1}s, then try again.`;
    default:
      return ue.message;
  }
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

function queueText(state, ticket, drop) {
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
      return drop ? 'Your pass lets you buy one of the products below.' : 'Your pass lets you buy (Buy below).';
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

function formatEta(seconds) {
  if (seconds < 60) return `${Math.max(1, seconds)} s`;
  return `${Math.round(seconds / 60)} min`;
}
