/** The block-hash fast path (code units copied to scratch) against the plain string hash. */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { blockHashes, hashRange } from '../../src/scheduling/prefix-index.js';

/** Block hashes computed one block at a time with hashRange: the definition blockHashes must meet. */
function reference(text: string, seed: number, blockChars: number, maxBlocks: number): number[] {
  let end = text.length;
  if (text.length < blockChars) return [];
  if (maxBlocks > 0) end = Math.min(end, maxBlocks * blockChars);
  const out: number[] = [];
  let previous = seed;
  for (let start = 0; start < end; start += blockChars) {
    previous = hashRange(text, start, Math.min(start + blockChars, end), previous);
    out.push(previous);
  }
  return out;
}

function words(seed: number, length: number): string {
  let out = '';
  for (let i = 0; out.length < length; i++) out += `t${(seed * 31 + i * 7) % 997} `;
  return out.slice(0, length);
}

describe('blockHashes', () => {
  test('equals the hashRange chain: even and odd block sizes, partial tails, truncation', () => {
    const text = words(1, 5000);
    for (const blockChars of [64, 63, 7, 1]) {
      for (const maxBlocks of [0, 3, 256]) {
        for (const length of [blockChars, blockChars + 1, 1001, 5000]) {
          const t = text.slice(0, length);
          assert.deepEqual(blockHashes(t, 42, { blockChars, maxBlocks }), reference(t, 42, blockChars, maxBlocks), `${blockChars}/${maxBlocks}/${length}`);
        }
      }
    }
  });

  test('non-ASCII text, astral characters and lone surrogates hash as their UTF-16 code units', () => {
    const text = ('héllo wörld — 日本語 🎉🎉 ' + '\ud800x\udc00 ').repeat(40);
    assert.deepEqual(blockHashes(text, 7, { blockChars: 64, maxBlocks: 0 }), reference(text, 7, 64, 0));
    assert.notDeepEqual(blockHashes(text, 7, { blockChars: 64, maxBlocks: 0 }), blockHashes(text.replace('日', '月'), 7, { blockChars: 64, maxBlocks: 0 }));
  });

  test('a text too long for the scratch space hashes the same as its prefix does', () => {
    const long = words(3, (1 << 20) + 4096);
    const head = long.slice(0, 64 * 1000);
    const all = blockHashes(long, 1, { blockChars: 64, maxBlocks: 0 });
    assert.deepEqual(all.slice(0, 1000), blockHashes(head, 1, { blockChars: 64, maxBlocks: 0 }));
    // A short text after a long one: the scratch space holds no stale units that leak in.
    assert.deepEqual(blockHashes(head.slice(0, 200), 1, { blockChars: 64, maxBlocks: 0 }), reference(head.slice(0, 200), 1, 64, 0));
  });
});
