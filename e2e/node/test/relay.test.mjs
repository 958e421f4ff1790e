// relay-runtime against Dropline: the store is keyed by global id, a
// stockChanged payload updates the record every query reads without a
// refetch, and node(id:) refetches any record by that id.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import relay from 'relay-runtime';
import { createClient } from 'graphql-ws';
import WebSocket from 'ws';
import productQuery from './relay/__generated__/stockProductQuery.graphql.js';
import refetchQuery from './relay/__generated__/stockRefetchQuery.graphql.js';
import liveSubscription from './relay/__generated__/stockLiveSubscription.graphql.js';
import { endpoint, wsEndpoint, token, recordingFetch, reserveAs, until } from './env.mjs';

const { Environment, Network, Observable, RecordSource, Store, createOperationDescriptor, fetchQuery, requestSubscription } = relay;
const SKU = 'RELAY-1';

// makeEnvironment is the setup docs/clients.md shows: queries and
// mutations over fetch, subscriptions over graphql-ws.
function makeEnvironment({ bearer, fetch }) {
  const ws = createClient({
    url: wsEndpoint(),
    webSocketImpl: WebSocket,
    connectionParams: () => ({ Authorization: `Bearer ${bearer()}` }),
  });
  const fetchFn = async (params, variables) => {
    const res = await fetch(endpoint(), {
      method: 'POST',
      headers: { 'Content-Type': 'application/json', Accept: 'application/graphql-response+json', Authorization: `Bearer ${bearer()}` },
      body: JSON.stringify({ query: params.text, operationName: params.name, variables }),
    });
    return res.json();
  };
  const subscribeFn = (params, variables) => Observable.create((sink) =>
    ws.subscribe({ query: params.text, operationName: params.name, variables }, sink));
  // Relay keys records by their id field: Dropline's ids are global.
  const environment = new Environment({ network: Network.create(fetchFn, subscribeFn), store: new Store(new RecordSource()) });
  return { environment, ws };
}

let ws;
after(() => ws?.dispose());

test('the store is keyed by global id; a stockChanged payload updates it; node(id:) refetches', async () => {
  const fetch = recordingFetch();
  const made = makeEnvironment({ bearer: () => token('relay'), fetch });
  ws = made.ws;
  const { environment } = made;

  const data = await fetchQuery(environment, productQuery, { sku: SKU }).toPromise();
  const stockID = data.product.stock.id;
  const source = environment.getStore().getSource();
  assert.equal(source.get(data.product.id).__typename, 'Product', 'the product record lives under its global id');
  assert.equal(source.get(stockID).__typename, 'Stock');
  assert.equal(Buffer.from(stockID, 'base64').toString(), `Stock:${SKU}`);
  const { available, held } = data.product.stock;

  // Read the query from the store and be told when its data changes.
  const operation = createOperationDescriptor(productQuery, { sku: SKU });
  const retain = environment.retain(operation);
  const seen = until(5000, 'the store to show the other buyer\'s hold');
  const watch = environment.subscribe(environment.lookup(operation.fragment), (snapshot) => {
    if (snapshot.data?.product?.stock.available === available - 5) seen.resolve(snapshot.data);
  });
  const live = until(5000, 'the first stockChanged value');
  const sub = requestSubscription(environment, {
    subscription: liveSubscription,
    variables: { skus: [SKU] },
    onNext: () => live.resolve(),
    onError: (e) => live.reject(e),
  });
  await live.done;

  const before = fetch.requests.length;
  await reserveAs(token('watcher'), SKU, 5);
  const shown = await seen.done;
  assert.equal(shown.product.stock.held, held + 5);
  assert.equal(fetch.requests.length, before, 'no HTTP request: the payload updated the record');
  sub.dispose();

  // node(id:) refetches the same record.
  await reserveAs(token('watcher'), SKU, 1); // no subscription now: the store is stale
  const again = until(5000, 'the refetch to reach the watched query');
  watch.dispose();
  const watch2 = environment.subscribe(environment.lookup(operation.fragment), (snapshot) => {
    if (snapshot.data?.product?.stock.available === available - 6) again.resolve();
  });
  const refetched = await fetchQuery(environment, refetchQuery, { id: stockID }, { fetchPolicy: 'network-only' }).toPromise();
  assert.equal(refetched.node.id, stockID);
  assert.equal(refetched.node.available, available - 6);
  await again.done;
  watch2.dispose();
  retain.dispose();
});
