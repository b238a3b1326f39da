import { test, describe } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { forEachSample, labelsAt, parsePromText, parseSampleValue, PromParseError } from '../../src/datalayer/prom-text.js';

const referencePage = readFileSync(new URL('../fixtures/vllm-metrics.txt', import.meta.url), 'utf8');

function only(text: string) {
  const { samples } = parsePromText(text);
  assert.equal(samples.length, 1, `expected one sample in ${JSON.stringify(text)}`);
  return samples[0]!;
}

/** Every sample read lazily: name, value and the labels `labelsAt` builds from the line's position. */
function parseLazily(text: string): { name: string; value: number; labels: Record<string, string> }[] {
  const out: { name: string; value: number; labels: Record<string, string> }[] = [];
  forEachSample(text, () => false, () => assert.fail('no line is read in full'), {
    names: () => true,
    onSample: (name, value, at, line) => out.push({ name, value, labels: labelsAt(text, at, line) }),
  });
  return out;
}

/** The page fails with this line and message, read in full and (unless `fullOnly`) read lazily. */
function assertParseError(text: string, line: number, messagePart?: RegExp, fullOnly = false): void {
  const check = (err: unknown): true => {
    assert.ok(err instanceof PromParseError, `expected PromParseError, got ${String(err)}`);
    assert.equal(err.line, line, `line number for ${JSON.stringify(text)}: ${err.message}`);
    if (messagePart) assert.match(err.message, messagePart);
    return true;
  };
  assert.throws(() => parsePromText(text), check);
  if (!fullOnly) assert.throws(() => forEachSample(text, undefined, () => {}, { names: () => true, onSample: () => {} }), check);
}

describe('parsePromText: the reference vLLM page (pd-and-vllm.md §4.3)', () => {
  const { samples } = parsePromText(referencePage);

  test('reads every sample line and skips HELP/TYPE comments', () => {
    const sampleLines = referencePage.split('\n').filter((l) => l.length > 0 && !l.startsWith('#'));
    assert.equal(samples.length, sampleLines.length);
    assert.ok(samples.every((s) => !s.name.startsWith('#')));
  });

  test('names with colons, labels and values', () => {
    const cache = samples.find((s) => s.name === 'vllm:cache_config_info');
    assert.deepEqual(cache, { name: 'vllm:cache_config_info', labels: { block_size: '16', num_gpu_blocks: '1024' }, value: 1 });
    const lora = samples.filter((s) => s.name === 'vllm:lora_requests_info');
    assert.equal(lora.length, 2);
    assert.equal(lora[0]!.value, 1.257894567e9);
    assert.equal(lora[1]!.labels['waiting_lora_adapters'], '');
    const inf = samples.find((s) => s.name === 'vllm:time_to_first_token_seconds_bucket' && s.labels['le'] === '+Inf');
    assert.equal(inf?.value, 24);
    assert.equal(samples.find((s) => s.name === 'vllm:inter_token_latency_seconds_sum')?.value, 19.7);
  });

  test('a name filter only materialises wanted families', () => {
    const wanted = parsePromText(referencePage, (name) => name === 'vllm:num_requests_waiting').samples;
    assert.deepEqual(wanted, [{ name: 'vllm:num_requests_waiting', labels: { model_name: 'Qwen/Qwen2.5-0.5B-Instruct' }, value: 3 }]);
  });
});

