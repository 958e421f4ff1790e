// Entry point of the Dropline demo shop: what a drop looks like from a
// buyer's side. Everything is bundled by build.mjs into server/shop/dist and
// embedded in the Go binary; nothing here may reference another host.
import { StrictMode, useContext, useEffect, useMemo, useState } from 'react';
import { createRoot } from 'react-dom/client';
import { Provider, useQuery, useSubscription } from 'urql';
import { CATALOGUE, MY_DRAW_ENTRIES, MY_HOLDS, MY_QUEUE_TICKET, MY_WAITLIST, STOCK, TokenContext, createShopClient, poll } from './api.js';
import { loadToken, principalOf, saveToken } from './auth.js';
import { CartPanel, CartProvider } from './cart.jsx';
import { ProductCard } from './product.jsx';
import { SignIn } from './signin.jsx';
import './shop.css';

function App() {
  const [token, setToken] = useState(loadToken);
  const [live, setLive] = useState(false);
  // One client per buyer: a new token means a new websocket whose
  // connection_init carries it.
  const shop = useMemo(() => createShopClient(token, setLive), [token]);
  useEffect(() => () => shop.dispose(), [shop]);

  const signIn = (t) => {
    saveToken(t);
    setToken(t);
  };
  const user = token ? principalOf(token) ?? 'buyer' : null;

  return (
    <Provider value={shop.client}>
      <TokenContext.Provider value={token}>
        <header className="topbar">
          <div className="topbar-inner">
            <a className="brand" href="./">
              <span className="brand-mark" aria-hidden="true" />
              Dropline <span className="brand-sub">demo shop</span>
            </a>
            <SignIn user={user} onToken={signIn} />
          </div>
        </header>
        <main className="page">
          <section className="hero">
            <div>
              <h1>Today’s drop</h1>
              <p>
                Stock is live: every window sees it fall the moment someone buys. “Buy” holds a unit for you
                until the timer runs out; pay before it does, or it goes back on sale. Put several in the cart to
                hold them all or none, queue for a sold-out product to be handed the next unit that comes back, or
                enter a draw, whose winners are drawn from a seed published before it opens, or join the queue of a
                queued drop and buy on your turn.
              </p>
            </div>
            <span className={live ? 'live on' : 'live'} data-testid="live">
              <span className="dot" aria-hidden="true" />
              {live ? 'Live' : 'Connecting…'}
            </span>
          </section>
          <CartProvider key={token ?? 'anonymous'}>
            <CartPanel signedIn={!!token} />
            <Catalogue signedIn={!!token} />
          </CartProvider>
        </main>
        <footer className="footer">
          A demo storefront served by Dropline. GraphQL at <code>/graphql</code>, playground at <a href="/">/</a>.
        </footer>
      </TokenContext.Provider>
    </Provider>
  );
}

function Catalogue({ signedIn }) {
  const [{ data, error, fetching }] = useQuery({ query: CATALOGUE });
  const products = data?.products.edges.map((e) => e.node) ?? [];
  const skus = products.map((p) => p.sku);

  // Live stock for every SKU on the page, merged over what the query said.
  const [{ data: live }] = useSubscription(
    { query: STOCK, variables: { skus }, pause: skus.length === 0 },
    (prev = {}, d) => ({ ...prev, [d.stockChanged.sku]: d.stockChanged }),
  );

  // Holds this buyer already has (after a reload), by SKU.
  const [{ data: mine }] = useQuery({ query: MY_HOLDS, pause: !signedIn });
  const holds = useMemo(() => {
    const m = {};
    for (const e of mine?.myReservations.edges ?? []) {
      if (e.node.status === 'HELD' && !m[e.node.sku]) m[e.node.sku] = e.node;
    }
    return m;
  }, [mine]);

  // Waitlist entries this buyer already has, by SKU.
  const [{ data: lines }] = useQuery({ query: MY_WAITLIST, pause: !signedIn });
  const entries = useMemo(() => {
    const m = {};
    for (const e of lines?.myWaitlist ?? []) m[e.sku] = e;
    return m;
  }, [lines]);

  // Draw entries, by SKU.
  const [{ data: draws }] = useQuery({ query: MY_DRAW_ENTRIES, pause: !signedIn });
  const drawEntries = useMemo(() => {
    const m = {};
    for (const e of draws?.myDrawEntries ?? []) if (!m[e.sku]) m[e.sku] = e;
    return m;
  }, [draws]);

  // Queue tickets: asked for once per queued product on the page.
  const tickets = useTickets(signedIn, products);

  if (error && !data) {
    return <p className="notice error">Could not load the catalogue: {error.message}</p>;
  }
  if (fetching && !data) {
    return <p className="notice">Loading the drop…</p>;
  }
  if (products.length === 0) {
    return (
      <p className="notice">
        The catalogue is empty. Create the demo products with <code>dropline seed --demo</code>.
      </p>
    );
  }
  return (
    <div className="grid">
      {products.map((p, i) => (
        <ProductCard
          key={p.sku}
          index={i}
          product={p}
          stock={live?.[p.sku] ?? p.stock}
          signedIn={signedIn}
          existingHold={holds[p.sku]}
          existingEntry={entries[p.sku]}
          existingDrawEntry={drawEntries[p.sku]}
          existingTicket={tickets[p.sku]}
        />
      ))}
    </div>
  );
}

function useTickets(signedIn, products) {
  const token = useContext(TokenContext);
  const queued = products.filter((p) => p.queue).map((p) => p.sku).join(',');
  const [tickets, setTickets] = useState({});
  useEffect(() => {
    if (!signedIn || !queued) return;
    let stop = false;
    (async () => {
      for (const sku of queued.split(',')) {
        const t = (await poll(token, MY_QUEUE_TICKET, { sku }))?.myQueueTicket;
        if (t && !stop) setTickets((m) => ({ ...m, [sku]: t }));
      }
    })();
    return () => {
      stop = true;
    };
  }, [signedIn, queued, token]);
  return tickets;
}

createRoot(document.getElementById('shop')).render(
  <StrictMode>
    <App />
  </StrictMode>,
);
