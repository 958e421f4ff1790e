// Buyer sign-in. In dev mode the server mints buyer tokens at POST /dev/token
// (never admin ones); otherwise the integrator pastes a bearer token their own
// system issued. The token lives in sessionStorage, so two windows can be two
// buyers and closing the tab signs out.
const KEY = 'dropline.shop.token';

export function loadToken() {
  try {
    return sessionStorage.getItem(KEY);
  } catch {
    return null;
  }
}

export function saveToken(token) {
  try {
    if (token) sessionStorage.setItem(KEY, token);
    else sessionStorage.removeItem(KEY);
  } catch {
    // Storage may be disabled; the session then lasts as long as the page.
  }
}

// principalOf reads the subject of a JWT for display only: the server is the
// one that verifies it.
export function principalOf(token) {
  try {
    const part = token.split('.')[1].replace(/-/g, '+').replace(/_/g, '/');
    const claims = JSON.parse(atob(part.padEnd(part.length + ((4 - (part.length % 4)) % 4), '=')));
    return typeof claims.sub === 'string' ? claims.sub : null;
  } catch {
    return null;
  }
}

// hasDevSignIn tells whether this server offers dev sign-in: in dev mode a
// GET of /dev/token answers {"devSignIn": true}; otherwise it is 404.
export async function hasDevSignIn() {
  try {
    const res = await fetch('/dev/token', { cache: 'no-store' });
    return res.ok && (await res.json()).devSignIn === true;
  } catch {
    return false;
  }
}

export async function devSignIn(user) {
  const res = await fetch('/dev/token', {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ user }),
  });
  const body = await res.json().catch(() => ({}));
  if (!res.ok || !body.token) {
    throw new Error(body.error || `sign-in failed (HTTP ${res.status})`);
  }
  return body.token;
}
