// Entry point of the Dropline GraphQL playground.
//
// Everything GraphiQL needs is bundled by build.mjs into server/playground/dist
// and embedded in the Go binary, so the page works offline and behind strict
// firewalls: nothing here may reference a CDN or any other host.
import { createGraphiQLFetcher } from '@graphiql/toolkit';
import { GraphiQL } from 'graphiql';
import { StrictMode } from 'react';
import { createRoot } from 'react-dom/client';
import 'graphiql/style.css';
import './playground.css';

// The API lives on the same origin as the playground, so derive both URLs from
// the page location: this works on any host and port, behind a TLS-terminating
// proxy (https -> wss) and on plain http (-> ws).
const url = new URL('/graphql', window.location.href);
const subscriptionUrl = new URL(url);
subscriptionUrl.protocol = url.protocol === 'https:' ? 'wss:' : 'ws:';

// Placeholder shown in the headers editor of every new tab. It is only a hint:
// while a header still contains it, the fetcher drops that header, so
// anonymous queries keep working until a real token is pasted.
const TOKEN_PLACEHOLDER = '<paste the token printed by: make token>';
const defaultHeaders = JSON.stringify({ Authorization: `Bearer ${TOKEN_PLACEHOLDER}` }, null, 2);

function withoutPlaceholders(headers) {
  if (!headers) return headers;
  return Object.fromEntries(
    Object.entries(headers).filter(([, v]) => !String(v).includes(TOKEN_PLACEHOLDER)),
  );
}

// HTTP for queries and mutations; graphql-transport-ws (via graphql-ws) for
// subscriptions. For subscriptions the toolkit sends the editor's headers as
// the connection_init payload, since browsers cannot set headers on WebSockets.
const graphiqlFetcher = createGraphiQLFetcher({
  url: url.href,
  subscriptionUrl: subscriptionUrl.href,
});
const fetcher = (params, opts) =>
  graphiqlFetcher(params, opts && { ...opts, headers: withoutPlaceholders(opts.headers) });

const defaultQuery = `# Welcome to the Dropline GraphQL playground.
#
# Write a query or mutation and press
# Ctrl-Enter (Cmd-Enter on a Mac) to run it.
# The book icon on the left opens the docs.
#
# To act as a user, create a token in the
# repository (next to \`make run\`) with
#   make token
# (or: bin/dropline token --user alice)
# and paste it into the Authorization
# header in the Headers tab below.

{
  __typename
}
`;

createRoot(document.getElementById('graphiql')).render(
  <StrictMode>
    <GraphiQL
      fetcher={fetcher}
      defaultQuery={defaultQuery}
      defaultHeaders={defaultHeaders}
      defaultEditorToolsVisibility="headers"
      isHeadersEditorEnabled
      shouldPersistHeaders={false}
    />
  </StrictMode>,
);
