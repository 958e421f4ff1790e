// A supergraph on loopback for Dropline's federation test
// (e2e/gateway_test.go): a small second subgraph ("reviews", Apollo Server
// with @apollo/subgraph) that extends Dropline's Product with reviews and
// refers to Dropline's Reservation and Drop by their keys, and Apollo's
// gateway composing it with the Dropline at DROPLINE_URL (its /graphql) by
// asking both for their SDL (_service { sdl }). The gateway passes each
// request's Authorization header on to the subgraphs, so Dropline decides
// what a caller may see as it does for a direct request.
//
// Prints one JSON line, {"gateway": URL, "reviews": URL}, once both listen
// on free loopback ports, and serves until it is killed.
import { ApolloServer } from '@apollo/server';
import { ApolloServerPluginInlineTraceDisabled } from '@apollo/server/plugin/disabled';
import { startStandaloneServer } from '@apollo/server/standalone';
import { ApolloGateway, IntrospectAndCompose, RemoteGraphQLDataSource } from '@apollo/gateway';
import { buildSubgraphSchema } from '@apollo/subgraph';
import { parse } from 'graphql';

const dropline = process.env.DROPLINE_URL;
if (!dropline) {
  console.error('DROPLINE_URL is required');
  process.exit(2);
}

const typeDefs = parse(`
  extend schema @link(url: "https://specs.apollo.dev/federation/v2.3", import: ["@key"])

  type Review {
    stars: Int!
    body: String!
  }

  "Dropline's product, extended with what this subgraph knows of it."
  type Product @key(fields: "sku") {
    sku: ID!
    reviews: [Review!]!
  }

  "Dropline's, referred to by key only: its fields come from Dropline."
  type Reservation @key(fields: "token", resolvable: false) {
    token: ID!
  }

  type Drop @key(fields: "dropId", resolvable: false) {
    dropId: ID!
  }

  type Query {
    "The SKUs with reviews, most reviewed first."
    reviewedSkus: [ID!]!
    "The product of a review page: only its key, Dropline gives the rest."
    reviewPage(sku: ID!): Product
    "A reservation the caller holds an order number for (Dropline decides who sees it)."
    order(token: ID!): Reservation
    "A drop featured on the reviews page."
    featuredDrop(dropId: ID!): Drop
  }
`);

const reviews = new Map([
  ['FED-SNEAKER', [{ stars: 5, body: 'Worth the queue.' }, { stars: 4, body: 'Runs small.' }]],
  ['FED-TEE', [{ stars: 3, body: 'Fine tee.' }]],
]);

const resolvers = {
  Query: {
    reviewedSkus: () => [...reviews.keys()],
    reviewPage: (_, { sku }) => ({ sku }),
    order: (_, { token }) => ({ token }),
    featuredDrop: (_, { dropId }) => ({ dropId }),
  },
  Product: {
    __resolveReference: ({ sku }) => ({ sku }),
    reviews: ({ sku }) => reviews.get(sku) ?? [],
  },
};

const listen = { host: '127.0.0.1', port: 0 };

const subgraph = new ApolloServer({
  schema: buildSubgraphSchema([{ typeDefs, resolvers }]),
  plugins: [ApolloServerPluginInlineTraceDisabled()],
});
const { url: reviewsURL } = await startStandaloneServer(subgraph, { listen });

class Forwarding extends RemoteGraphQLDataSource {
  willSendRequest({ request, context }) {
    if (context.authorization) {
      request.http.headers.set('authorization', context.authorization);
    }
  }
}

const gateway = new ApolloGateway({
  supergraphSdl: new IntrospectAndCompose({
    subgraphs: [
      { name: 'dropline', url: dropline },
      { name: 'reviews', url: reviewsURL },
    ],
  }),
  buildService: ({ url }) => new Forwarding({ url }),
});
const server = new ApolloServer({ gateway });
const { url: gatewayURL } = await startStandaloneServer(server, {
  listen,
  context: async ({ req }) => ({ authorization: req.headers.authorization }),
});

console.log(JSON.stringify({ gateway: gatewayURL, reviews: reviewsURL }));

const stop = async () => {
  await server.stop();
  await subgraph.stop();
  process.exit(0);
};
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