describe('parsePromText: formats', () => {
  test('prom-client (Node) style: blank lines between families, unlabelled series, le first', () => {
    const page = [
      '# HELP vllm:num_requests_waiting Number of requests waiting "to be" processed \\ escaped help',
      '# TYPE vllm:num_requests_waiting gauge',
      'vllm:num_requests_waiting{model_name="sim"} 3',
      '',
      '# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.',
      '# TYPE vllm:kv_cache_usage_perc gauge',
      'vllm:kv_cache_usage_perc 0.25',
      '',
      '# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.',
      '# TYPE vllm:time_to_first_token_seconds histogram',
      'vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="sim"} 0',
      'vllm:time_to_first_token_seconds_bucket{le="1",model_name="sim"} 1',
      'vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="sim"} 1',
      'vllm:time_to_first_token_seconds_sum{model_name="sim"} 0.5',
      'vllm:time_to_first_token_seconds_count{model_name="sim"} 1',
      '',
      '# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.',
      '# TYPE process_cpu_seconds_total counter',
      'process_cpu_seconds_total 0.123456',
      '',
    ].join('\n');
    const { samples } = parsePromText(page);
    assert.equal(samples.length, 8);
    assert.deepEqual(samples[1], { name: 'vllm:kv_cache_usage_perc', labels: {}, value: 0.25 });
    assert.deepEqual(samples[4]!.labels, { le: '+Inf', model_name: 'sim' });
    assert.equal(samples[7]!.value, 0.123456);
  });

  test('Python client style: floats, _created series, engine series, NaN', () => {
    const page = [
      '# HELP vllm:prompt_tokens_total Number of prefill tokens processed.',
      '# TYPE vllm:prompt_tokens_total counter',
      'vllm:prompt_tokens_total{engine="0",model_name="m"} 1234.0',
      'vllm:prompt_tokens_created{engine="0",model_name="m"} 1.7234567891234e+09',
      '# HELP vllm:some_ratio Something undefined right now.',
      '# TYPE vllm:some_ratio gauge',
      'vllm:some_ratio{engine="1",model_name="m"} NaN',
    ].join('\n');
    const { samples } = parsePromText(page);
    assert.equal(samples[0]!.value, 1234);
    assert.equal(samples[1]!.name, 'vllm:prompt_tokens_created');
    assert.equal(samples[1]!.value, 1.7234567891234e9);
    assert.ok(Number.isNaN(samples[2]!.value));
  });

  test('CRLF line endings, blank and whitespace-only lines, no final newline', () => {
    const page = '# TYPE a gauge\r\n\r\n   \r\na 1\r\n\tb{x="y"} 2\r\nc 3';
    assert.deepEqual(parsePromText(page).samples, [
      { name: 'a', labels: {}, value: 1 },
      { name: 'b', labels: { x: 'y' }, value: 2 },
      { name: 'c', labels: {}, value: 3 },
    ]);
  });

  test('values: integers, floats, exponents, signs, infinities, NaN', () => {
    const cases: Array<[string, number]> = [
      ['3', 3],
      ['3.0', 3],
      ['1e-3', 0.001],
      ['1E3', 1000],
      ['-2.5', -2.5],
      ['.5', 0.5],
      ['1.257894567e+09', 1.257894567e9],
      ['+Inf', Infinity],
      ['Inf', Infinity],
      ['-Inf', -Infinity],
      ['+inf', Infinity],
    ];
    for (const [token, expected] of cases) assert.equal(only(`m ${token}`).value, expected, token);
    assert.ok(Number.isNaN(only('m NaN').value));
    assert.equal(parseSampleValue('0x10'), undefined);
    assert.equal(parseSampleValue('Infinity'), undefined);
  });

  test('optional timestamps (Go client may print them) are accepted and ignored', () => {
    assert.equal(only('m 7 1712345678901').value, 7);
    assert.equal(only('m{a="b"} 7 -5  ').value, 7);
  });

  test('label sets: empty, spaces, trailing comma, names with underscores and digits', () => {
    assert.deepEqual(only('m{} 1').labels, {});
    assert.deepEqual(only('m {a="1"} 1').labels, { a: '1' });
    assert.deepEqual(only('m{ a = "1" , _b2="2", } 1').labels, { a: '1', _b2: '2' });
    assert.deepEqual(only('m{a="1",}1').labels, { a: '1' });
    assert.deepEqual(only(':weird:name{le="+Inf"} 1').name, ':weird:name');
  });

  test('escaped label values: \\" \\\\ \\n, and an escaped quote before the closing one', () => {
    const s = only(String.raw`m{path="C:\\dir\\",q="say \"hi\"",nl="a\nb",plain="x,y=z}"} 1`);
    assert.deepEqual(s.labels, { path: 'C:\\dir\\', q: 'say "hi"', nl: 'a\nb', plain: 'x,y=z}' });
  });

  test('a label named __proto__ is stored as data, not as the prototype', () => {
    const s = only('m{__proto__="x"} 1');
    assert.equal(Object.getPrototypeOf(s.labels), Object.prototype);
    assert.equal(s.labels['__proto__'], 'x');
  });

  test('forEachSample calls back in page order', () => {
    const seen: string[] = [];
    forEachSample('a 1\nb 2\na 3\n', undefined, (name, _labels, value) => seen.push(`${name}=${value}`));
    assert.deepEqual(seen, ['a=1', 'b=2', 'a=3']);
  });

  test('the name filter is asked once per run of equal names', () => {
    const asked: string[] = [];
    parsePromText('h_bucket{le="1"} 1\nh_bucket{le="2"} 1\nh_sum 3\nh_bucket{le="3"} 1\n', (name) => {
      asked.push(name);
      return true;
    });
    assert.deepEqual(asked, ['h_bucket', 'h_sum', 'h_bucket']);
  });
});

