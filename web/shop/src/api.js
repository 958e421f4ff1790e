// The GraphQL side of the shop: one urql client per signed-in buyer, with
// queries and mutations over HTTP (POST /graphql) and subscriptions over
// graphql-transport-ws (the graphql-ws library) on the same path.
import { Client, fetchExchange, subscriptionExchange } from '@urql/core';
import { createContext } from 'react';
import { createClient as createWSClient } from 'graphql-ws';

const httpURL = new URL('/graphql', window.location.href);
const wsURL = new URL(httpURL);
wsURL.protocol = httpURL.protocol === 'https:' ? 'wss:' : 'ws:';

// createShopClient returns the urql client for token (null: anonymous, which
// is enough for the catalogue and live stock) and a dispose function that
// closes its websocket. onLive(bool) reports whether the websocket is up.
export function createShopClient(token, onLive) {
  // A replaced client's last "closed" must not hide that its successor is
  // already connected.
  let disposed = false;
  const live = (up) => !disposed && onLive(up);
  const ws = createWSClient({
    url: wsURL.href,
    // Browsers cannot set headers on a websocket: the token goes in the
    // connection_init payload, where the server looks for it.
    connectionParams: token ? { Authorization: `Bearer ${token}` } : undefined,
    lazy: false,
    keepAlive: 10_000,
    retryAttempts: Infinity,
    shouldRetry: () => true,
    retryWait: async (retries) => {
      await new Promise((r) => setTimeout(r, Math.min(1000 * 2 ** retries, 10_000)));
    },
    on: {
      connected: () => live(true),
      closed: () => live(false),
    },
  });
  const client = new Client({
    url: httpURL.href,
    // POST for everything: queries stay out of URLs and logs.
    preferGetMethod: false,
    requestPolicy: 'network-only',
    fetchOptions: () => ({
      headers: token ? { Authorization: `Bearer ${token}` } : {},
    }),
    exchanges: [
      fetchExchange,
      subscriptionExchange({
        forwardSubscription(request) {
          const input = { ...request, query: request.query || '' };
          return {
            subscribe(sink) {
              const unsubscribe = ws.subscribe(input, sink);
              return { unsubscribe };
            },
          };
        },
      }),
    ],
  });
  return {
    client,
    dispose: () => {
      disposed = true;
      ws.dispose();
    },
  };
}

const drawFields = 'closesAt status entries seedHash seed winners winnerHoldSeconds';
const queueFields = 'id status opensAt admittedThrough waiting admitPerMinute seedHash seed';

export const CATALOGUE = `
  query Catalogue {
    products(first: 24) {
      edges {
        node {
          id sku name maxPerUser saleStartsAt saleEndsAt
          price { amount currency }
          stock { id sku available held sold total }
          draw { ${drawFields} }
          queue { ${queueFields} }
        }
      }
    }
  }`;

export const MY_HOLDS = `
  query MyHolds {
    myReservations(status: HELD, first: 50) {
      edges { node { token sku quantity status expiresAt createdAt extensions } }
    }
  }`;

export const STOCK = `
  subscription Stock($skus: [ID!]!) {
    stockChanged(skus: $skus) { id sku available held sold total }
  }`;

export const WATCH = `
  subscription Watch($token: ID!) {
    reservationChanged(token: $token) { token sku status expiresAt committedAt extensions }
  }`;

export const RESERVATION = `
  query Reservation($token: ID!) {
    reservation(token: $token) { token sku status expiresAt committedAt }
  }`;

const fields = 'reservation { token sku quantity status expiresAt createdAt committedAt extensions } userErrors { code message retryAfterSeconds }';
export const RESERVE = `mutation Reserve($input: ReserveInput!) { reserve(input: $input) { ${fields} } }`;
export const EXTEND = `mutation Extend($input: ExtendReservationInput!) { extendReservation(input: $input) { reservation { token sku quantity status expiresAt createdAt committedAt extensions } userErrors { code message retryAfterSeconds } } }`;
export const COMMIT = `mutation Commit($input: CommitInput!) { commit(input: $input) { ${fields} } }`;
export const CANCEL = `mutation Cancel($input: CancelInput!) { cancel(input: $input) { ${fields} } }`;

