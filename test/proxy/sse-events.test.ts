import { test } from 'node:test';
import assert from 'node:assert/strict';
import { lastEventEnd, sseFieldBegins } from '../../src/proxy/forward.js';
import { sseErrorEnd } from '../../src/proxy/errors.js';

test('lastEventEnd: past the last blank line, whatever the SSE line ends (LF, CR LF, CR)', () => {
  const end = (s: string) => lastEventEnd(Buffer.from(s, 'latin1'));
  assert.equal(end('data: a\n\n'), 9);
  assert.equal(end('data: a\r\n\r\n'), 11);
  assert.equal(end('data: a\r\r'), 9);
  assert.equal(end('data: a\n\r\n'), 10);
  assert.equal(end('data: a\r\r\n'), 10);
  assert.equal(end('data: a\n\ndata: b'), 9, 'a partial event after a whole one');
  assert.equal(end('data: a\n\ndata: b\n'), 9, 'one line end is no boundary');
  assert.equal(end('data: a\r\n'), 0);
  assert.equal(end('data: a\r'), 0, 'a CR at the end could be the start of CR LF: one line end');
  assert.equal(end('data: a\ndata: b'), 0);
  assert.equal(end(''), 0);
  assert.equal(end('\n\n'), 2);
});

test('sseFieldBegins: an event begins at the first field line, past comments and blank lines, whatever the chunks', () => {
  const begins = (...chunks: string[]) => {
    const state = { inComment: false };
    return chunks.map((c) => sseFieldBegins(Buffer.from(c, 'latin1'), state));
  };
  assert.deepEqual(begins('data: a\n\n'), [true]);
  assert.deepEqual(begins(': ping\n\n', 'data: a\n\n'), [false, true]);
  assert.deepEqual(begins(': pi', 'ng: data: x\r\n', '\r\n', 'event: e\n'), [false, false, false, true], 'a comment cut across chunks');
  assert.deepEqual(begins(':\r:\n\r\n', 'id: 1\n'), [false, true]);
  assert.deepEqual(begins('\n'), [false]);
});

test("sseErrorEnd: the §5 error as an event, then [DONE] as vLLM ends a failed chat or completions stream; none after the Responses API's typed events", () => {
  const event = 'data: {"error":{"message":"cut","type":"BadGatewayError","param":null,"code":502}}\n\n';
  assert.equal(sseErrorEnd('chat', 502, 'cut'), `${event}data: [DONE]\n\n`);
  assert.equal(sseErrorEnd('completions', 502, 'cut'), `${event}data: [DONE]\n\n`);
  // The Responses API's typed error event (what the Vercel AI SDK validates), the §5 object beside it (what the openai clients throw).
  assert.equal(
    sseErrorEnd('responses', 502, 'cut'),
    'event: error\ndata: {"type":"error","code":"BadGatewayError","message":"cut","param":null,"sequence_number":0,"error":{"message":"cut","type":"BadGatewayError","param":null,"code":502}}\n\n',
  );
});
