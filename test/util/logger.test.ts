import { test } from 'node:test';
import assert from 'node:assert/strict';
import { parseLogLevel } from '../../src/util/logger.js';

test('--log-level: a pino level, optionally with ,pretty (SPEC §1: pretty when --log-level asks for it)', () => {
  assert.deepEqual(parseLogLevel(undefined), {});
  assert.deepEqual(parseLogLevel('debug'), { level: 'debug' });
  assert.deepEqual(parseLogLevel('silent'), { level: 'silent' });
  assert.deepEqual(parseLogLevel('debug,pretty'), { level: 'debug', pretty: true });
  assert.deepEqual(parseLogLevel('pretty,warn'), { level: 'warn', pretty: true });
  assert.deepEqual(parseLogLevel('pretty'), { level: 'info', pretty: true });
  for (const bad of ['bogus', 'debug,info', 'pretty,pretty', 'debug,pretty,x', '', 'info,']) {
    assert.throws(() => parseLogLevel(bad), new RegExp(`must be one of trace, debug, info, warn, error, fatal, silent, optionally with ',pretty' \\(or 'pretty' alone\\), got '${bad}'`), bad);
  }
});
