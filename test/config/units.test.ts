import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { formatDuration, formatQuantity, parseDuration, parseQuantity } from '../../src/config/units.js';

describe('parseDuration', () => {
  test('Go-style durations in milliseconds', () => {
    const cases: [string, number][] = [
      ['200ms', 200],
      ['1.5s', 1500],
      ['1.1s', 1100],
      ['5m', 300_000],
      ['1h30m', 5_400_000],
      ['2m3.5s', 123_500],
      ['0s', 0],
      ['0', 0],
      ['.5s', 500],
      ['1500us', 1.5],
      ['3µs', 0.003],
      ['2000000ns', 2],
      ['+1s', 1000],
    ];
    for (const [text, ms] of cases) assert.equal(parseDuration(text), ms, text);
  });

  test('rejects bad durations with a clear message', () => {
    assert.throws(() => parseDuration('50'), /invalid duration "50": missing unit/);
    assert.throws(() => parseDuration('-1s'), /invalid duration "-1s": must not be negative/);
    assert.throws(() => parseDuration('1d'), /invalid duration "1d": expected numbers with units/);
    assert.throws(() => parseDuration('5 s'), /invalid duration "5 s"/);
    assert.throws(() => parseDuration(''), /invalid duration "": empty/);
    assert.throws(() => parseDuration('1s2'), /invalid duration "1s2"/);
  });

  test("takes every duration Go takes (llm-d's 8760h TTL), up to Go's int64 limit", () => {
    assert.equal(parseDuration('8760h'), 8760 * 3_600_000);
    assert.equal(parseDuration('2562047h'), 2562047 * 3_600_000);
    assert.throws(() => parseDuration('2562048h'), /invalid duration "2562048h": too large \(Go's limit is 2562047h\)/);
  });
});

describe('formatDuration', () => {
  test('shortest exact form, no "0.x" when avoidable', () => {
    const cases: [number, string][] = [
      [0, '0s'],
      [50, '50ms'],
      [200, '200ms'],
      [1000, '1s'],
      [1500, '1.5s'],
      [60_000, '1m'],
      [90_000, '90s'],
      [300_000, '5m'],
      [3_600_000, '1h'],
      [5_400_000, '90m'],
      [3_601_500, '1h1.5s'],
      [0.5, '500us'],
      [0.001, '1us'],
    ];
    for (const [ms, text] of cases) assert.equal(formatDuration(ms), text, String(ms));
  });

  test('round-trips', () => {
    for (const ms of [1, 7, 999, 1001, 12_345, 59_999, 61_000, 86_400_000, 0.25, 123.456]) {
      assert.equal(parseDuration(formatDuration(ms)), ms, String(ms));
    }
  });

  test('rejects negative and non-finite', () => {
    assert.throws(() => formatDuration(-1));
    assert.throws(() => formatDuration(Infinity));
  });
});

describe('parseQuantity', () => {
  test('Kubernetes quantities', () => {
    const cases: [string | number, number][] = [
      ['0', 0],
      ['250', 250],
      [5000, 5000],
      ['1k', 1000],
      ['1.1k', 1100],
      ['500M', 500_000_000],
      ['1G', 1_000_000_000],
      ['1Ki', 1024],
      ['16Mi', 16_777_216],
      ['500Mi', 524_288_000],
      ['1Gi', 1_073_741_824],
      ['1.5Gi', 1_610_612_736],
      ['1e3', 1000],
      ['2E3', 2000],
      ['1T', 1e12],
      ['0.5', 1], // fractional values round up, like Kubernetes Value()
      [1.2, 2],
    ];
    for (const [text, n] of cases) assert.equal(parseQuantity(text), n, String(text));
  });

  test('rejects negatives and garbage', () => {
    assert.throws(() => parseQuantity('-1'), /invalid quantity "-1": must not be negative/);
    assert.throws(() => parseQuantity(-5), /must not be negative/);
    assert.throws(() => parseQuantity('-1Gi'), /must not be negative/);
    assert.throws(() => parseQuantity('16MB'), /invalid quantity "16MB": expected a non-negative integer/);
    assert.throws(() => parseQuantity('abc'), /invalid quantity "abc"/);
    assert.throws(() => parseQuantity(''), /invalid quantity ""/);
    assert.throws(() => parseQuantity('1E'), /too large/); // 10^18 is past Number.MAX_SAFE_INTEGER
    assert.throws(() => parseQuantity(NaN), /must be finite/);
  });
});

describe('formatQuantity', () => {
  test('shortest exact suffix form', () => {
    const cases: [number, string][] = [
      [0, '0'],
      [16_777_216, '16Mi'],
      [1_000_000_000, '1G'],
      [1024, '1Ki'],
      [1_073_741_824, '1Gi'],
      [1_610_612_736, '1536Mi'],
      [5000, '5k'],
      [1234, '1234'],
      [100, '100'],
    ];
    for (const [n, text] of cases) assert.equal(formatQuantity(n), text, String(n));
  });

  test('round-trips', () => {
    for (const n of [0, 1, 999, 1000, 1024, 4096, 123_456_789, 2 ** 40, 5e9]) assert.equal(parseQuantity(formatQuantity(n)), n);
  });
});
