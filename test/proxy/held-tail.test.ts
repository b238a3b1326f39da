import assert from 'node:assert/strict';
import test from 'node:test';
import { lastEventEnd } from '../../src/proxy/forward.js';
import { HeldTail, lastLineEnd, type LastEnd } from '../../src/proxy/held-tail.js';
import { SseCachedTokensRewriter } from '../../src/proxy/connectors/cached-tokens.js';
import { SseUsageScanner } from '../../src/proxy/usage.js';
import { seededRandom } from '../../src/util/clock.js';

/** The plain way: join what is held with each chunk and look for the last end in all of it. */
function naiveSplit(lastEnd: LastEnd, chunks: Buffer[]): { outs: string[]; rest: string } {
  let held = Buffer.alloc(0);
  const outs: string[] = [];
  for (const c of chunks) {
    const all = Buffer.concat([held, c]);
    const end = lastEnd(all, 0);
    outs.push(all.subarray(0, end).toString('latin1'));
    held = all.subarray(end);
  }
  return { outs, rest: held.toString('latin1') };
}

function split(lastEnd: LastEnd, lookback: number, chunks: Buffer[]): { outs: string[]; rest: string } {
  const tail = new HeldTail(lastEnd, lookback);
  const outs = chunks.map((c) => tail.push(c).toString('latin1'));
  return { outs, rest: tail.take().toString('latin1') };
}

function randomChunks(random: () => number, alphabet: string, length: number): Buffer[] {
  let text = '';
  while (text.length < length) text += alphabet[Math.floor(random() * alphabet.length)];
  const chunks: Buffer[] = [];
  for (let at = 0; at < text.length; ) {
    const n = 1 + Math.floor(random() * 6);
    chunks.push(Buffer.from(text.slice(at, at + n), 'latin1'));
    at += n;
  }
  return chunks;
}

test('HeldTail cuts SSE events and lines where joining every chunk with the held bytes would (random texts, random reads)', () => {
  const random = seededRandom(7);
  for (let round = 0; round < 400; round++) {
    const chunks = randomChunks(random, 'ab:\n\n\r', 5 + Math.floor(random() * 60));
    assert.deepEqual(split(lastEventEnd, 1, chunks), naiveSplit(lastEventEnd, chunks), `events, round ${round}`);
    assert.deepEqual(split(lastLineEnd, 0, chunks), naiveSplit(lastLineEnd, chunks), `lines, round ${round}`);
  }
});

test('HeldTail: a chunk that ends on a boundary with nothing held is passed through, and what it hands out is never written again', () => {
  const tail = new HeldTail(lastEventEnd, 1);
  const whole = Buffer.from('data: 1\n\n');
  assert.equal(tail.push(whole), whole);
  assert.equal(tail.push(Buffer.from('data: 2\n\ndata: ')).toString(), 'data: 2\n\n');
  const out = tail.push(Buffer.from('3\n\ndata: 4'));
  assert.equal(out.toString(), 'data: 3\n\n');
  tail.push(Buffer.from('5555555'));
  assert.equal(out.toString(), 'data: 3\n\n', 'bytes handed out (still queued on a socket, maybe) were overwritten');
  assert.equal(tail.take().toString(), 'data: 45555555');
  assert.equal(tail.length, 0);
});

// A ~1 MB line or event in 4-byte reads: copying and scanning all that is held on every read (the
// old way) took over 40 s here; held by doubling, well under a second. The reads yield to the event
// loop now and then, so the time-out can end a slow run.
const BIG = 1_000_000;
const PIECE = 4;

async function trickle(text: string, push: (chunk: Buffer) => void): Promise<void> {
  const bytes = Buffer.from(text);
  for (let at = 0; at < bytes.length; at += PIECE) {
    push(bytes.subarray(at, at + PIECE));
    if (at % (PIECE << 12) === 0) await new Promise(setImmediate);
  }
}

test('a long SSE line or event arriving in tiny reads costs time linear in its length', { timeout: 12_000 }, async () => {
  const usage = '{"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7},"x":"' + 'x'.repeat(BIG) + '"}';
  const scanner = new SseUsageScanner();
  await trickle(`data: ${usage}\n\n`, (c) => scanner.feed(c));
  assert.deepEqual(scanner.usage, { promptTokens: 5, completionTokens: 2 });

  const rewriter = new SseCachedTokensRewriter(4);
  let relayed = '';
  await trickle(`data: ${usage}\n\n`, (c) => (relayed += rewriter.push(c).toString()));
  assert.match(relayed, /"cached_tokens":4/);

  const events = new HeldTail(lastEventEnd, 1);
  let out = 0;
  await trickle(`data: ${'y'.repeat(BIG)}\n\ndata: [DONE]\n\n`, (c) => (out += events.push(c).length));
  assert.equal(out, BIG + 6 + 2 + 14);
});
