// The GraphQL over HTTP spec's own audit (graphql-http's serverAudits)
// against a running Dropline: every MUST and every SHOULD must pass.
//
//   DROPLINE_URL=http://127.0.0.1:8080 node --test test/audit.test.mjs
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { serverAudits } from 'graphql-http';
import { endpoint } from './env.mjs';

test('GraphQL over HTTP audit', async (t) => {
  const counts = { ok: 0, notice: 0, warn: 0, error: 0 };
  for (const audit of serverAudits({ url: endpoint() })) {
    const result = await audit.fn();
    counts[result.status]++;
    await t.test(audit.name, () => {
      if (result.status === 'ok' || result.status === 'notice') return;
      assert.fail(`${result.status}: ${result.reason}`);
    });
  }
  t.diagnostic(`audit: ${counts.ok} ok, ${counts.notice} notices, ${counts.warn} warnings, ${counts.error} errors`);
});
