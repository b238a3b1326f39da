/** proxy/headers.ts: which of a routing header's names counts. */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { FAIRNESS_HEADERS, firstHeader } from '../../src/proxy/headers.js';

test('firstHeader: names in order of preference; an empty value counts as absent (the flow is then default-flow, or the alias decides)', () => {
  const [name, alias] = FAIRNESS_HEADERS as readonly [string, string];
  assert.equal(firstHeader({ [name]: 'a', [alias]: 'b' }, FAIRNESS_HEADERS), 'a');
  assert.equal(firstHeader({ [alias]: 'b' }, FAIRNESS_HEADERS), 'b');
  assert.equal(firstHeader({ [name]: '', [alias]: 'b' }, FAIRNESS_HEADERS), 'b');
  assert.equal(firstHeader({ [name]: '' }, FAIRNESS_HEADERS), undefined);
  assert.equal(firstHeader({}, FAIRNESS_HEADERS), undefined);
});