describe('parsePromText: malformed input throws PromParseError with the line number', () => {
  test('bad label syntax', () => {
    assertParseError('m{a=b} 1', 1, /expected '"'/);
    assertParseError('m{a="b" c="d"} 1', 1, /expected ',' or '}'/);
    assertParseError('m{1a="b"} 1', 1, /invalid label name/);
    assertParseError('m{a"b"} 1', 1, /expected '='/);
    assertParseError('m{a:b="c"} 1', 1, /expected '='/);
    assertParseError('m{a="b"', 1, /unterminated label set/);
    assertParseError('m{a="b",', 1, /unterminated label set/);
    assertParseError('m{,} 1', 1, /invalid label name/);
    // A lazy line's labels are checked for syntax only: labelsAt finds a label named twice.
    assertParseError('m{a="1",a="2"} 1', 1, /duplicate label a/, true);
    assert.throws(() => parseLazily('m{a="1",a="2"} 1'), /duplicate label a/);
    // labelsAt reports the line's number on the page.
    assert.throws(() => parseLazily('# c\nm 1\nm{a="1",a="2"} 1'), (err: unknown) => err instanceof PromParseError && err.line === 3);
  });

  test('unterminated quote and invalid escapes', () => {
    assertParseError('m{a="b} 1', 1, /unterminated value of label a/);
    assertParseError('m{a="b\\"} 1', 1, /unterminated value of label a/);
    assertParseError('m{a="b\\t"} 1', 1, /invalid escape/);
    assertParseError('m{a="b\\', 1, /invalid escape/);
  });

  test('missing or non-numeric values', () => {
    assertParseError('m', 1, /missing value/);
    assertParseError('m   ', 1, /missing value/);
    assertParseError('m{a="b"}', 1, /missing value/);
    assertParseError('m 3x', 1, /invalid value "3x"/);
    assertParseError('m abc', 1, /invalid value/);
    assertParseError('m 0x10', 1, /invalid value/);
    assertParseError('m Infinity', 1, /invalid value/);
    assertParseError('m -', 1, /invalid value/);
    assertParseError('m 1e', 1, /invalid value/);
    assertParseError('m "1"', 1, /invalid value/);
  });

  test('bad timestamps and trailing garbage', () => {
    assertParseError('m 1 12.5', 1, /invalid timestamp/);
    assertParseError('m 1 now', 1, /invalid timestamp/);
    assertParseError('m 1 2 3', 1, /unexpected text after timestamp/);
  });

  test('bad metric names and non-metrics pages', () => {
    assertParseError('9m 1', 1, /invalid metric name start/);
    assertParseError('m-x 1', 1, /unexpected "-" after metric name/);
    assertParseError('<!DOCTYPE html>\n<html></html>', 1, /invalid metric name start/);
    assertParseError('{"error":"oops"}', 1, /invalid metric name start/);
    assertParseError('m\r1', 1, /unexpected "\\r" after metric name/);
  });

  test('the line number counts comments, blank lines and CRLF lines', () => {
    assertParseError('# HELP a x\r\n# TYPE a gauge\r\n\r\na 1\r\na{b=1} 2\r\n', 5);
    assertParseError('a 1\nb 2\n\n\nc oops\n', 5);
  });

  test('lazy lines: name, value and position; labelsAt builds the labels as a full read does', () => {
    const page = [
      '# HELP m help',
      'm{a="x\\\\y",b="q\\"uote",c="new\\nline", d = "" ,} 1.5 1700000000000',
      'other{z="1"} 7',
      'm 2',
      'm{e="\u00e9t\u00e9"}\t3\r',
      '',
    ].join('\n');
    const lazy = parseLazily(page);
    assert.deepEqual(lazy, parsePromText(page).samples);
    assert.deepEqual(lazy[0]!.labels, { a: 'x\\y', b: 'q"uote', c: 'new\nline', d: '' });
    assert.deepEqual(lazy.map((s) => s.value), [1.5, 7, 2, 3]);
    // Lazy and full lines mix on one page, each name read its own way.
    const full: string[] = [];
    const lazyNames: string[] = [];
    forEachSample(page, (n) => n === 'other', (n) => full.push(n), { names: (n) => n === 'm', onSample: (n) => lazyNames.push(n) });
    assert.deepEqual(full, ['other']);
    assert.deepEqual(lazyNames, ['m', 'm', 'm']);
  });

  test('with a filter, unwanted lines are skipped after a name check; wanted ones stay strict', () => {
    const page = 'skipped{a=broken 1\nkept 1\n';
    assert.deepEqual(parsePromText(page, (n) => n === 'kept').samples, [{ name: 'kept', labels: {}, value: 1 }]);
    assert.throws(() => parsePromText(page), PromParseError);
    assert.throws(() => parsePromText('<html>\nkept 1\n', (n) => n === 'kept'), PromParseError);
    assert.throws(() => parsePromText('other 1\nkept x\n', (n) => n === 'kept'), /line 2/);
  });
});
