import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { topLevelMemberText } from '../../src/proxy/json-member.js';
import { isInvalid, parseOpenAIRequest, validateOpenAIRequest, type ValidRequest } from '../../src/proxy/openai.js';
import { seededRandom, type RandomSource } from '../../src/util/clock.js';

describe('topLevelMemberText', () => {
  test('returns the member exactly as the client wrote it', () => {
    const text = '{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":16}';
    assert.equal(topLevelMemberText(text, 'messages'), '[{"role":"user","content":"hi"}]');
    assert.equal(topLevelMemberText(text, 'model'), '"m"');
    assert.equal(topLevelMemberText(text, 'max_tokens'), '16');
  });

  test('keeps the client’s whitespace inside the value and none around it', () => {
    const text = '{\n  "messages" : [ {"role": "user", "content": "a"} ] ,\n  "stream": true\n}\n';
    assert.equal(topLevelMemberText(text, 'messages'), '[ {"role": "user", "content": "a"} ]');
    assert.equal(topLevelMemberText(text, 'stream'), 'true');
  });

  test('is not fooled by the key inside strings or nested objects', () => {
    const text =
      '{"model":"\\"messages\\":[1]","meta":{"messages":[2]},"note":"x\\\\","messages":[3],"tail":{"a":["]","}"]}}';
    assert.equal(topLevelMemberText(text, 'messages'), '[3]');
    assert.equal(topLevelMemberText(text, 'tail'), '{"a":["]","}"]}');
    assert.equal(topLevelMemberText('{"meta":{"messages":[2]}}', 'messages'), undefined);
  });

  test('the last of duplicate keys wins, as in JSON.parse', () => {
    const text = '{"messages":[1],"messages":[2]}';
    assert.deepEqual(JSON.parse(topLevelMemberText(text, 'messages')!), (JSON.parse(text) as { messages: unknown }).messages);
  });

  test('gives up (undefined) on what a literal compare cannot decide or on malformed text', () => {
    assert.equal(topLevelMemberText('{"messag\\u0065s":[1]}', 'messages'), undefined); // JSON.parse sees "messages"
    assert.equal(topLevelMemberText('{"messages":[1],"m\\u0065ssages":[2]}', 'messages'), undefined);
    assert.equal(topLevelMemberText('[{"messages":[1]}]', 'messages'), undefined);
    assert.equal(topLevelMemberText('{}', 'messages'), undefined);
    assert.equal(topLevelMemberText('{"messages":[1', 'messages'), undefined);
    assert.equal(topLevelMemberText('{"messages":"abc', 'messages'), undefined);
    assert.equal(topLevelMemberText('{"messages" [1]}', 'messages'), undefined);
    assert.equal(topLevelMemberText('{"messages":[1] "x":2}', 'messages'), undefined);
  });

  test('agrees with JSON.parse on random objects, compact and indented (4 seeds × 200)', () => {
    for (const seed of [1, 2, 3, 4]) {
      const random = seededRandom(seed);
      for (let n = 0; n < 200; n++) {
        const obj: Record<string, unknown> = {};
        const keys = ['model', 'messages', 'prompt', 'input', 'stream', `k${n}`];
        for (const key of keys) if (random() < 0.8) obj[key] = randomValue(random, 3);
        const text = JSON.stringify(obj, null, random() < 0.5 ? undefined : Math.floor(random() * 4));
        for (const key of keys) {
          const found = topLevelMemberText(text, key);
          if (!(key in obj)) {
            assert.equal(found, undefined, `seed ${seed} #${n} ${key}`);
            continue;
          }
          assert.ok(found !== undefined, `seed ${seed} #${n} ${key}: not found in ${text}`);
          assert.deepEqual(JSON.parse(found), obj[key], `seed ${seed} #${n} ${key}`);
        }
      }
    }
  });
});

/** Strings full of what a JSON scanner can trip on: quotes, backslashes, brackets, non-ASCII. */
function randomString(random: RandomSource): string {
  const pieces = ['a', 'messages', '"', '\\', '\\"', '\\\\', '[', ']', '{', '}', ',', ':', ' ', 'é', '漢', '\n', '\u0001', '😀'];
  let s = '';
  const length = Math.floor(random() * 8);
  for (let i = 0; i < length; i++) s += pieces[Math.floor(random() * pieces.length)];
  return s;
}

