// Entry point of the Dropline demo shop: what a drop looks like from a
// buyer's side. Everything is bundled by build.mjs into server/shop/dist and
// embedded in the Go binary; nothing here may reference another host.
import { StrictMode, useCallback, useContext, useEffect, useMemo, useState } from 'react';
import { createRoot } from 'react-dom/client';
import { Provider, useQuery, useSubscription } from 'urql';
import { CATALOGUE, LiveContext, MY_DRAW_ENTRIES, MY_HOLDS, MY_QUEUE_TICKET, MY_WAITLIST, STOCK, TokenContext, createShopClient, poll } from './api.js';
import { loadToken, principalOf, saveToken } from './auth.js';
import { CartPanel, CartProvider } from './cart.jsx';
import { ProductCard } from './product.jsx';
import { QueuePanel, queueTarget } from './queue.jsx';
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
        <LiveContext.Provider value={live}>
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
                  queued drop (some are presales, with an access code) and buy on your turn.
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
        </LiveContext.Provider>
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

  // Queue tickets, by queue: asked for once per queue on the page, then
  // kept by the queue's panel; a drop's one ticket serves all its cards.
  const [tickets, setTicket] = useTickets(signedIn, products);

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
  const card = (p, i) => (
    <ProductCard
      key={p.sku}
      index={i}
      product={p}
      stock={live?.[p.sku] ?? p.stock}
      signedIn={signedIn}
      existingHold={holds[p.sku]}
      existingEntry={entries[p.sku]}
      existingDrawEntry={drawEntries[p.sku]}
      ticket={p.queue ? (tickets[p.queue.id] ?? null) : null}
      onTicket={p.queue ? setTicket(p.queue.id) : undefined}
    />
  );
  // The SKUs of a drop sold behind one queue are shown together, under
  // that queue; every other product is a card of the grid.
  const single = [];
  const drops = new Map();
  products.forEach((p, i) => {
    if (p.drop && p.queue?.id === `drop:${p.drop.dropId}`) {
      const d = drops.get(p.drop.dropId) ?? { drop: p.drop, queue: p.queue, cards: [] };
      d.cards.push(card(p, i));
      drops.set(p.drop.dropId, d);
    } else {
      single.push(card(p, i));
    }
  });
  return (
    <>
      <div className="grid">{single}</div>
      {[...drops.values()].map(({ drop, queue, cards }) => (
        <section className="drop" key={drop.dropId} data-testid={`drop-${drop.dropId}`} aria-labelledby={`drop-title-${drop.dropId}`}>
          <div className="drop-head">
            <h2 id={`drop-title-${drop.dropId}`}>{drop.name}</h2>
            <p>
              One queue for the whole drop: one pass buys any of its {cards.length} products, and {drop.maxPerUser} per
              person across them.
            </p>
          </div>
          <QueuePanel initial={queue} signedIn={signedIn} ticket={tickets[queue.id] ?? null} onTicket={setTicket(queue.id)} />
          <div className="grid">{cards}</div>
        </section>
      ))}
    </>
  );
}

// useTickets returns the buyer's queue tickets by queue id, each asked for
// once, and setTicket(queueId), which takes a ticket or a function of the
// last one.
function useTickets(signedIn, products) {
  const token = useContext(TokenContext);
  const queues = [...new Set(products.filter((p) => p.queue).map((p) => p.queue.id))].join(',');
  const [tickets, setTickets] = useState({});
  useEffect(() => {
    if (!signedIn || !queues) return;
    let stop = false;
    (async () => {
      for (const id of queues.split(',')) {
        const t = (await poll(token, MY_QUEUE_TICKET, queueTarget({ id })))?.myQueueTicket;
        // A ticket the page got meanwhile (a join) is newer.
        if (t && !stop) setTickets((m) => (m[id] ? m : { ...m, [id]: t }));
      }
    })();
    return () => {
      stop = true;
    };
  }, [signedIn, queues, token]);
  const setters = useMemo(() => new Map(), []);
  const setTicket = useCallback(
    (id) => {
      if (!setters.has(id)) {
        setters.set(id, (t) => setTickets((m) => ({ ...m, [id]: typeof t === 'function' ? t(m[id]) : t })));
      }
      return setters.get(id);
    },
    [setters],
  );
  return [tickets, setTicket];
}

createRoot(document.getElementById('shop')).render(
  <StrictMode>
    <App />
  </StrictMode>,
);
