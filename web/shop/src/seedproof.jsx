// The proof that an order was fixed in advance, for a draw and for a
// queue's pre-queue alike: the SHA-256 of a seed, published when the
// product was created, then the seed itself, a check made here that it
// hashes to what was published (Web Crypto, where the page has it: https
// and localhost), and how anyone can check it by hand.
import { useEffect, useState } from 'react';

// SeedProof shows seedHash, and seed once revealed. kind names the test ids
// (`<kind>-seed-hash-<id>`, `<kind>-seed-<id>`, `<kind>-seed-check-<id>`,
// `<kind>-proof-<id>`); verify is the dropline command that recomputes the
// order; the texts say what the seed orders, before and after it is out.
export function SeedProof({ kind, id, seedHash, seed, open, summary, hashLabel, seedLabel, before, after, verify }) {
  const [check, setCheck] = useState(null);
  useEffect(() => {
    if (!seed || !globalThis.crypto?.subtle) return;
    const bytes = new Uint8Array(seed.match(/../g).map((h) => parseInt(h, 16)));
    crypto.subtle.digest('SHA-256', bytes).then((d) => {
      const hex = Array.from(new Uint8Array(d), (x) => x.toString(16).padStart(2, '0')).join('');
      setCheck(hex === seedHash);
    });
  }, [seed, seedHash]);
  return (
    <details className="seed" data-testid={`${kind}-proof-${id}`} open={open}>
      <summary>{summary}</summary>
      <dl>
        <dt>{hashLabel}</dt>
        <dd>
          <code data-testid={`${kind}-seed-hash-${id}`}>{seedHash}</code>
        </dd>
        {seed && (
          <>
            <dt>{seedLabel}</dt>
            <dd>
              <code data-testid={`${kind}-seed-${id}`}>{seed}</code>
            </dd>
          </>
        )}
      </dl>
      {seed ? (
        <p>
          {check === true && (
            <strong className="ok" data-testid={`${kind}-seed-check-${id}`}>
              ✓ SHA-256 of the seed is the published hash.{' '}
            </strong>
          )}
          {check === false && <strong className="bad">✗ The seed does not hash to the published hash. </strong>}
          {after} Check it yourself: <code>echo {seed} | xxd -r -p | sha256sum</code> gives the hash above;{' '}
          <code>{verify}</code> recomputes the order from the seed.
        </p>
      ) : (
        <p>
          {before} Once the seed is revealed here, anyone can check that it hashes to this value (
          <code>{verify}</code> recomputes the order).
        </p>
      )}
    </details>
  );
}
