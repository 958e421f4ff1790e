// The shop's GraphQL documents: every operation the page sends, and
// nothing else. manifest.mjs lists them in persisted-query-manifest.json,
// the trusted documents a server runs with DROPLINE_TRUSTED_DOCUMENTS, and a
// Go test (server/shop) fails when the two differ. Write each document out
// in full (no interpolation), so that test can read it.

export const CATALOGUE = `
  query Catalogue {
    products(first: 24) {
      edges {
        node {
          id sku name maxPerUser saleStartsAt saleEndsAt
          price { amount currency }
          stock { id sku available held sold total }
          draw { closesAt status entries seedHash seed winners winnerHoldSeconds }
          queue { id status opensAt admittedThrough waiting admitPerMinute seedHash seed }
          drop { id dropId name maxPerUser }
        }
      }
    }
  }`;

export const MY_HOLDS = `
  query MyHolds {
    myReservations(status: HELD, first: 50) {
      edges { node { token sku quantity status expiresAt createdAt extensions } }
    }
  }`;

export const STOCK = `
  subscription Stock($skus: [ID!]!) {
    stockChanged(skus: $skus) { id sku available held sold total }
  }`;

export const WATCH = `
  subscription Watch($token: ID!) {
    reservationChanged(token: $token) { token sku status expiresAt committedAt extensions }
  }`;

export const RESERVATION = `
  query Reservation($token: ID!) {
    reservation(token: $token) { token sku status expiresAt committedAt }
  }`;

export const RESERVE = `mutation Reserve($input: ReserveInput!) { reserve(input: $input) { reservation { token sku quantity status expiresAt createdAt committedAt extensions } userErrors { code message retryAfterSeconds } } }`;

export const EXTEND = `mutation Extend($input: ExtendReservationInput!) { extendReservation(input: $input) { reservation { token sku quantity status expiresAt createdAt committedAt extensions } userErrors { code message retryAfterSeconds } } }`;

export const COMMIT = `mutation Commit($input: CommitInput!) { commit(input: $input) { reservation { token sku quantity status expiresAt createdAt committedAt extensions } userErrors { code message retryAfterSeconds } } }`;

export const CANCEL = `mutation Cancel($input: CancelInput!) { cancel(input: $input) { reservation { token sku quantity status expiresAt createdAt committedAt extensions } userErrors { code message retryAfterSeconds } } }`;

export const MY_WAITLIST = `query MyWaitlist { myWaitlist { sku quantity position status holdSeconds joinedAt reservation { token sku quantity status expiresAt createdAt committedAt extensions } } }`;

export const JOIN_WAITLIST = `mutation JoinWaitlist($input: JoinWaitlistInput!) {
  joinWaitlist(input: $input) { entry { sku quantity position status holdSeconds joinedAt reservation { token sku quantity status expiresAt createdAt committedAt extensions } } userErrors { code message retryAfterSeconds } } }`;

export const LEAVE_WAITLIST = `mutation LeaveWaitlist($input: LeaveWaitlistInput!) {
  leaveWaitlist(input: $input) { entry { sku quantity position status holdSeconds joinedAt reservation { token sku quantity status expiresAt createdAt committedAt extensions } } userErrors { code message retryAfterSeconds } } }`;

export const WAITLIST = `subscription Waitlist($sku: ID!) { waitlistChanged(sku: $sku) { sku quantity position status holdSeconds joinedAt reservation { token sku quantity status expiresAt createdAt committedAt extensions } } }`;

export const DRAW_INFO = `query DrawInfo($sku: ID!) { product(sku: $sku) { sku draw { closesAt status entries seedHash seed winners winnerHoldSeconds } } }`;

export const MY_DRAW_ENTRIES = `query MyDrawEntries { myDrawEntries { sku quantity status enteredAt place reservation { token sku quantity status expiresAt createdAt committedAt extensions } } }`;

export const MY_DRAW_ENTRY = `subscription MyDrawEntry($sku: ID!) { myDrawEntryChanged(sku: $sku) { sku quantity status enteredAt place reservation { token sku quantity status expiresAt createdAt committedAt extensions } } }`;

export const ENTER_DRAW = `mutation EnterDraw($input: EnterDrawInput!) {
  enterDraw(input: $input) { entry { sku quantity status enteredAt place reservation { token sku quantity status expiresAt createdAt committedAt extensions } } userErrors { code message retryAfterSeconds } } }`;

export const RESERVE_CART = `mutation ReserveCart($input: ReserveCartInput!) { reserveCart(input: $input) { cart { token status expiresAt createdAt lines { token sku quantity status expiresAt } } userErrors { code message field available retryAfterSeconds } } }`;

export const COMMIT_CART = `mutation CommitCart($input: CommitCartInput!) { commitCart(input: $input) { cart { token status expiresAt createdAt lines { token sku quantity status expiresAt } } userErrors { code message field available retryAfterSeconds } } }`;

export const CANCEL_CART = `mutation CancelCart($input: CancelCartInput!) { cancelCart(input: $input) { cart { token status expiresAt createdAt lines { token sku quantity status expiresAt } } userErrors { code message field available retryAfterSeconds } } }`;

export const EXTEND_CART = `mutation ExtendCart($input: ExtendCartInput!) { extendCart(input: $input) { cart { token status expiresAt createdAt lines { token sku quantity status expiresAt } } userErrors { code message field available retryAfterSeconds } } }`;

export const QUEUE_INFO = `query QueueInfo($sku: ID!) { product(sku: $sku) { sku queue { id status opensAt admittedThrough waiting admitPerMinute seedHash seed } } }`;

export const DROP_QUEUE_INFO = `query DropQueueInfo($drop: ID!) { drop(id: $drop) { dropId queue { id status opensAt admittedThrough waiting admitPerMinute seedHash seed } } }`;

export const QUEUE_CHANGED = `subscription QueueChanged($sku: ID, $drop: ID) { queueChanged(sku: $sku, drop: $drop) { id status opensAt admittedThrough waiting admitPerMinute seedHash seed } }`;

export const MY_QUEUE_TICKET = `query MyQueueTicket($sku: ID, $drop: ID) { myQueueTicket(sku: $sku, drop: $drop) { number position etaSeconds status pass passExpiresAt pollAfterSeconds queue { id status opensAt admittedThrough waiting admitPerMinute seedHash seed } } }`;

export const QUEUE_CHALLENGE = `query QueueChallenge($sku: ID, $drop: ID) { queueChallenge(sku: $sku, drop: $drop) { challenge bits expiresAt } }`;

export const JOIN_QUEUE = `mutation JoinQueue($input: JoinQueueInput!) {
  joinQueue(input: $input) { ticket { number position etaSeconds status pass passExpiresAt pollAfterSeconds queue { id status opensAt admittedThrough waiting admitPerMinute seedHash seed } } userErrors { code message retryAfterSeconds } } }`;
