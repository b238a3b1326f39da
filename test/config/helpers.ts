/** Shared helpers for config tests. */
import assert from 'node:assert/strict';
import { ConfigError, loadConfigText, type LoadResult } from '../../src/config/load.js';
import type { PluginRegistry } from '../../src/plugins/registry.js';
import { fakeRegistry } from './fake-registry.js';

export const registry = fakeRegistry();

/** Joins lines with "\n" so tests can count lines at a glance. */
export const yaml = (...lines: string[]): string => lines.join('\n') + '\n';

export function load(text: string, file = 'c.yaml', plugins: PluginRegistry = registry): LoadResult {
  return loadConfigText(text, file, plugins);
}

/** The formatted problem lines of a config that must fail (the fake plugins unless `plugins` is given). */
export function problems(text: string, file = 'c.yaml', plugins: PluginRegistry = registry): string[] {
  try {
    load(text, file, plugins);
  } catch (err) {
    if (err instanceof ConfigError) return err.format().split('\n');
    throw err;
  }
  assert.fail('expected a ConfigError');
}

/**
 * A loaded config's warnings without "no endpoints", which every file without pool.endpoints gets:
 * for tests of other warnings, written as llm-d files are (no pool section).
 */
export function warningsBesidesNoEndpoints(r: LoadResult): LoadResult['warnings'] {
  return r.warnings.filter((w) => !w.message.startsWith('no endpoints: '));
}
