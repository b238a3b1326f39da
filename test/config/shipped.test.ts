/** The example configs in config/ load cleanly. Paths are relative to the repo root (npm test's cwd). */
import assert from 'node:assert/strict';
import { fileURLToPath } from 'node:url';
import { describe, test } from 'node:test';
import { loadConfigFile } from '../../src/config/load.js';
import { featureEnabled } from '../../src/config/defaults.js';
import { builtinRegistry } from '../../src/plugins/builtin.js';
import { buildScheduling } from '../../src/scheduling/build.js';
import { makeDeps } from '../scheduling/helpers.js';
import { registry } from './helpers.js';

const configPath = (name: string): string => fileURLToPath(new URL(`../../config/${name}`, import.meta.url));

describe('shipped configs', () => {
  test('config/single-pool.yaml: 2 unlabelled endpoints, no problems, no warnings', () => {
    const loaded = loadConfigFile(configPath('single-pool.yaml'), registry);
    assert.deepEqual(loaded.warnings, []);
    const { pool, server } = loaded.config;
    assert.deepEqual(
      pool.endpoints.map((e) => [e.name, e.address, e.port, e.labels]),
      [
        ['vllm-0', '127.0.0.1', 8001, {}],
        ['vllm-1', '127.0.0.1', 8002, {}],
      ],
    );
    assert.equal(server.port, 8080);
    assert.equal(server.metricsPort, 9090);
    assert.ok(featureEnabled(loaded.config, 'flowControl'));
  });

  test('config/demo.yaml: 2 prefill + 2 decode endpoints, P/D with nixlv2 (decode then prefill profile)', () => {
    const loaded = loadConfigFile(configPath('demo.yaml'), registry);
    assert.deepEqual(loaded.warnings, []);
    const { pool, server, objectives, schedulingProfiles } = loaded.config;
    assert.deepEqual(
      pool.endpoints.map((e) => [e.name, e.address, e.port, e.labels['llm-d.ai/role']]),
      [
        ['prefill-0', '127.0.0.1', 8101, 'prefill'],
        ['prefill-1', '127.0.0.1', 8102, 'prefill'],
        ['decode-0', '127.0.0.1', 8103, 'decode'],
        ['decode-1', '127.0.0.1', 8104, 'decode'],
      ],
    );
    assert.deepEqual([server.port, server.metricsPort], [8080, 9090]);
    assert.deepEqual(objectives, [
      { name: 'interactive', priority: 10 },
      { name: 'batch', priority: -1 },
    ]);
    assert.deepEqual(
      schedulingProfiles.map((p) => [p.name, p.plugins.map((r) => [r.pluginRef, r.weight])]),
      ['decode', 'prefill'].map((name) => [
        name,
        [
          [`${name}-filter`, undefined],
          ['queue-scorer', 2],
          ['kv-cache-utilization-scorer', 2],
          ['prefix-cache-scorer', 3],
          ['max-score-picker', undefined],
          ['utilization-detector', undefined],
        ],
      ]),
    );
    const handler = loaded.config.plugins.find((p) => p.type === 'disagg-profile-handler');
    assert.deepEqual(handler?.parameters, {
      profiles: { decode: 'decode', prefill: 'prefill' },
      deciders: { prefill: 'prefix-based-pd-decider' },
      connector: 'nixlv2',
    });
    assert.deepEqual(loaded.config.plugins.find((p) => p.type === 'prefix-based-pd-decider')?.parameters, { nonCachedTokens: 64 });
  });

  for (const [file, connector] of [
    ['pd-sidecar.yaml', 'sidecar'],
    ['pd-nixlv2.yaml', 'nixlv2'],
    ['demo.yaml', 'nixlv2'],
  ] as const) {
    test(`config/${file}: loads with the real plugins, no warnings, builds a ${connector} P/D scheduler`, () => {
      const real = builtinRegistry();
      const loaded = loadConfigFile(configPath(file), real);
      assert.deepEqual(loaded.warnings, []);
      const roles = loaded.config.pool.endpoints.map((e) => e.labels['llm-d.ai/role']);
      assert.deepEqual(roles, ['prefill', 'prefill', 'decode', 'decode']);
      const built = buildScheduling(loaded.config, real, makeDeps());
      const handler = built.scheduler.handler as unknown as { type: string; connector: string; decider?: { type: string } };
      assert.equal(handler.type, 'disagg-profile-handler');
      assert.equal(handler.connector, connector);
      assert.equal(handler.decider?.type, 'prefix-based-pd-decider');
      assert.deepEqual([...built.scheduler.profiles.keys()].sort(), ['decode', 'prefill']);
    });
  }
});
