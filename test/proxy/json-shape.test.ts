import assert from 'node:assert/strict';
import test from 'node:test';
import { jsonShapeProblem } from '../../src/proxy/json-member.js';
import { parseOpenAIRequest } from '../../src/proxy/openai.js';

const shape = (text: string, depth?: number, count?: number) => jsonShapeProblem(text, depth, count);

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
