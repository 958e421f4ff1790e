// Apollo Client against Dropline: a normalised InMemoryCache, subscriptions
// over GraphQLWsLink (graphql-transport-ws), automatic persisted queries
// over GET (queries) and POST (mutations), clientAwareness headers across
// origins, userErrors and idempotent retries.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { createHash, randomUUID } from 'node:crypto';
import { ApolloClient, ApolloLink, HttpLink, InMemoryCache, gql } from '@apollo/client';
import { GraphQLWsLink } from '@apollo/client/link/subscriptions';
import { PersistedQueryLink } from '@apollo/client/link/persisted-queries';
import { getMainDefinition } from '@apollo/client/utilities';
import { createClient } from 'graphql-ws';
import WebSocket from 'ws';
import { endpoint, wsEndpoint, token, origin, recordingFetch, reserveAs, until } from './env.mjs';

const SKU = 'APOLLO-1';

// makeClient is the setup docs/clients.md shows: one link for HTTP (with
// persisted queries), one for websockets, split on the operation type.
function makeClient({ bearer, fetch }) {
  const wsClient = createClient({
    url: wsEndpoint(),
    webSocketImpl: WebSocket, // a browser has its own
    // Read once per connection: a fresh token after a 4403 close is picked up
    // when graphql-ws reconnects.
    connectionParams: () => (bearer() ? { Authorization: `Bearer ${bearer()}` } : {}),
  });
  const http = ApolloLink.from([
    new PersistedQueryLink({
      sha256: (q) => createHash('sha256').update(q).digest('hex'),
      useGETForHashedQueries: true,
    }),
    new HttpLink({
      uri: endpoint(),
      fetch,
      headers: { ...(bearer() ? { Authorization: `Bearer ${bearer()}` } : {}), Origin: origin() }, // a browser sets Origin itself
    }),
  ]);
  const link = ApolloLink.split(
    ({ query }) => {
      const def = getMainDefinition(query);
      return def.kind === 'OperationDefinition' && def.operation === 'subscription';
    },
    new GraphQLWsLink(wsClient),
    http,
  );
  const client = new ApolloClient({
    link,
    cache: new InMemoryCache(), // normalises every object by __typename + id
    clientAwareness: { name: 'dropline-e2e', version: '1.0.0' },
  });
  return { client, wsClient };
}

const PRODUCT = gql`
  query Product($sku: ID!) {
    product(sku: $sku) { id sku name stock { id available held sold total } }
  }
`;
const STOCK_CHANGED = gql`
  subscription StockChanged($skus: [ID!]!) {
    stockChanged(skus: $skus) { id available held sold total updatedAt }
  }
`;
const RESERVE = gql`
  mutation Reserve($input: ReserveInput!) {
    reserve(input: $input) {
      reservation { id token status quantity expiresAt }
      userErrors { code field message }
    }
  }
`;

const clients = [];
after(async () => {
  for (const { client, wsClient } of clients) {
    client.stop();
    await wsClient.dispose();
  }
});

test('a stockChanged payload updates the cached product without a refetch', async () => {
  const fetch = recordingFetch();
  const c = makeClient({ bearer: () => token('apollo'), fetch });
  clients.push(c);
  const { client } = c;

  const { data } = await client.query({ query: PRODUCT, variables: { sku: SKU } });
  const stockRef = client.cache.identify(data.product.stock);
  assert.match(stockRef, /^Stock:/);
  assert.ok(client.cache.extract()[client.cache.identify(data.product)], 'the product is normalised under its global id');
  const { available, held } = data.product.stock;

  // Watch the query from the cache only: anything new must come from the
  // subscription.
  const seen = until(5000, 'the watched query to show the other buyer\'s hold');
  const watch = client.watchQuery({ query: PRODUCT, variables: { sku: SKU }, fetchPolicy: 'cache-only' })
    .subscribe({ next: ({ data }) => { if (data?.product?.stock.available === available - 3) seen.resolve(data); } });
  const first = until(5000, 'the first stockChanged value');
  const sub = client.subscribe({ query: STOCK_CHANGED, variables: { skus: [SKU] } })
    .subscribe({ next: () => first.resolve(), error: (e) => first.reject(e) });
  await first.done;

  const fetchesBefore = fetch.requests.length;
  await reserveAs(token('watcher'), SKU, 3); // another buyer, outside this client
  const shown = await seen.done;
  assert.equal(shown.product.stock.held, held + 3);
  assert.equal(fetch.requests.length, fetchesBefore, 'no HTTP request: the websocket payload updated the cache');
  watch.unsubscribe();
  sub.unsubscribe();
});