function randomValue(random: RandomSource, depth: number): unknown {
  const r = random();
  if (depth === 0 || r < 0.3) return randomString(random);
  if (r < 0.4) return Math.round((random() - 0.5) * 1e6) / 100;
  if (r < 0.45) return random() < 0.5;
  if (r < 0.5) return null;
  if (r < 0.75) return Array.from({ length: Math.floor(random() * 4) }, () => randomValue(random, depth - 1));
  const o: Record<string, unknown> = {};
  for (let i = Math.floor(random() * 4); i > 0; i--) o[randomString(random)] = randomValue(random, depth - 1);
  return o;
}

describe('validateOpenAIRequest: the prompt text the prefix index hashes', () => {
  const valid = (api: Parameters<typeof validateOpenAIRequest>[0], text: string, withSource = true): ValidRequest => {
    const v = validateOpenAIRequest(api, JSON.parse(text), withSource ? text : undefined);
    assert.ok(!isInvalid(v), JSON.stringify(v));
    return v;
  };

  test('chat: the messages array as the client sent it; without the source, its re-serialisation', () => {
    const text = '{"model":"m", "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]}';
    assert.equal(valid('chat', text).promptText, '[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]');
    assert.equal(valid('chat', text, false).promptText, '[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]');
  });

  test('two requests sharing a system prompt share the start of their prompt texts, whatever other fields vary', () => {
    const ask = (user: string, temperature: number): string =>
      valid('chat', JSON.stringify({ model: 'm', temperature, messages: [{ role: 'system', content: 'S'.repeat(500) }, { role: 'user', content: user }] }))
        .promptText;
    const shared = `[{"role":"system","content":"${'S'.repeat(500)}"},{"role":"user","content":"`;
    for (const text of [ask('first question', 0.1), ask('second', 0.7)]) assert.ok(text.startsWith(shared), text.slice(0, 40));
  });

  test('completions and embeddings: a string is the text itself; an array is its source text', () => {
    assert.equal(valid('completions', '{"model":"m","prompt":"once upon"}').promptText, 'once upon');
    assert.equal(valid('completions', '{"model":"m","prompt":[1, 2, 3]}').promptText, '[1, 2, 3]');
    assert.equal(valid('embeddings', '{"model":"m","input":"x"}').promptText, 'x');
    assert.equal(valid('embeddings', '{"model":"m","input":["a", "b"]}').promptText, '["a", "b"]');
  });

  test('a body nested too deeply to re-serialise is a 400 reason, not an exception', () => {
    const deep = '['.repeat(100_000) + ']'.repeat(100_000);
    const responses = `{"model":"m","input":${deep}}`;
    assert.deepEqual(validateOpenAIRequest('responses', JSON.parse(responses), responses), { message: 'request body is nested too deeply', param: null });
    const chat = `{"model":"m","messages":[{"role":"user","content":${deep}}]}`;
    assert.deepEqual(validateOpenAIRequest('chat', JSON.parse(chat)), { message: 'request body is nested too deeply', param: null });
    // With its source text the client's own JSON is the prompt text: nothing to re-serialise.
    assert.ok(!isInvalid(validateOpenAIRequest('chat', JSON.parse(chat), chat)));
  });

  test('an escaped key falls back to the re-serialisation of what JSON.parse saw', () => {
    assert.equal(valid('chat', '{"model":"m","m\\u0065ssages":[ {"role":"user","content":"hi"} ]}').promptText, '[{"role":"user","content":"hi"}]');
  });
});

describe('parseOpenAIRequest reads a body as vLLM does (the body goes to it as sent)', () => {
  const parse = (text: string | Buffer) => parseOpenAIRequest('chat', Buffer.isBuffer(text) ? text : Buffer.from(text));
  const chat = (stream: unknown) => JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'x' }], stream });

  test("stream as pydantic's lax bool: a client's \"true\" or 1 streams at vLLM, so Sluice relays a stream", () => {
    const read = (v: unknown) => {
      const r = parse(chat(v));
      return isInvalid(r) ? r.message : r.stream;
    };
    assert.deepEqual(
      [true, false, null, 1, 0, 'true', 'False', 'YES', 'no', 'on', 'off', 't', 'f', 'y', 'n', '1', '0'].map(read),
      [true, false, false, true, false, true, false, true, false, true, false, true, false, true, false, true, false],
    );
    for (const v of ['maybe', 2, '', [], {}, 1.5]) assert.equal(read(v), "'stream' must be a boolean", JSON.stringify(v));
    assert.equal(read(undefined), false);
  });

  test("a UTF-8 byte-order mark before the JSON is skipped (Python's json.loads skips it)", () => {
    const r = parse(Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), Buffer.from(chat(true))]));
    assert.ok(!isInvalid(r), JSON.stringify(r));
    assert.equal((r as ValidRequest).model, 'm');
    assert.equal((r as ValidRequest).promptText, '[{"role":"user","content":"x"}]');
  });
});
