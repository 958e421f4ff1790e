// The GraphQL side of the shop: one urql client per signed-in buyer, with
// queries and mutations over HTTP (POST /graphql) and subscriptions over
// graphql-transport-ws (the graphql-ws library) on the same path.
import { Client, createRequest, fetchExchange, stringifyDocument, subscriptionExchange } from '@urql/core';
import { persistedExchange } from '@urql/exchange-persisted';
import { createContext } from 'react';
import { createClient as createWSClient } from 'graphql-ws';
import manifest from '../persisted-query-manifest.json';

export * from './operations.js';

// The id of each document, by the text urql sends for it (manifest.mjs
// computes both as urql does). Every operation is sent by id first: a
// server running trusted documents knows it from the same manifest, one
// with automatic persisted queries answers PersistedQueryNotFound once and
// urql resends the text with it. Looked up rather than hashed, since the
// browser's SHA-256 (crypto.subtle) exists only on https and localhost.
const ids = new Map(manifest.operations.map((op) => [op.body, op.id]));

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
      persistedExchange({
        preferGetForPersistedQueries: false,
        enableForMutation: true,
        enableForSubscriptions: true,
        generateHash: async (query) => ids.get(query) ?? '',
      }),
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

// newIdempotencyKey returns a random key for one user action (a press of
// "Buy", "Pay" or "Check out"). It does not need crypto.randomUUID, which
// only exists on https and localhost.
export function newIdempotencyKey(kind = 'shop') {
  const b = crypto.getRandomValues(new Uint8Array(16));
  return `${kind}-` + Array.from(b, (x) => x.toString(16).padStart(2, '0')).join('');
}

// TokenContext carries the buyer's token (null: anonymous) to what asks the
// API outside urql.
export const TokenContext = createContext(null);

// LiveContext says whether the websocket is up: what is kept live by a
// subscription falls back to asking over HTTP while it is not.
export const LiveContext = createContext(false);

// poll sends one query over HTTP outside urql and returns its data, or
// null on any failure: for questions asked again and again on a timer
// (a draw's outcome), where urql's one-shot queries, torn down when
// answered, may cut a request off and leave an unhandled abort behind. It
// sends the query by id first, as the urql client does, and its text only
// when the server asks for it (PersistedQueryNotFound: a server with
// automatic persisted queries that has not seen it yet).
export async function poll(token, query, variables) {
  const doc = createRequest(query, {}).query;
  const id = ids.get(stringifyDocument(doc));
  const operationName = doc.definitions.find((d) => d.kind === 'OperationDefinition')?.name?.value;
  const send = async (withText) => {
    const res = await fetch(httpURL.href, {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...(token ? { Authorization: `Bearer ${token}` } : {}) },
      body: JSON.stringify({
        operationName,
        query: withText || !id ? query : undefined,
        variables,
        extensions: id ? { persistedQuery: { version: 1, sha256Hash: id } } : undefined,
      }),
    });
    return res.ok ? res.json() : null;
  };
  try {
    let body = await send(false);
    if (id && body?.errors?.some((e) => e.message === 'PersistedQueryNotFound')) {
      body = await send(true);
    }
    return body?.data ?? null;
  } catch {
    return null;
  }
}

