// subscribe.mjs: the reference client (the graphql-ws library, as used by
// Apollo Client, urql and Relay) watching stock for Dropline's end-to-end
// tests.
//
//   node subscribe.mjs <ws-url> <token|-> <sku> [<sku>...]
//
// Prints every stockChanged payload as one JSON line on stdout, and
// {"error": ...} on failure (exit 2). Runs until stdin closes, then
// disposes the client and exits 0.
import { createClient } from 'graphql-ws';
import WebSocket from 'ws';

const [url, token, ...skus] = process.argv.slice(2);
if (!url || !token || skus.length === 0) {
  console.error('usage: node subscribe.mjs <ws-url> <token|-> <sku> [<sku>...]');
  process.exit(64);
}

const fail = (err) => {
  const error = err && typeof err === 'object' && 'code' in err
    ? { code: err.code, reason: err.reason }
    : Array.isArray(err) ? err : String(err);
  process.stdout.write(JSON.stringify({ error }) + '\n');
  process.exit(2);
};

const client = createClient({
  url,
  webSocketImpl: WebSocket,
  connectionParams: token === '-' ? undefined : { Authorization: `Bearer ${token}` },
  retryAttempts: 0,
  on: { error: fail },
});

const unsubscribe = client.subscribe(
  {
    query: 'subscription($s: [ID!]!) { stockChanged(skus: $s) { id sku available held sold total updatedAt } }',
    variables: { s: skus },
  },
  {
    next: (value) => process.stdout.write(JSON.stringify(value) + '\n'),
    error: fail,
    complete: () => process.exit(0),
  },
);

process.stdin.on('end', async () => {
  unsubscribe();
  await client.dispose();
  process.exit(0);
});
process.stdin.resume();
