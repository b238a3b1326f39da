/**
 * The detector-as-filter injection rules (SPEC §3.6, §7.2) beyond what defaults.test.ts covers:
 * already referenced, opt-out, several profiles, auto-filled profiles, and what `sluice validate`
 * prints about it.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { loadConfigText } from '../../src/config/load.js';
import { effectiveConfigYaml } from '../../src/config/print.js';
import type { SchedulingProfileConfig } from '../../src/config/types.js';
import { builtinRegistry } from '../../src/plugins/builtin.js';
import { load, yaml } from './helpers.js';

const refs = (profile: SchedulingProfileConfig | undefined) =>
  (profile?.plugins ?? []).map((r) => (r.weight === undefined ? r.pluginRef : `${r.pluginRef}*${r.weight}`));

const filterInjections = (injections: { where: string; what: string }[]) =>
  injections.filter((i) => i.what.includes('as last filter')).map((i) => `${i.where}: ${i.what}`);

/** A P/D-style config (disagg handler, role filters, scorers) with the given profile lines. */
function threeProfiles(profileLines: string[], head: string[] = []): string {
  return yaml(
    ...head,
    'plugins:',
    '- type: disagg-profile-handler',
    '- type: decode-filter',
    '- type: prefill-filter',
    '- type: queue-scorer',
    '- type: prefix-cache-scorer',
    'schedulingProfiles:',
    ...profileLines,
  );
}

