import assert from 'node:assert/strict';
import test from 'node:test';
import { MAX_JSON_STRINGS, MAX_JSON_VALUES, jsonShapeProblem } from '../../src/proxy/json-member.js';
import { parseOpenAIRequest } from '../../src/proxy/openai.js';

const shape = (text: string, depth = 1000, containers = 100_000, strings = 100_000, values = 2_000_000) => jsonShapeProblem(text, { depth, containers, strings, values });

test('jsonShapeProblem: nesting past the depth, or more arrays and objects than the count, is named', () => {
  assert.equal(shape('{"a":[[1]]}', 3), undefined);
  assert.match(shape('{"a":[[[1]]]}', 3)!, /more than 3 levels deep/);
  assert.equal(shape('[{},{},[]]', 10, 4), undefined);
  assert.match(shape('[{},{},[],{}]', 10, 4)!, /more than 4 arrays and objects/);
  // Depth is nesting, not a running count: siblings close what they open.
  assert.equal(shape(`[${'[],'.repeat(50)}[]]`, 2), undefined);
});

test('jsonShapeProblem: brackets inside strings, escaped quotes included, do not count; an unterminated string is for JSON.parse', () => {
  assert.equal(shape(JSON.stringify({ content: '[[[[{{{{' + '\\"[[[' + '"]]' }), 2), undefined);
  assert.equal(shape('{"a":"\\\\"}', 1), undefined, 'an escaped backslash before the closing quote');
  assert.equal(shape('{"a":"\\\\\\"[[[["}', 1), undefined);
  assert.equal(shape('{"a":"[[[[', 1), undefined);
  assert.match(shape('{"a":"x","b":[[1]]}', 2)!, /levels deep/, 'counting goes on after a string');
  // Text beyond ASCII is skipped like any other.
  assert.equal(shape(JSON.stringify({ content: '日本語[[[[ "quoted" \\ ' }), 1), undefined);
});

test('a request nested deeper than 1000 levels, or with more than 100 000 arrays and objects, is refused before it is parsed', () => {
  const chat = (tools: string) => Buffer.from(`{"model":"m","messages":[{"role":"user","content":"hi"}],"tools":${tools}}`);
  const deep = parseOpenAIRequest('chat', chat('['.repeat(1 << 20) + ']'.repeat(1 << 20)));
  assert.deepEqual(deep, { message: 'request JSON nests arrays and objects more than 1000 levels deep', param: null });
  const many = parseOpenAIRequest('chat', chat(`[${'{},'.repeat(100_000)}{}]`));
  assert.deepEqual(many, { message: 'request JSON holds more than 100000 arrays and objects', param: null });
  const fine = parseOpenAIRequest('chat', chat(`[${'{"type":"function"},'.repeat(1000)}{}]`));
  assert.equal('model' in fine && fine.model, 'm');
});

test('jsonShapeProblem: strings (keys too) and values past their counts are named; quotes inside strings are not strings', () => {
  assert.equal(shape('{"a":"x","b":["y","z"]}', 10, 10, 5), undefined);
  assert.match(shape('{"a":"x","b":["y","z","w"]}', 10, 10, 5)!, /more than 5 strings \(keys included\)/);
  assert.equal(shape(JSON.stringify({ a: 'with "quotes" and \\ inside' }), 10, 10, 2), undefined);
  assert.equal(shape('[1,2,3,4]', 10, 10, 10, 4), undefined);
  assert.match(shape('[1,2,3,4,5]', 10, 10, 10, 4)!, /more than 4 values/);
  assert.equal(shape(JSON.stringify({ a: 'commas, in, a, string' }), 10, 10, 10, 2), undefined);
});

test('16 MiB of short strings or 16 MiB of numbers past the default bodyLimit is refused before it is parsed; a 1-million-token prompt of ids and 2 048-input embeddings batches (of texts, of 1 024 token ids each) are not', () => {
  const strings = parseOpenAIRequest('completions', Buffer.from(`{"model":"m","prompt":[${Array.from({ length: MAX_JSON_STRINGS + 1 }, (_, i) => `"${i.toString(36)}"`).join(',')}]}`));
  assert.deepEqual(strings, { message: `request JSON holds more than ${MAX_JSON_STRINGS} strings (keys included)`, param: null });
  const numbers = parseOpenAIRequest('completions', Buffer.from(`{"model":"m","prompt":[${'1,'.repeat(MAX_JSON_VALUES)}1]}`));
  assert.deepEqual(numbers, { message: `request JSON holds more than ${MAX_JSON_VALUES} values`, param: null });
  const ids = parseOpenAIRequest('completions', Buffer.from(`{"model":"m","prompt":[${'42,'.repeat(1 << 20)}42]}`));
  assert.equal('model' in ids && ids.model, 'm');
  const batch = parseOpenAIRequest('embeddings', Buffer.from(JSON.stringify({ model: 'm', input: Array.from({ length: 2048 }, (_, i) => `text ${i}`) })));
  assert.equal('model' in batch && batch.model, 'm');
  // 12 MiB: the openai client's largest batch as LangChain sends it (token ids), 2 million values and more.
  const tokenIds = Array.from({ length: 1024 }, (_, j) => 10_000 + ((j * 17) % 89_999));
  const idBatch = parseOpenAIRequest('embeddings', Buffer.from(JSON.stringify({ model: 'm', input: Array.from({ length: 2048 }, () => tokenIds) })));
  assert.equal('model' in idBatch && idBatch.model, 'm');
});