test('persisted queries: hashes over GET for queries, POST for mutations', async () => {
  const fetch = recordingFetch();
  const c = makeClient({ bearer: () => token('apollo'), fetch });
  clients.push(c);
  const { client } = c;
  // A query nobody has sent yet: the first hash misses, the link resends it
  // with its text, and the next client's hash hits.
  const query = gql(`query ApqProbe_${randomUUID().replaceAll('-', '')}($sku: ID!) { product(sku: $sku) { id sku name } }`);
  const { data } = await client.query({ query, variables: { sku: SKU } });
  assert.equal(data.product.sku, SKU);
  const [miss, register] = fetch.requests;
  assert.equal(miss.method, 'GET');
  assert.ok(miss.url.searchParams.get('extensions').includes('sha256Hash'));
  assert.equal(miss.url.searchParams.get('query'), null, 'the first try sends the hash only');
  assert.ok(register.url.searchParams.get('query') || JSON.parse(register.body).query, 'the retry carries the query');

  const fetch2 = recordingFetch();
  const c2 = makeClient({ bearer: () => token('apollo'), fetch: fetch2 });
  clients.push(c2);
  await c2.client.query({ query, variables: { sku: SKU } });
  assert.equal(fetch2.requests.length, 1, 'a known hash is one GET');
  assert.equal(fetch2.requests[0].method, 'GET');
  assert.equal(fetch2.requests[0].url.searchParams.get('query'), null);

  // Mutations are never sent over GET (the server answers 405).
  const r = await c2.client.mutate({ mutation: RESERVE, variables: { input: { sku: SKU, quantity: 1, idempotencyKey: randomUUID() } } });
  assert.deepEqual(r.data.reserve.userErrors, []);
  assert.ok(fetch2.requests.slice(1).every((q) => q.method === 'POST'));
});

test('clientAwareness headers pass the CORS preflight', async () => {
  const fetch = recordingFetch();
  const c = makeClient({ bearer: () => token('apollo'), fetch });
  clients.push(c);
  await c.client.query({ query: PRODUCT, variables: { sku: SKU }, fetchPolicy: 'network-only' });
  const sent = fetch.requests.at(-1);
  assert.equal(sent.headers.get('apollographql-client-name'), 'dropline-e2e');
  assert.equal(sent.headers.get('apollographql-client-version'), '1.0.0');

  // What a browser would ask before sending those headers from another origin.
  const nonSimple = [...sent.headers.keys()].filter((h) => !['accept', 'origin', 'content-language', 'accept-language'].includes(h));
  const res = await globalThis.fetch(endpoint(), {
    method: 'OPTIONS',
    headers: { Origin: origin(), 'Access-Control-Request-Method': 'POST', 'Access-Control-Request-Headers': nonSimple.join(', ') },
  });
  assert.equal(res.status, 204);
  assert.equal(res.headers.get('access-control-allow-origin'), origin());
  const allowed = res.headers.get('access-control-allow-headers').toLowerCase().split(/,\s*/);
  for (const h of nonSimple) assert.ok(allowed.includes(h), `the preflight allows ${h}`);
});

test('userErrors are data; an idempotency key makes the retry safe', async () => {
  const c = makeClient({ bearer: () => token('apollo'), fetch: recordingFetch() });
  clients.push(c);
  const { client } = c;
  const tooMany = await client.mutate({ mutation: RESERVE, variables: { input: { sku: SKU, quantity: 50 } } }); // others hold some of the 50
  assert.equal(tooMany.error, undefined, 'a business refusal is not a GraphQL error');
  assert.equal(tooMany.data.reserve.reservation, null);
  assert.equal(tooMany.data.reserve.userErrors[0].code, 'OUT_OF_STOCK');

  const key = randomUUID(); // one per click; the retry of that click reuses it
  const input = { sku: SKU, quantity: 1, idempotencyKey: key };
  const first = await client.mutate({ mutation: RESERVE, variables: { input } });
  const retry = await client.mutate({ mutation: RESERVE, variables: { input } });
  assert.equal(retry.data.reserve.reservation.token, first.data.reserve.reservation.token, 'the same hold, not a second one');

  // Without a principal a mutation answers a userError too; a query that
  // needs one (myReservations) answers a top-level error, which Apollo
  // raises.
  const anon = makeClient({ bearer: () => '', fetch: recordingFetch() });
  clients.push(anon);
  const refused = await anon.client.mutate({ mutation: RESERVE, variables: { input: { sku: SKU, quantity: 1 } } });
  assert.equal(refused.data.reserve.userErrors[0].code, 'UNAUTHENTICATED');
  await assert.rejects(
    anon.client.query({ query: gql`{ myReservations { edges { node { id } } } }` }),
    (err) => err.errors?.[0]?.extensions?.code === 'UNAUTHENTICATED',
  );
});
