// GraphQL over SSE with the graphql-sse client (distinct connections mode:
// one POST with Accept: text/event-stream per subscription), under urql
// and Graphcache: stock and reservation changes update cached queries
// without a refetch, and reservationChanged completes after a final status.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { Client, fetchExchange, subscriptionExchange, gql } from '@urql/core';
import { cacheExchange } from '@urql/exchange-graphcache';
import { onEnd, pipe, subscribe } from 'wonka';
import { createClient as createSSEClient } from 'graphql-sse';
import { endpoint, gql as plain, token, recordingFetch, reserveAs, until } from './env.mjs';

const SKU = 'SSE-1';

// makeClient is the setup docs/clients.md shows for SSE.
function makeClient({ bearer, fetch }) {
  const sse = createSSEClient({
    url: endpoint(),
    headers: () => ({ Authorization: `Bearer ${bearer()}` }), // read per subscription
    retryAttempts: 0,
  });
  const client = new Client({
    url: endpoint(),
    fetch,
    fetchOptions: () => ({ headers: { Authorization: `Bearer ${bearer()}` } }),
    exchanges: [
      cacheExchange({ keys: { Money: () => null } }),
      fetchExchange,
      subscriptionExchange({
        forwardSubscription: (request) => ({
          subscribe: (sink) => ({ unsubscribe: sse.subscribe({ ...request, query: request.query || '' }, sink) }),
        }),
      }),
    ],
  });
  return { client, sse };
}

const made = makeClient({ bearer: () => token('sse'), fetch: recordingFetch() });
after(() => made.sse.dispose());

test('stockChanged over SSE updates the cached product', async () => {
  const { client } = made;
  const PRODUCT = gql`query Product($sku: ID!) { product(sku: $sku) { id sku stock { id available held sold total } } }`;
  const first = await client.query(PRODUCT, { sku: SKU }).toPromise();
  assert.equal(first.error, undefined);
  const { available } = first.data.product.stock;

  const seen = until(5000, 'the cached query to show the other buyer\'s hold');
  const query = pipe(
    client.query(PRODUCT, { sku: SKU }, { requestPolicy: 'cache-only' }),
    subscribe(({ data }) => { if (data?.product?.stock.available === available - 4) seen.resolve(); }),
  );
  const live = until(5000, 'the first stockChanged value');
  const sub = pipe(
    client.subscription(gql`subscription($s: [ID!]!) { stockChanged(skus: $s) { id available held sold total } }`, { s: [SKU] }),
    subscribe((r) => (r.error ? live.reject(new Error(`stockChanged: ${r.error.message}`, { cause: r.error })) : live.resolve())),
  );
  await live.done;
  await reserveAs(token('watcher'), SKU, 4);
  await seen.done;
  query.unsubscribe();
  sub.unsubscribe();
});

test('reservationChanged over SSE: HELD, then CANCELLED in the cache, then completion', async () => {
  const { client } = made;
  const RESERVE = gql`mutation($i: ReserveInput!) { reserve(input: $i) { reservation { id token status } userErrors { code message } } }`;
  const r = await client.mutation(RESERVE, { i: { sku: SKU, quantity: 1, idempotencyKey: randomUUID() } }).toPromise();
  assert.deepEqual(r.data.reserve.userErrors, []);
  const { token: resToken, id } = r.data.reserve.reservation;

  const RESERVATION = gql`query($t: ID!) { reservation(token: $t) { id token status quantity } }`;
  await client.query(RESERVATION, { t: resToken }).toPromise();
  const cancelled = until(5000, 'the cached reservation to turn CANCELLED');
  const query = pipe(
    client.query(RESERVATION, { t: resToken }, { requestPolicy: 'cache-only' }),
    subscribe(({ data }) => { if (data?.reservation?.status === 'CANCELLED') cancelled.resolve(data.reservation); }),
  );

  const statuses = [];
  const completed = until(5000, 'reservationChanged to complete');
  const held = until(5000, 'the first reservationChanged value');
  const sub = pipe(
    client.subscription(gql`subscription($t: ID!) { reservationChanged(token: $t) { id token status } }`, { t: resToken }),
    onEnd(() => completed.resolve()), // the server completes after a final status
    subscribe((res) => {
      if (res.error) return completed.reject(new Error(`reservationChanged: ${res.error.message}`, { cause: res.error }));
      statuses.push(res.data.reservationChanged.status);
      if (statuses.length === 1) held.resolve();
    }),
  );
  await held.done;
  // The holder cancels from elsewhere (another tab): only the stream tells this client.
  await plain('mutation($i: CancelInput!) { cancel(input: $i) { userErrors { code } } }', { i: { token: resToken } }, token('sse'));
  const got = await cancelled.done;
  assert.equal(got.id, id, 'the reservation is cached under its global id');
  await completed.done;
  assert.deepEqual(statuses, ['HELD', 'CANCELLED']);
  query.unsubscribe();
  sub.unsubscribe();
});
