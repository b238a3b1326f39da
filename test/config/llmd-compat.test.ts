/**
 * llm-d configurations as llm-d's own repositories ship them (deployment samples, e2e configs,
 * guides), with the real plugins: older plugin names and forms llm-d still accepts load here too,
 * with a warning saying what they do in Sluice; what llm-d itself removed gets a hint.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import type { LoadResult } from '../../src/config/load.js';
import { effectiveConfigYaml } from '../../src/config/print.js';
import { builtinRegistry } from '../../src/plugins/builtin.js';
import { DisaggProfileHandler } from '../../src/scheduling/plugins/disagg-profile-handler.js';
import { buildScheduling } from '../../src/scheduling/build.js';
import { ManualClock, seededRandom } from '../../src/util/clock.js';
import { load as loadWith, problems as problemsWith, warningsBesidesNoEndpoints, yaml } from './helpers.js';

const registry = builtinRegistry();
const load = (text: string): LoadResult => loadWith(text, 'c.yaml', registry);
const problems = (text: string): string[] => problemsWith(text, 'c.yaml', registry);
const warnings = (r: LoadResult) => warningsBesidesNoEndpoints(r).map((w) => `${w.line}: ${w.path}: ${w.message}`);
const pluginParams = (r: LoadResult, name: string) => r.config.plugins.find((p) => p.name === name)?.parameters;

const PD_PROFILES = [
  'schedulingProfiles:',
  '- name: prefill',
  '  plugins: [{ pluginRef: prefill-filter }, { pluginRef: max-score-picker }, { pluginRef: prefix-cache-scorer, weight: 2 }]',
  '- name: decode',
  '  plugins: [{ pluginRef: decode-filter }, { pluginRef: max-score-picker }, { pluginRef: prefix-cache-scorer, weight: 2 }]',
];

/** llm-d-router's e2e `deprecatedPdConfig`, shortened. */
const DEPRECATED_PD = yaml(
  'apiVersion: llm-d.ai/v1alpha1',
  'kind: EndpointPickerConfig',
  'plugins:',
  '- type: prefill-header-handler',
  '- type: approx-prefix-cache-producer',
  '  parameters: { blockSizeTokens: 32, maxPrefixBlocksToMatch: 128, lruCapacityPerServer: 256 }',
  '- type: prefix-cache-scorer',
  '- type: prefill-filter',
  '- type: decode-filter',
  '- type: max-score-picker',
  '- type: prefix-based-pd-decider',
  '  parameters: { nonCachedTokens: 16 }',
  '- type: pd-profile-handler',
  ...PD_PROFILES,
);

