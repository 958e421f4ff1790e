// env.mjs: what the Go test that starts Dropline hands the Node tests.
//
//   DROPLINE_URL     the server's base URL (http://127.0.0.1:port)
//   DROPLINE_TOKENS  a JSON object of bearer tokens by name
//                    ({"buyer": "...", "admin": "..."})
//   DROPLINE_ORIGIN  a browser origin the server allows cross-origin
export function baseURL() {
  const url = process.env.DROPLINE_URL;
  if (!url) throw new Error('DROPLINE_URL is not set: the Go test that starts Dropline sets it');
  return url.replace(/\/$/, '');
}

export const endpoint = () => baseURL() + '/graphql';
export const wsEndpoint = () => endpoint().replace(/^http/, 'ws');

export function token(name) {
  const tokens = JSON.parse(process.env.DROPLINE_TOKENS || '{}');
  if (!tokens[name]) throw new Error(`DROPLINE_TOKENS has no ${name} token`);
  return tokens[name];
}

export const origin = () => process.env.DROPLINE_ORIGIN || 'http://localhost:3000';

// gql runs one operation with plain fetch, outside the client under test:
// the "other buyer" whose purchases the client must learn about only
// through its subscription.
export async function gql(query, variables, bearer) {
  const res = await fetch(endpoint(), {
    method: 'POST',
    headers: {
      'Content-Type': 'application/json',
      ...(bearer ? { Authorization: `Bearer ${bearer}` } : {}),
    },
    body: JSON.stringify({ query, variables }),
  });
  const body = await res.json();
  if (body.errors) throw new Error(`${query}: ${JSON.stringify(body.errors)}`);
  return body.data;
}

// reserveAs holds units for another principal and returns the reservation.
export async function reserveAs(bearer, sku, quantity) {
  const data = await gql(
    'mutation($i: ReserveInput!) { reserve(input: $i) { reservation { id token status } userErrors { code message } } }',
    { i: { sku, quantity, idempotencyKey: crypto.randomUUID() } },
    bearer,
  );
  if (data.reserve.userErrors.length) throw new Error(JSON.stringify(data.reserve.userErrors));
  return data.reserve.reservation;
}

// recordingFetch is fetch that remembers every request it sent. It drops
// the abort signal: urql aborts a request when its result has been
// delivered, and under Node's fetch that abort of a finished request can
// surface as an unhandled AbortError, which node:test counts as a failure.
// Browsers only log it.
export function recordingFetch() {
  const requests = [];
  const f = async (input, { signal, ...init } = {}) => {
    const url = new URL(typeof input === 'string' ? input : input.url);
    requests.push({ method: init.method || 'GET', url, headers: new Headers(init.headers), body: init.body });
    return fetch(input, init);
  };
  f.requests = requests;
  return f;
}

// until resolves with the first value of a callback-fed stream for which
// pred holds, or rejects after ms.
export function until(ms, what) {
  let resolve;
  let reject;
  const done = new Promise((res, rej) => { resolve = res; reject = rej; });
  const timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms waiting for ${what}`)), ms);
  done.finally(() => clearTimeout(timer)).catch(() => {});
  return { done, resolve, reject };
}
