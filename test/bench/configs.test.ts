/**
 * Every Sluice configuration the benchmark runs loads with the real plugins, without a warning, and
 * builds its scheduler: a config that drifted from the schema would otherwise surface only minutes
 * into a benchmark run, as a gateway that never became ready.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { loadConfigText } from '../../src/config/load.js';
import { builtinRegistry } from '../../src/plugins/builtin.js';
import { buildScheduling } from '../../src/scheduling/build.js';
import { makeDeps } from '../scheduling/helpers.js';
import { THREE_SCORER_PROFILE } from '../../bench/lib/overhead.js';
import { pdRole, routerConfig, type Router } from '../../bench/lib/quality.js';
import { QUEUE_CONFIG } from '../../bench/lib/scale.js';
import { sluiceBaseConfig } from '../../bench/lib/targets.js';

const registry = builtinRegistry();

function endpoints(n: number, pd: boolean) {
  return Array.from({ length: n }, (_, i) => ({ name: `sim-${i}`, port: 9000 + i, ...(pd ? { labels: { 'llm-d.ai/role': pdRole(i, n) } } : {}) }));
}

/** Loads and builds `extra` appended to the bench's server/pool sections; returns the profile names and the handler type. */
function build(extra: string, pd = false): { profiles: string[]; handler: string; scorers: string[] } {
  const loaded = loadConfigText(sluiceBaseConfig(18080, 19090, endpoints(6, pd)) + extra, 'bench.yaml', registry);
  assert.deepEqual(loaded.warnings, []);
  const built = buildScheduling(loaded.config, registry, makeDeps());
  const profiles = [...built.scheduler.profiles.keys()].sort();
  const first = loaded.config.schedulingProfiles[0]!;
  const scorers = first.plugins.filter((p) => p.weight !== undefined).map((p) => `${p.pluginRef}×${p.weight}`);
  return { profiles, handler: (built.scheduler.handler as unknown as { type: string }).type, scorers };
}

describe('benchmark configurations', () => {
  test('overhead: the default config (the defaults of SPEC §3.5) and the three-scorer profile', () => {
    const dflt = build('');
    assert.equal(dflt.handler, 'single-profile-handler');
    assert.deepEqual(dflt.profiles, ['default']);
    assert.deepEqual(build(THREE_SCORER_PROFILE).scorers.sort(), ['active-request-scorer×2', 'prefix-cache-scorer×3', 'queue-scorer×2']);
  });

  test('quality: every Sluice router, the P/D one on a prefill/decode-labelled fleet', () => {
    const routers: Router[] = ['sluice', 'sluice-random', 'sluice-ttft', 'sluice-fc-off', 'sluice-pd'];
    for (const router of routers) {
      const pd = router === 'sluice-pd';
      const b = build(routerConfig(router), pd);
      assert.equal(b.handler, pd ? 'disagg-profile-handler' : 'single-profile-handler', router);
      assert.deepEqual(b.profiles, pd ? ['decode', 'prefill'] : ['default'], router);
    }
    // The tuned profile is the documented one: queue as heavy as prefix.
    assert.deepEqual(build(routerConfig('sluice-ttft')).scorers.sort(), ['kv-cache-utilization-scorer×2', 'prefix-cache-scorer×3', 'queue-scorer×3']);
  });

  test('scale: the deep-queue flow-control config', () => {
    const loaded = loadConfigText(sluiceBaseConfig(18080, 19090, endpoints(2, false)) + QUEUE_CONFIG, 'bench.yaml', registry);
    assert.deepEqual(loaded.warnings, []);
    assert.equal(loaded.config.flowControl.defaultPriorityBand.maxRequests, 1_000_000);
  });
});
