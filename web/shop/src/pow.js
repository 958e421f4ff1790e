// The queue's proof of work, solved in the page: find a proof such that
// SHA-256(challenge + ":" + proof) starts with `bits` zero bits, trying
// proofs 0, 1, 2, ... in slices that leave the page responsive and report
// their progress. SHA-256 is written out here: Web Crypto's is only there
// on https and localhost, and is asynchronous per hash, far slower for a
// few hundred thousand short inputs.

const K = new Uint32Array([
  0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5, 0xd807aa98,
  0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786,
  0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8,
  0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
  0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819,
  0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a,
  0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
  0xc67178f2,
]);

const W = new Uint32Array(64);
const rotr = (x, n) => (x >>> n) | (x << (32 - n));

// sha256 returns the digest of bytes as 8 big-endian 32-bit words.
export function sha256(bytes) {
  const n = bytes.length;
  const blocks = ((n + 9 + 63) >> 6) << 6;
  const m = new Uint8Array(blocks);
  m.set(bytes);
  m[n] = 0x80;
  const bitsLen = n * 8;
  m[blocks - 4] = bitsLen >>> 24;
  m[blocks - 3] = bitsLen >>> 16;
  m[blocks - 2] = bitsLen >>> 8;
  m[blocks - 1] = bitsLen;
  let h0 = 0x6a09e667, h1 = 0xbb67ae85, h2 = 0x3c6ef372, h3 = 0xa54ff53a;
  let h4 = 0x510e527f, h5 = 0x9b05688c, h6 = 0x1f83d9ab, h7 = 0x5be0cd19;
  for (let off = 0; off < blocks; off += 64) {
    for (let i = 0; i < 16; i++) {
      const j = off + i * 4;
      W[i] = (m[j] << 24) | (m[j + 1] << 16) | (m[j + 2] << 8) | m[j + 3];
    }
    for (let i = 16; i < 64; i++) {
      const a = W[i - 15], b = W[i - 2];
      const s0 = rotr(a, 7) ^ rotr(a, 18) ^ (a >>> 3);
      const s1 = rotr(b, 17) ^ rotr(b, 19) ^ (b >>> 10);
      W[i] = (W[i - 16] + s0 + W[i - 7] + s1) | 0;
    }
    let a = h0, b = h1, c = h2, d = h3, e = h4, f = h5, g = h6, h = h7;
    for (let i = 0; i < 64; i++) {
      const S1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25);
      const ch = (e & f) ^ (~e & g);
      const t1 = (h + S1 + ch + K[i] + W[i]) | 0;
      const S0 = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22);
      const maj = (a & b) ^ (a & c) ^ (b & c);
      const t2 = (S0 + maj) | 0;
      h = g;
      g = f;
      f = e;
      e = (d + t1) | 0;
      d = c;
      c = b;
      b = a;
      a = (t1 + t2) | 0;
    }
    h0 = (h0 + a) | 0; h1 = (h1 + b) | 0; h2 = (h2 + c) | 0; h3 = (h3 + d) | 0;
    h4 = (h4 + e) | 0; h5 = (h5 + f) | 0; h6 = (h6 + g) | 0; h7 = (h7 + h) | 0;
  }
  return [h0 >>> 0, h1 >>> 0, h2 >>> 0, h3 >>> 0, h4 >>> 0, h5 >>> 0, h6 >>> 0, h7 >>> 0];
}

// leadingZeroBits counts the zero bits a digest starts with.
export function leadingZeroBits(words) {
  let z = 0;
  for (const w of words) {
    if (w === 0) {
      z += 32;
      continue;
    }
    return z + Math.clz32(w);
  }
  return z;
}

const enc = new TextEncoder();

// solve looks for a proof of `bits` zero bits for challenge. onProgress(p)
// gets the share of the expected work done (0 to 1, capped at 0.99 until it
// is found: the number of tries it takes is random). signal stops it.
// Resolves to the proof, or null when stopped.
export async function solve(challenge, bits, onProgress, signal) {
  const expected = 2 ** bits;
  const prefix = enc.encode(challenge + ':');
  for (let counter = 0; ; ) {
    const until = counter + 4096;
    for (; counter < until; counter++) {
      const digits = enc.encode(String(counter));
      const buf = new Uint8Array(prefix.length + digits.length);
      buf.set(prefix);
      buf.set(digits, prefix.length);
      if (leadingZeroBits(sha256(buf)) >= bits) {
        onProgress(1);
        return String(counter);
      }
    }
    onProgress(Math.min(0.99, counter / expected));
    await new Promise((r) => setTimeout(r, 0));
    if (signal?.aborted) return null;
  }
}
