// The operations relay.test.mjs runs, compiled by relay-compiler (npm run
// relay) into __generated__/, which is committed; the Go test fails when
// the artifacts no longer match this file or schema.graphqls. This file is
// never imported: Relay's graphql tag only exists for the compiler.
import { graphql } from 'relay-runtime';

export const product = graphql`
  query stockProductQuery($sku: ID!) {
    product(sku: $sku) {
      id
      sku
      name
      stock { id available held sold total }
    }
  }
`;

// Refetch any node by its global id, as Relay's refetchable fragments do.
export const refetch = graphql`
  query stockRefetchQuery($id: ID!) {
    node(id: $id) {
      id
      ... on Stock { available held sold total }
    }
  }
`;

export const live = graphql`
  subscription stockLiveSubscription($skus: [ID!]!) {
    stockChanged(skus: $skus) { id available held sold total updatedAt }
  }
`;