describe('llm-d compatibility', () => {
  test('approx-prefix-cache-producer: its parameters configure the prefix-cache-scorer, whose own values win', () => {
    const r = load(
      yaml(
        'plugins:',
        '- type: approx-prefix-cache-producer',
        '  parameters: { blockSizeTokens: 32, maxPrefixBlocksToMatch: 128, lruCapacityPerServer: 256 }',
        '- type: prefix-cache-scorer',
        '  parameters: { lruCapacityPerServer: 999 }',
        '- { type: prefix-cache-scorer, name: other, parameters: { prefixMatchInfoProducerName: someone-else } }',
      ),
    );
    assert.deepEqual(
      [pluginParams(r, 'prefix-cache-scorer')?.blockSizeTokens, pluginParams(r, 'prefix-cache-scorer')?.maxPrefixBlocksToMatch, pluginParams(r, 'prefix-cache-scorer')?.lruCapacityPerServer],
      [32, 128, 999],
    );
    // The block count alone does not set the window: the token window wins, as in llm-d (warned below).
    assert.equal(pluginParams(r, 'prefix-cache-scorer')?.maxPrefixTokensToMatch, 131_072);
    assert.equal(pluginParams(r, 'other')?.blockSizeTokens, 16, 'a scorer naming another producer keeps its own');
    assert.deepEqual(warnings(r), [
      '2: plugins[0].type: approx-prefix-cache-producer: its parameters apply to "prefix-cache-scorer" (in Sluice the prefix-cache-scorer keeps the index itself)',
      // Said where the user wrote it, not on the scorer it was lent to.
      '3: plugins[0].parameters.maxPrefixBlocksToMatch: ignored: maxPrefixTokensToMatch (131072 tokens) takes precedence, as in llm-d; set maxPrefixTokensToMatch: 0 to cap the match by blocks',
      // A producer name nobody declared (a typo, say): said, since no producer's parameters reach that scorer.
      '6: plugins[2].parameters.prefixMatchInfoProducerName: no plugin named "someone-else" is declared: no approx-prefix-cache-producer lends its parameters to this scorer',
    ]);
    // A bad parameter is reported once, where it was written.
    const bad = problems(yaml('plugins:', '- type: approx-prefix-cache-producer', '  parameters: { blockSizeTokens: 0 }', '- type: prefix-cache-scorer'));
    assert.equal(bad.length, 1, bad.join('\n'));
    assert.match(bad[0]!, /^c\.yaml:3:\d+: plugins\[0\]\.parameters\.blockSizeTokens: /);
    const alone = load(yaml('plugins:', '- type: approx-prefix-cache-producer', '- type: queue-scorer'));
    assert.match(
      warnings(alone).join('\n'),
      /approx-prefix-cache-producer: no prefix-cache-scorer uses it, so it runs as a prefix-cache-scorer named "approx-prefix-cache-producer"/,
    );
    // Alone, it keeps the index itself: a prefix-cache-scorer under its name, with its parameters.
    const spec = alone.config.plugins.find((p) => p.name === 'approx-prefix-cache-producer');
    assert.equal(spec?.type, 'prefix-cache-scorer');
    const named = load(yaml('plugins:', '- { type: approx-prefix-cache-producer, name: cpu, parameters: { blockSizeTokens: 32 } }', '- type: queue-scorer'));
    assert.deepEqual([pluginParams(named, 'cpu')?.blockSizeTokens, named.config.plugins.find((p) => p.name === 'cpu')?.type], [32, 'prefix-cache-scorer']);
    assert.deepEqual(load(effectiveConfigYaml(named)).config.plugins, named.config.plugins, 'validate output loads back the same');
  });

  test('producers without a scorer each run as one with their own parameters; an invalid name is still reported', () => {
    const r = load(
      yaml(
        'plugins:',
        '- { type: approx-prefix-cache-producer, name: a, parameters: { blockSizeTokens: 32 } }',
        '- { type: approx-prefix-cache-producer, name: b, parameters: { blockSizeTokens: 64, lruCapacityPerServer: 7 } }',
        '- type: queue-scorer',
      ),
    );
    const spec = (name: string) => r.config.plugins.find((p) => p.name === name);
    assert.deepEqual([spec('a')?.type, spec('a')?.parameters.blockSizeTokens, spec('a')?.parameters.lruCapacityPerServer], ['prefix-cache-scorer', 32, 31250]);
    assert.deepEqual([spec('b')?.type, spec('b')?.parameters.blockSizeTokens, spec('b')?.parameters.lruCapacityPerServer], ['prefix-cache-scorer', 64, 7]);
    for (const name of ['5', "''"]) {
      const lines = problems(yaml('plugins:', `- { type: approx-prefix-cache-producer, name: ${name} }`, '- type: queue-scorer'));
      assert.match(lines.join('\n'), /plugins\[0\]\.name: /, `name ${name}`);
    }
    // Two unnamed producers: the duplicate is reported at the type, the key the user wrote.
    const twice = problems(yaml('plugins:', '- type: approx-prefix-cache-producer', '- type: approx-prefix-cache-producer'));
    assert.match(twice.join('\n'), /plugins\[1\]\.type: .*approx-prefix-cache-producer/);
  });

  test("llm-d's optimized baseline guide, the revision with the in-flight token gate, loads", () => {
    const r = load(
      yaml(
        'apiVersion: llm-d.ai/v1alpha1',
        'kind: EndpointPickerConfig',
        'plugins:',
        '- type: token-load-scorer',
        '- type: inflight-load-producer',
        '- type: approx-prefix-cache-producer',
        '  parameters: { maxPrefixTokensToMatch: 40960 }',
        '- type: prefix-cache-affinity-filter',
        '  parameters: { affinityThreshold: 0.80, maxTokensInFlightPenalty: 286720, maxTTFTPenaltyMs: 0 }',
        'schedulingProfiles:',
        '- name: default',
        '  plugins:',
        '  - pluginRef: prefix-cache-affinity-filter',
        '  - pluginRef: token-load-scorer',
      ),
    );
    assert.equal(pluginParams(r, 'prefix-cache-affinity-filter')?.maxTokensInFlightPenalty, 286720);
    assert.equal(r.config.plugins.find((p) => p.name === 'approx-prefix-cache-producer')?.type, 'prefix-cache-scorer');
  });

  test('deprecated pd-profile-handler with prefill-header-handler (llm-d e2e config): loads and runs as disagg-profile-handler', () => {
    const r = load(DEPRECATED_PD);
    assert.deepEqual(pluginParams(r, 'pd-profile-handler'), {
      profiles: { decode: 'decode', prefill: 'prefill' },
      deciders: { prefill: 'prefix-based-pd-decider' },
      connector: 'sidecar',
    });
    const ws = warnings(r).join('\n');
    assert.match(ws, /^4: plugins\[0\]\.parameters: prefill-header-handler does nothing here: deprecated in llm-d; the sidecar connector sets x-prefiller-host-port itself$/m);
    assert.match(ws, /pd-profile-handler is deprecated in llm-d; it runs as disagg-profile-handler/);
    // What validate prints loads back to the same configuration.
    const again = load(effectiveConfigYaml(r));
    assert.deepEqual(again.config.plugins, r.config.plugins);

    const clock = new ManualClock();
    const logger = { warn() {}, info() {}, debug() {} };
    const built = buildScheduling(r.config, registry, { clock, random: seededRandom(1), pool: { endpoints: [] }, logger, plugins: new Map() });
    const handler = [...built.plugins.values()].find((p) => p instanceof DisaggProfileHandler) as DisaggProfileHandler | undefined;
    assert.ok(handler, 'a disagg profile handler was built');
    assert.equal(handler.decider?.name, 'prefix-based-pd-decider');
  });

  test("disagg-profile-handler reads llm-d's older flat keys, but not mixed with the nested form", () => {
    const flat = load(
      yaml(
        'plugins:',
        '- type: prefill-filter',
        '- type: decode-filter',
        '- type: prefix-cache-scorer',
        '- type: max-score-picker',
        '- { type: always-disagg-pd-decider, name: always }',
        '- type: disagg-profile-handler',
        '  parameters: { decodeProfile: decode, prefillProfile: prefill, deciderPluginName: always }',
        ...PD_PROFILES,
      ),
    );
    assert.deepEqual(pluginParams(flat, 'disagg-profile-handler'), {
      profiles: { decode: 'decode', prefill: 'prefill' },
      deciders: { prefill: 'always' },
      connector: 'sidecar',
    });
    const mixed = problems(
      yaml('plugins:', '- type: max-score-picker', '- type: disagg-profile-handler', '  parameters: { deciderPluginName: x, profiles: { decode: decode } }', ...PD_PROFILES),
    );
    assert.match(mixed.join('\n'), /deciderPluginName \(llm-d's older form\) cannot be mixed with profiles\/deciders/);
  });

  test('a decode-only disagg-profile-handler needs no prefill profile (llm-d e2e decodeOnlyConfig)', () => {
    const r = load(
      yaml(
        'plugins:',
        '- type: encode-filter',
        '- type: prefill-filter',
        '- type: decode-filter',
        '- type: max-score-picker',
        '- type: disagg-profile-handler',
        'schedulingProfiles:',
        '- name: decode',
        '  plugins: [{ pluginRef: decode-filter }, { pluginRef: max-score-picker }]',
      ),
    );
    assert.ok(r.config.plugins.some((p) => p.type === 'encode-filter'), 'loads whole, the unused encode and prefill filters included');
    assert.equal(r.config.schedulingProfiles.length, 1);
    // With a decider, the prefill profile must exist.
    const lines = problems(
      yaml(
        'plugins:',
        '- type: decode-filter',
        '- type: max-score-picker',
        '- type: always-disagg-pd-decider',
        '- type: disagg-profile-handler',
        '  parameters: { deciders: { prefill: always-disagg-pd-decider } }',
        'schedulingProfiles:',
        '- name: decode',
        '  plugins: [{ pluginRef: decode-filter }, { pluginRef: max-score-picker }]',
      ),
    );
    assert.match(lines.join('\n'), /no scheduling profile named "prefill"/);
  });

  test("kv-cache-scorer, the GIE's older name of kv-cache-utilization-scorer, runs as it, with a warning", () => {
    const r = load(yaml('plugins:', '- type: kv-cache-scorer', 'schedulingProfiles:', '- { name: default, plugins: [ { pluginRef: kv-cache-scorer, weight: 2 } ] }'));
    assert.match(warnings(r).join('\n'), /kv-cache-scorer is the GIE's older name of kv-cache-utilization-scorer, and runs as it/);
    assert.equal(builtinRegistry().get('kv-cache-scorer')!.create('k', {}, {} as never).type, 'kv-cache-utilization-scorer');
  });

  test('apiVersion llm-d.ai/v1, GIE feature gates, models-responder, openai-parser and inflight-load-producer load with what they mean here', () => {
    const r = load(
      yaml(
        'apiVersion: llm-d.ai/v1',
        'kind: EndpointPickerConfig',
        'featureGates: [dataLayer, flowControl]',
        'plugins:',
        '- type: models-responder',
        '- type: openai-parser',
        '- type: inflight-load-producer',
        '- { type: prefix-based-pd-decider, parameters: { nonCachedTokens: 8, promptTokens: 100, prefixMatchInfoProducerName: approx-prefix-cache-producer } }',
      ),
    );
    assert.equal(r.config.apiVersion, 'llm-d.ai/v1');
    const ws = warnings(r).join('\n');
    assert.match(ws, /^3: featureGates\[0\]: feature gate "dataLayer" \(GIE\) changes nothing in Sluice$/m);
    assert.match(ws, /models-responder does nothing here: Sluice answers \/v1\/models itself/);
    assert.match(ws, /openai-parser does nothing here: Sluice parses OpenAI requests itself/);
    assert.match(ws, /inflight-load-producer does nothing here/);
    assert.equal(warnings(r).length, 4, ws);
    assert.equal(pluginParams(r, 'prefix-based-pd-decider')?.promptTokens, 100);
    // Its llm-d parameters load; the ones that would change what is counted say they are ignored.
    const keys = load(
      yaml(
        'plugins:',
        '- type: inflight-load-producer',
        '  parameters: { addEstimatedOutputTokens: true, outputRatio: 1.5, maxEstimatedOutputTokens: 512, prefixMatchInfoProducerName: p, syncCrossReplicaState: true }',
      ),
    );
    const kw = warnings(keys).join('\n');
    assert.match(kw, /addEstimatedOutputTokens: addEstimatedOutputTokens is ignored: Sluice counts uncached prompt tokens only/);
    assert.match(kw, /syncCrossReplicaState: syncCrossReplicaState is ignored: each Sluice replica counts its own requests/);
  });

  test("errors in llm-d's older flat handler parameters name the key and line written, not the nested form", () => {
    const text = yaml(
      'plugins:',
      '- type: decode-filter',
      '- type: prefill-filter',
      '- type: prefix-based-pd-decider',
      '- type: disagg-profile-handler',
      '  parameters:',
      '    connector: nixlv2',
      '    decodeProfile: decode',
      '    prefillProfile: prefil',
      '    deciderPluginName: prefix-based-pd-decidr',
      'schedulingProfiles:',
      '- { name: prefill, plugins: [{ pluginRef: prefill-filter }] }',
      '- { name: decode, plugins: [{ pluginRef: decode-filter }] }',
    );
    assert.deepEqual(problems(text), [
      'c.yaml:9:21: plugins[3].parameters.prefillProfile: no scheduling profile named "prefil" (did you mean "prefill"?)',
      'c.yaml:10:24: plugins[3].parameters.deciderPluginName: no plugin named "prefix-based-pd-decidr" is declared (did you mean "prefix-based-pd-decider"?)',
    ]);
    assert.deepEqual(problems(yaml('plugins:', '- type: pd-profile-handler', '  parameters:', '    decodeProfile: decode', '    prefillProfile: 5')), [
      'c.yaml:5:21: plugins[0].parameters.prefillProfile: plugin "pd-profile-handler" (pd-profile-handler): expected a string, got number 5',
    ]);
  });

  test("pd-profile-handler takes llm-d's primaryPort 0 and prefixMatchInfoProducerName; another primaryPort is refused by name", () => {
    const handler = (params: string) =>
      yaml(
        'plugins:',
        ...['prefix-cache-scorer', 'prefill-filter', 'decode-filter', 'max-score-picker', 'prefix-based-pd-decider', 'pd-profile-handler'].map((t) => `- type: ${t}`),
        `  parameters: ${params}`,
        ...PD_PROFILES,
      );
    const r = load(handler('{ primaryPort: 0, prefixMatchInfoProducerName: approx-prefix-cache-producer }'));
    assert.deepEqual(pluginParams(r, 'pd-profile-handler'), {
      profiles: { decode: 'decode', prefill: 'prefill' },
      deciders: { prefill: 'prefix-based-pd-decider' },
      connector: 'sidecar',
    });
    assert.match(problems(handler('{ primaryPort: 8000 }')).join('\n'), /^c\.yaml:8:\d+: plugins\[5\]\.parameters\.primaryPort: .*data-parallel routing \(primaryPort other than 0\) is not supported/m);
    assert.match(problems(handler('{ primaryPort: "8000" }')).join('\n'), /plugins\[5\]\.parameters\.primaryPort: .*primaryPort must be an integer/);
  });

  test('keys llm-d removed get what replaced them; an encode plugin is never taken for a decode one', () => {
    const lines = problems(
      yaml(
        'plugins:',
        '- type: prefix-cache-scorer',
        '  parameters: { hashBlockSize: 64 }',
        '- type: pd-profile-handler',
        '  parameters: { threshold: 100 }',
        '- type: encode-scorer',
        '- type: precise-prefix-cache-producer',
        '- type: utilization-detector',
        '  parameters: { threshold: 3 }',
      ),
    );
    const text = lines.join('\n');
    assert.match(text, /hashBlockSize: .*unknown key "hashBlockSize" \(llm-d replaced it by blockSizeTokens on prefix-cache-scorer: tokens per block, a quarter of hashBlockSize, which counted characters; on a P\/D profile handler it has no use: delete it\)/);
    // KServe's "threshold: 0" meant always: the hint must not send it to nonCachedTokens 0 (P/D off).
    assert.match(text, /plugins\[1\]\.parameters\.threshold: .*threshold 0 \(always disaggregate\) is always-disagg-pd-decider, any other a prefix-based-pd-decider with nonCachedTokens: <threshold>\)/);
    assert.match(text, /unknown plugin type "encode-scorer"$/m, 'no decode-… suggestion for an encode name');
    assert.match(text, /plugins\[3\]\.type: plugin type "precise-prefix-cache-producer" is llm-d's and Sluice does not implement it: the precise prefix cache/, 'not the approximate one');
    assert.match(text, /plugins\[4\]\.parameters\.threshold: .*unknown key "threshold"/);
    assert.doesNotMatch(text, /plugins\[4\]\.parameters\.threshold: .*nonCachedTokens/, 'the P/D hint is only for a profile handler');
  });

  test("llm-d plugin types Sluice does not implement say so and what comes nearest, never a near name that means something else", () => {
    const text = problems(yaml('plugins:', '- type: ed-profile-handler', '- type: burst-prefix-cache-producer', '- type: load-aware-scorr')).join('\n');
    assert.match(text, /plugins\[0\]\.type: plugin type "ed-profile-handler" is llm-d's and Sluice does not implement it: encode\/prefill\/decode \(E\/PD\) disaggregation is not implemented/);
    assert.doesNotMatch(text, /did you mean "pd-profile-handler"|did you mean "approx-prefix-cache-producer"/);
    assert.match(text, /plugins\[1\]\.type: plugin type "burst-prefix-cache-producer" is llm-d's/);
    assert.match(text, /plugins\[2\]\.type: unknown plugin type "load-aware-scorr" \(did you mean "load-aware-scorer"\?\)/, 'a typo still gets its suggestion');
  });

  test('validate says whether flow control is on, since llm-d defaults it off', () => {
    assert.match(effectiveConfigYaml(load(yaml('plugins: []'))), /^# flow control: on \(Sluice's default; llm-d's is off: featureGates: \[flowControl=false\] turns it off\)$/m);
    assert.match(effectiveConfigYaml(load(yaml('featureGates: [flowControl=false]'))), /^# flow control: off/m);
    // llm-d's configs turn it on with the gate: that is what the header names then.
    assert.match(effectiveConfigYaml(load(yaml('featureGates: [flowControl]'))), /^# flow control: on \(featureGates\)$/m);
  });

  test("prefix-cache-scorer's length term under llm-d's earlier names: refused with the name to write", () => {
    const text = problems(yaml('plugins:', '- type: prefix-cache-scorer', '  parameters: { prefixLengthWeight: 0.5, prefillSaturationTokens: 4096, maxModelLen: 8 }')).join('\n');
    assert.match(text, /unknown key "prefixLengthWeight" \(llm-d renamed it matchLengthWeight\)/);
    assert.match(text, /unknown key "prefillSaturationTokens" \(llm-d renamed it matchLengthScaleTokens\)/);
    assert.match(text, /unknown key "maxModelLen" \(llm-d replaced it by matchLengthScaleTokens: .*not the context length\)/);
  });

  test("llm-d's guides' tokenizer is refused as what it is; their endpoint-notification-source loads (it stands for nothing here)", () => {
    const text = problems(yaml('plugins:', '- type: tokenizer', '  parameters: { modelName: m }', '- type: endpoint-notification-source')).join('\n');
    assert.match(text, /plugins\[0\]\.type: plugin type "tokenizer" is llm-d's and Sluice does not implement it: Sluice does not tokenize/);
    assert.doesNotMatch(text, /endpoint-notification-source/);
    assert.equal(problems(yaml('plugins:', '- type: endpoint-notification-source', '  parameters: { x: 1 }')).length, 1, 'it has no parameters');
  });
});

test('a scorer that names its producer explicitly borrows its parameters (llm-d\'s usual form)', () => {
  const r = load(yaml('plugins:', '- type: approx-prefix-cache-producer', '  parameters: { blockSizeTokens: 32 }', '- type: prefix-cache-scorer', '  parameters: { prefixMatchInfoProducerName: approx-prefix-cache-producer }'));
  assert.equal(pluginParams(r, 'prefix-cache-scorer')?.blockSizeTokens, 32);
  assert.equal(r.config.plugins.filter((p) => p.type === 'prefix-cache-scorer').length, 1);
});
