/** Shared helpers for config tests. */
import assert from 'node:assert/strict';
import { ConfigError, loadConfigText, type LoadResult } from '../../src/config/load.js';
import { fakeRegistry } from './fake-registry.js';

export const registry = fakeRegistry();

/** Joins lines with "\n" so tests can count lines at a glance. */
export const yaml = (...lines: string[]): string => lines.join('\n') + '\n';

export function load(text: string, file = 'c.yaml'): LoadResult {
  return loadConfigText(text, file, registry);
}

/** The formatted problem lines of a config that must fail. */
export function problems(text: string, file = 'c.yaml'): string[] {
  try {
    load(text, file);
  } catch (err) {
    if (err instanceof ConfigError) return err.format().split('\n');
    throw err;
  }
  assert.fail('expected a ConfigError');
}