describe('detector filter injection', () => {
  test('several profiles: each gets the detector once, after its own filters, and each injection says where', () => {
    const { config, injections } = load(
      threeProfiles([
        '- { name: decode, plugins: [ { pluginRef: decode-filter }, { pluginRef: queue-scorer, weight: 2 }, { pluginRef: prefix-cache-scorer, weight: 3 } ] }',
        '- { name: prefill, plugins: [ { pluginRef: prefill-filter }, { pluginRef: queue-scorer } ] }',
        '- { name: plain, plugins: [ { pluginRef: queue-scorer } ] }',
      ]),
    );
    assert.deepEqual(refs(config.schedulingProfiles[0]), ['decode-filter', 'queue-scorer*2', 'prefix-cache-scorer*3', 'max-score-picker', 'utilization-detector']);
    assert.deepEqual(refs(config.schedulingProfiles[1]), ['prefill-filter', 'queue-scorer*1', 'max-score-picker', 'utilization-detector']);
    assert.deepEqual(refs(config.schedulingProfiles[2]), ['queue-scorer*1', 'max-score-picker', 'utilization-detector']);
    assert.deepEqual(filterInjections(injections), [
      'schedulingProfiles[0].plugins: utilization-detector as last filter of profile decode',
      'schedulingProfiles[1].plugins: utilization-detector as last filter of profile prefill',
      'schedulingProfiles[2].plugins: utilization-detector as last filter of profile plain',
    ]);
    // One detector plugin, shared by every profile.
    assert.equal(config.plugins.filter((p) => p.type === 'utilization-detector').length, 1);
  });

  test('already referenced: kept where the profile lists it, not appended again; other profiles still get it', () => {
    const { config, injections } = load(
      threeProfiles([
        '- { name: decode, plugins: [ { pluginRef: utilization-detector }, { pluginRef: decode-filter }, { pluginRef: queue-scorer } ] }',
        '- { name: prefill, plugins: [ { pluginRef: prefill-filter }, { pluginRef: queue-scorer } ] }',
        '- { name: plain, plugins: [ { pluginRef: queue-scorer }, { pluginRef: utilization-detector } ] }',
      ]),
    );
    assert.deepEqual(refs(config.schedulingProfiles[0]), ['utilization-detector', 'decode-filter', 'queue-scorer*1', 'max-score-picker']);
    assert.deepEqual(refs(config.schedulingProfiles[1]), ['prefill-filter', 'queue-scorer*1', 'max-score-picker', 'utilization-detector']);
    assert.deepEqual(refs(config.schedulingProfiles[2]), ['queue-scorer*1', 'utilization-detector', 'max-score-picker']);
    assert.deepEqual(filterInjections(injections), ['schedulingProfiles[1].plugins: utilization-detector as last filter of profile prefill']);
  });

  test('the configured detector is what gets injected (a named concurrency detector), never a second one', () => {
    const { config, injections } = load(
      threeProfiles([
        '- { name: decode, plugins: [ { pluginRef: decode-filter }, { pluginRef: queue-scorer } ] }',
        '- { name: prefill, plugins: [ { pluginRef: prefill-filter } ] }',
      ]).replace('- type: queue-scorer\n', '- type: queue-scorer\n- { type: concurrency-detector, name: conc }\n') +
        yaml('flowControl:', '  saturationDetector: { pluginRef: conc }'),
    );
    assert.deepEqual(refs(config.schedulingProfiles[0]), ['decode-filter', 'queue-scorer*1', 'max-score-picker', 'conc']);
    assert.deepEqual(refs(config.schedulingProfiles[1]), ['prefill-filter', 'max-score-picker', 'conc']);
    assert.ok(!config.plugins.some((p) => p.type === 'utilization-detector'));
    assert.deepEqual(filterInjections(injections), [
      'schedulingProfiles[0].plugins: conc as last filter of profile decode',
      'schedulingProfiles[1].plugins: conc as last filter of profile prefill',
    ]);
  });

  test('opt-out: saturationFilter false skips injection, keeps an explicit reference, and is per profile', () => {
    const { config, injections } = load(
      threeProfiles([
        '- { name: decode, plugins: [ { pluginRef: decode-filter } ], saturationFilter: false }',
        '- { name: prefill, plugins: [ { pluginRef: prefill-filter }, { pluginRef: utilization-detector } ], saturationFilter: false }',
        '- { name: plain, plugins: [ { pluginRef: queue-scorer } ], saturationFilter: true }',
      ]),
    );
    assert.deepEqual(refs(config.schedulingProfiles[0]), ['decode-filter', 'max-score-picker']);
    // Opting out does not remove what the profile itself lists.
    assert.deepEqual(refs(config.schedulingProfiles[1]), ['prefill-filter', 'utilization-detector', 'max-score-picker']);
    assert.deepEqual(refs(config.schedulingProfiles[2]), ['queue-scorer*1', 'max-score-picker', 'utilization-detector']);
    assert.deepEqual(filterInjections(injections), ['schedulingProfiles[2].plugins: utilization-detector as last filter of profile plain']);
    assert.equal(config.schedulingProfiles[2]!.saturationFilter, true);
  });

  test('every profile opted out: the detector is still declared (flow control uses it) but filters nowhere', () => {
    const { config, injections } = load(
      threeProfiles([
        '- { name: decode, plugins: [ { pluginRef: decode-filter } ], saturationFilter: false }',
        '- { name: prefill, plugins: [ { pluginRef: prefill-filter } ], saturationFilter: false }',
      ]),
    );
    assert.ok(config.plugins.some((p) => p.name === 'utilization-detector'));
    assert.equal(config.flowControl.saturationDetector.pluginRef, 'utilization-detector');
    for (const profile of config.schedulingProfiles) assert.ok(!refs(profile).includes('utilization-detector'));
    assert.deepEqual(filterInjections(injections), []);
  });

  test('a single explicit profile with filters: the detector goes after them and after the injected picker', () => {
    const { config } = load(
      yaml(
        'plugins:',
        '- type: prefill-filter',
        '- type: decode-filter',
        '- type: queue-scorer',
        'schedulingProfiles:',
        '- { name: only, plugins: [ { pluginRef: decode-filter }, { pluginRef: queue-scorer }, { pluginRef: prefill-filter } ] }',
      ),
    );
    assert.deepEqual(refs(config.schedulingProfiles[0]), ['decode-filter', 'queue-scorer*1', 'prefill-filter', 'max-score-picker', 'utilization-detector']);
  });
});

