import { test } from 'node:test';
import assert from 'node:assert/strict';
import { lastEventEnd, outputEventIn, ResponsesOutputWait, sseFieldBegins } from '../../src/proxy/forward.js';
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

test('outputEventIn: a whole event whose type (its event: line, else its JSON "type") is neither response.created nor response.in_progress', () => {
  const output = (s: string) => outputEventIn(Buffer.from(s, 'utf8'));
  const created = 'event: response.created\ndata: {"type":"response.created","sequence_number":0,"response":{"status":"in_progress"}}\n\n';
  const inProgress = 'event: response.in_progress\ndata: {"type":"response.in_progress","sequence_number":1,"response":{"status":"in_progress"}}\n\n';
  assert.equal(output(created + inProgress), false);
  assert.equal(output(created + inProgress + 'event: response.output_item.added\ndata: {"type":"response.output_item.added"}\n\n'), true);
  assert.equal(output('event: response.output_text.delta\ndata: {"type":"response.output_text.delta","delta":"hi"}\n\n'), true);
  // Data-only events: the JSON's own "type" member, not one nested in it, whatever its place.
  assert.equal(output('data: {"type":"response.created","response":{}}\n\ndata:{"type":"response.in_progress"}\n\n'), false);
  assert.equal(output('data: {"sequence_number":0,"response":{"text":{"format":{"type":"text"}}},"type":"response.created"}\n\n'), false);
  assert.equal(output('data: {"sequence_number":2,"type":"response.output_item.added"}\n\n'), true);
  assert.equal(output('data: {"response":{"type":"response.created"}}\n\n'), true, 'no type of its own');
  // A data: line cut in two (the SSE way to write one value on two lines) is one JSON text.
  assert.equal(output('data: {"type":\ndata: "response.in_progress"}\n\n'), false);
  // The event: line wins over the data; an empty one says nothing.
  assert.equal(output('event: response.created\ndata: {"type":"response.output_text.delta"}\n\n'), false);
  assert.equal(output('data: {"type":"response.output_text.delta"}\nevent: response.in_progress\n\n'), false);
  assert.equal(output('event:\ndata: {"type":"response.created"}\n\n'), false);
  assert.equal(output('event:response.created\n\n'), false, 'no space after the colon');
  // What else ends the wait: an error event (typed, or vLLM's chat-style one), the end of the response, anything that is no JSON.
  assert.equal(output('event: error\ndata: {"type":"error","code":"BadGatewayError","message":"cut"}\n\n'), true);
  assert.equal(output('data: {"error":{"message":"KV load failed","code":500}}\n\n'), true);
  assert.equal(output('event: response.completed\ndata: {"type":"response.completed"}\n\n'), true);
  assert.equal(output('event: response.failed\n\n'), true);
  assert.equal(output('event: response.incomplete\n\n'), true);
  assert.equal(output('data: [DONE]\n\n'), true);
  // Comments, blank lines and blocks of other fields are no event.
  assert.equal(output(': ping\n\n\n\n:\r\n\r\nid: 7\nretry: 100\n\n'), false);
  assert.equal(output(': event: response.output_text.delta\n\n'), false);
  // CR LF and CR line ends.
  assert.equal(output(created.replaceAll('\n', '\r\n') + inProgress.replaceAll('\n', '\r')), false);
  assert.equal(output('event: response.output_text.delta\r\ndata: {}\r\n\r\n'), true);
  assert.equal(output('data: {"type":"response.output_text.delta"}\r\r'), true);
  assert.equal(output('data: {"type":"response.created"}\r\n\r\n'), false, 'the CR is no part of the JSON');
  // An event without its blank line is not whole yet.
  assert.equal(output(created + 'event: response.output_text.delta\ndata: {}\n'), false);
});

test('ResponsesOutputWait: the answer begins with the chunk that completes the first event past created and in_progress, wherever the chunks split', () => {
  const opening = (data: boolean) =>
    (data ? '' : 'event: response.created\n') +
    'data: {"type":"response.created","sequence_number":0,"response":{"id":"resp_1","status":"in_progress","instructions":"café ☕","text":{"format":{"type":"text"}}}}\n\n' +
    ': ping\n\n' +
    (data ? '' : 'event: response.in_progress\n') +
    'data: {"type":"response.in_progress","sequence_number":1,"response":{"id":"resp_1","status":"in_progress"}}\n\n';
  const output = (data: boolean) => (data ? '' : 'event: response.output_item.added\n') + 'data: {"type":"response.output_item.added","sequence_number":2,"output_index":0}\n\n';
  const rest = 'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","sequence_number":3,"delta":"é"}\n\n';
  for (const data of [false, true]) {
    for (const [eol, name] of [['\n', 'LF'], ['\r\n', 'CR LF'], ['\r', 'CR']] as const) {
      const text = (s: string) => s.replaceAll('\n', eol);
      const head = Buffer.from(text(opening(data)), 'utf8');
      const stream = Buffer.concat([head, Buffer.from(text(output(data)) + text(rest), 'utf8')]);
      const outputEnd = head.length + Buffer.byteLength(text(output(data)));
      // Byte by byte: the event is whole at its blank line (for CR LF, at its CR: a LF alone after it is a blank line of its own).
      const wait = new ResponsesOutputWait();
      let at = -1;
      for (let i = 0; i < stream.length && at < 0; i++) if (wait.push(stream.subarray(i, i + 1))) at = i + 1;
      assert.equal(at, eol === '\r\n' ? outputEnd - 1 : outputEnd, `${name}, ${data ? 'data only' : 'event lines'}: byte by byte`);
      // Two chunks, split at every byte: the first that holds the output event's end answers.
      for (let k = 1; k < stream.length; k++) {
        const w = new ResponsesOutputWait();
        const first = w.push(stream.subarray(0, k));
        assert.deepEqual([first, first || w.push(stream.subarray(k))], [k >= at, true], `${name}, ${data ? 'data only' : 'event lines'}: split at ${k}`);
      }
      // Only the opening events, however they come: no answer.
      const opened = new ResponsesOutputWait();
      for (let i = 0; i < head.length; i += 7) assert.equal(opened.push(head.subarray(i, i + 7)), false, `${name}: opening events only`);
    }
  }
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
