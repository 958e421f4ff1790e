// urql with Graphcache against Dropline: subscriptions over graphql-ws
// (graphql-transport-ws) update the normalised cache, and a cache-only
// query sees them without a refetch.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { Client, fetchExchange, subscriptionExchange, gql } from '@urql/core';
import { cacheExchange } from '@urql/exchange-graphcache';
import { pipe, subscribe } from 'wonka';
import { createClient as createWSClient } from 'graphql-ws';
import WebSocket from 'ws';
import { endpoint, wsEndpoint, token, recordingFetch, reserveAs, until } from './env.mjs';

const SKU = 'URQL-1';

// makeClient is the setup docs/clients.md shows.
function makeClient({ bearer, fetch }) {
  const ws = createWSClient({
    url: wsEndpoint(),
    webSocketImpl: WebSocket,
    connectionParams: () => ({ Authorization: `Bearer ${bearer()}` }),
  });
  const client = new Client({
    url: endpoint(),
    fetch,
    fetchOptions: () => ({ headers: { Authorization: `Bearer ${bearer()}` } }),
    exchanges: [
      cacheExchange({ keys: { Money: () => null } }), // every other type has an id
      fetchExchange,
      subscriptionExchange({
        forwardSubscription: (request) => ({
          subscribe: (sink) => ({ unsubscribe: ws.subscribe({ ...request, query: request.query || '' }, sink) }),
        }),
      }),
    ],
  });
  return { client, ws };
}

const PRODUCT = gql`
  query Product($sku: ID!) {
    product(sku: $sku) { id sku name price { amount currency } stock { id available held sold total } }
  }
`;
const STOCK_CHANGED = gql`
  subscription StockChanged($skus: [ID!]!) {
    stockChanged(skus: $skus) { id available held sold total updatedAt }
  }
`;

let ws;
after(() => ws?.dispose());

test('a stockChanged payload updates the Graphcache query without a refetch', async () => {
  const fetch = recordingFetch();
  const made = makeClient({ bearer: () => token('urql'), fetch });
  ws = made.ws;
  const { client } = made;

  const first = await client.query(PRODUCT, { sku: SKU }).toPromise();
  assert.equal(first.error, undefined);
  const { available, held } = first.data.product.stock;
  assert.equal(fetch.requests.length, 1);

  const seen = until(5000, 'the cached query to show the other buyer\'s hold');
  const query = pipe(
    client.query(PRODUCT, { sku: SKU }, { requestPolicy: 'cache-only' }),
    subscribe(({ data }) => { if (data?.product?.stock.available === available - 2) seen.resolve(data); }),
  );
  const live = until(5000, 'the first stockChanged value');
  const sub = pipe(
    client.subscription(STOCK_CHANGED, { skus: [SKU] }),
    subscribe((r) => (r.error ? live.reject(new Error(`stockChanged: ${r.error.message}`, { cause: r.error })) : live.resolve())),
  );
  await live.done;

  await reserveAs(token('watcher'), SKU, 2);
  const shown = await seen.done;
  assert.equal(shown.product.stock.held, held + 2);
  assert.equal(fetch.requests.length, 1, 'no HTTP request after the first: the payload updated the cache');
  query.unsubscribe();
  sub.unsubscribe();
});
