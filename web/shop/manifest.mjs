// Writes persisted-query-manifest.json: the shop's operations
// (src/operations.js) in Apollo's persisted query manifest format, which a
// server started with DROPLINE_TRUSTED_DOCUMENTS=<this file> runs and
// nothing else. Each body is the text urql sends for the document (its
// stringifyDocument of the parsed operation) and each id that text's
// SHA-256 in hex, so the same ids are what automatic persisted queries
// expect too. build.mjs runs it first; `node manifest.mjs` alone rewrites
// the file.
import { createHash } from 'node:crypto';
import { writeFile } from 'node:fs/promises';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { createRequest, stringifyDocument } from '@urql/core';
import * as operations from './src/operations.js';

const here = path.dirname(fileURLToPath(import.meta.url));
export const manifestPath = path.join(here, 'persisted-query-manifest.json');

export async function writeManifest() {
  const ops = Object.values(operations).map((source) => {
    const doc = createRequest(source, {}).query;
    const def = doc.definitions.find((d) => d.kind === 'OperationDefinition');
    const body = stringifyDocument(doc);
    return {
      id: createHash('sha256').update(body).digest('hex'),
      body,
      name: def.name.value,
      type: def.operation,
    };
  });
  ops.sort((a, b) => a.name.localeCompare(b.name));
  const manifest = { format: 'apollo-persisted-query-manifest', version: 1, operations: ops };
  await writeFile(manifestPath, JSON.stringify(manifest, null, 2) + '\n');
  return ops.length;
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const n = await writeManifest();
  console.log(`persisted-query-manifest.json: ${n} operations`);
}