// newIdempotencyKey returns a random key for one user action (a press of
// "Buy", "Pay" or "Check out"). It does not need crypto.randomUUID, which
// only exists on https and localhost.
export function newIdempotencyKey(kind = 'shop') {
  const b = crypto.getRandomValues(new Uint8Array(16));
  return `${kind}-` + Array.from(b, (x) => x.toString(16).padStart(2, '0')).join('');
}

const resFields = 'token sku quantity status expiresAt createdAt committedAt extensions';
const entryFields = `sku quantity position status holdSeconds joinedAt reservation { ${resFields} }`;

export const MY_WAITLIST = `query MyWaitlist { myWaitlist { ${entryFields} } }`;
export const JOIN_WAITLIST = `mutation JoinWaitlist($input: JoinWaitlistInput!) {
  joinWaitlist(input: $input) { entry { ${entryFields} } userErrors { code message retryAfterSeconds } } }`;
export const LEAVE_WAITLIST = `mutation LeaveWaitlist($input: LeaveWaitlistInput!) {
  leaveWaitlist(input: $input) { entry { ${entryFields} } userErrors { code message retryAfterSeconds } } }`;
export const WAITLIST = `subscription Waitlist($sku: ID!) { waitlistChanged(sku: $sku) { ${entryFields} } }`;

const drawEntryFields = `sku quantity status enteredAt place reservation { ${resFields} }`;
export const DRAW_INFO = `query DrawInfo($sku: ID!) { product(sku: $sku) { sku draw { ${drawFields} } } }`;
export const MY_DRAW_ENTRIES = `query MyDrawEntries { myDrawEntries { ${drawEntryFields} } }`;

// TokenContext carries the buyer's token (null: anonymous) to what asks the
// API outside urql.
export const TokenContext = createContext(null);

// poll sends one query over HTTP outside urql and returns its data, or
// null on any failure: for questions asked again and again on a timer
// (a draw's outcome), where urql's one-shot queries, torn down when
// answered, may cut a request off and leave an unhandled abort behind.
export async function poll(token, query, variables) {
  try {
    const res = await fetch(httpURL.href, {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...(token ? { Authorization: `Bearer ${token}` } : {}) },
      body: JSON.stringify({ query, variables }),
    });
    if (!res.ok) return null;
    const body = await res.json();
    return body.data ?? null;
  } catch {
    return null;
  }
}
export const ENTER_DRAW = `mutation EnterDraw($input: EnterDrawInput!) {
  enterDraw(input: $input) { entry { ${drawEntryFields} } userErrors { code message retryAfterSeconds } } }`;

const cartFields = 'cart { token status expiresAt createdAt lines { token sku quantity status expiresAt } } userErrors { code message field available retryAfterSeconds }';
export const RESERVE_CART = `mutation ReserveCart($input: ReserveCartInput!) { reserveCart(input: $input) { ${cartFields} } }`;
export const COMMIT_CART = `mutation CommitCart($input: CommitCartInput!) { commitCart(input: $input) { ${cartFields} } }`;
export const CANCEL_CART = `mutation CancelCart($input: CancelCartInput!) { cancelCart(input: $input) { ${cartFields} } }`;
export const EXTEND_CART = `mutation ExtendCart($input: ExtendCartInput!) { extendCart(input: $input) { ${cartFields} } }`;

const ticketFields = `number position etaSeconds status pass passExpiresAt pollAfterSeconds queue { ${queueFields} }`;
export const QUEUE_INFO = `query QueueInfo($sku: ID!) { product(sku: $sku) { sku queue { ${queueFields} } } }`;
export const MY_QUEUE_TICKET = `query MyQueueTicket($sku: ID!) { myQueueTicket(sku: $sku) { ${ticketFields} } }`;
export const QUEUE_CHALLENGE = `query QueueChallenge($sku: ID!) { queueChallenge(sku: $sku) { challenge bits expiresAt } }`;
export const JOIN_QUEUE = `mutation JoinQueue($input: JoinQueueInput!) {
  joinQueue(input: $input) { ticket { ${ticketFields} } userErrors { code message retryAfterSeconds } } }`;