describe('auto-filled profile (no profiles configured)', () => {
  test('keeps declaration order of filters, scorers and pickers; the detector goes last; deterministic', () => {
    const text = yaml(
      'plugins:',
      '- type: prefix-cache-scorer',
      '- type: prefill-filter',
      '- type: queue-scorer',
      '- type: decode-filter',
      '- type: kv-cache-utilization-scorer',
    );
    const first = load(text);
    assert.deepEqual(refs(first.config.schedulingProfiles[0]), [
      'prefix-cache-scorer*1',
      'prefill-filter',
      'queue-scorer*1',
      'decode-filter',
      'kv-cache-utilization-scorer*1',
      'max-score-picker',
      'utilization-detector',
    ]);
    // Same input, same output, every time (llm-d iterates a map here).
    for (let i = 0; i < 5; i++) assert.deepEqual(load(text).config, first.config);
    assert.deepEqual(filterInjections(first.injections), ['schedulingProfiles[0].plugins: utilization-detector as last filter of profile default']);
  });

  test('a declared detector is not duplicated in the auto-filled profile', () => {
    const { config } = load(yaml('plugins:', '- type: decode-filter', '- type: queue-scorer', '- type: utilization-detector', '  parameters: { queueDepthThreshold: 2 }'));
    const profile = refs(config.schedulingProfiles[0]);
    assert.equal(profile.filter((r) => r === 'utilization-detector').length, 1);
    assert.ok(profile.indexOf('utilization-detector') > profile.indexOf('decode-filter'), profile.join(', '));
  });

  test(
    'a detector declared before the role filters still runs after them',
    () => {
      const { config } = load(yaml('plugins:', '- type: utilization-detector', '- type: decode-filter', '- type: queue-scorer'));
      assert.deepEqual(refs(config.schedulingProfiles[0]), ['decode-filter', 'queue-scorer*1', 'max-score-picker', 'utilization-detector']);
    },
  );
});

describe('sluice validate shows what was injected where', () => {
  test('one comment line per injected detector filter naming the profile; the printed profiles show it last', () => {
    const loaded = load(
      threeProfiles([
        '- { name: decode, plugins: [ { pluginRef: decode-filter }, { pluginRef: queue-scorer } ] }',
        '- { name: prefill, plugins: [ { pluginRef: prefill-filter } ], saturationFilter: false }',
        '- { name: plain, plugins: [ { pluginRef: queue-scorer } ] }',
      ]),
      'pd.yaml',
    );
    const printed = effectiveConfigYaml(loaded);
    const lines = printed.split('\n');
    const injected = lines.filter((l) => l.startsWith('# injected:') && l.includes('as last filter'));
    assert.deepEqual(injected, [
      '# injected: utilization-detector as last filter of profile decode',
      '# injected: utilization-detector as last filter of profile plain',
    ]);
    // The body agrees with the comments: detector last in decode and plain, absent from the opted-out prefill.
    const reloaded = load(printed, 'printed.yaml');
    assert.deepEqual(reloaded.config.schedulingProfiles.map((p) => refs(p).at(-1)), ['utilization-detector', 'max-score-picker', 'utilization-detector']);
    assert.equal(reloaded.config.schedulingProfiles[1]!.saturationFilter, false);
    assert.match(printed, /saturationFilter: false/);
    assert.deepEqual(reloaded.injections, [], 'the printed config needs no further injection');
  });

  test('with the real plugin registry (what the sluice binary uses) the default profile shows the injection', () => {
    const registry = builtinRegistry();
    const loaded = loadConfigText(
      yaml(
        'plugins:',
        '- type: prefix-cache-scorer',
        '- type: queue-scorer',
        '- type: kv-cache-utilization-scorer',
        '- type: utilization-detector',
        '  parameters: { queueDepthThreshold: 2 }',
        'schedulingProfiles:',
        '- name: default',
        '  plugins:',
        '  - { pluginRef: prefix-cache-scorer, weight: 3 }',
        '  - { pluginRef: queue-scorer, weight: 2 }',
        '  - { pluginRef: kv-cache-utilization-scorer, weight: 2 }',
      ),
      'incident.yaml',
      registry,
    );
    const printed = effectiveConfigYaml(loaded);
    assert.ok(printed.split('\n').includes('# injected: utilization-detector as last filter of profile default'), printed);
    assert.deepEqual(refs(loaded.config.schedulingProfiles[0]), [
      'prefix-cache-scorer*3',
      'queue-scorer*2',
      'kv-cache-utilization-scorer*2',
      'max-score-picker',
      'utilization-detector',
    ]);
  });
});
