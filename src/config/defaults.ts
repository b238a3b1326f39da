/**
 * The "ensure" step (SPEC §3.5/§3.6, reference §1.7 step 5): completes a parsed config with the
 * plugins and profile entries llm-d would add, recording each addition so `sluice validate` can
 * show it. Pure: reads the registry's definitions (kinds, default parameters) and returns a new
 * config; the input is not modified. Dangling references are left for the loader to report.
 */
import type { PluginKind, PluginRegistry } from '../plugins/registry.js';
import {
  DEFAULT_FAIRNESS_POLICY,
  DEFAULT_ORDERING_POLICY,
  DEFAULT_SATURATION_DETECTOR,
  DEFAULT_USAGE_LIMIT_POLICY,
  FEATURE_GATE_DEFAULTS,
  parseFeatureGate,
} from './schema.js';
import type { Injection, PluginSpec, SluiceConfig } from './types.js';

export const DEFAULT_PROFILE_NAME = 'default';
export const SINGLE_PROFILE_HANDLER = 'single-profile-handler';
export const DEFAULT_PICKER = 'max-score-picker';

/** SPEC §3.5: the scorers (and weights) of the default profile when nothing is configured. */
export const DEFAULT_SCORERS: readonly { type: string; weight: number }[] = [
  { type: 'queue-scorer', weight: 2 },
  { type: 'kv-cache-utilization-scorer', weight: 2 },
  { type: 'prefix-cache-scorer', weight: 3 },
];

const FLOW_CONTROL_POLICIES = [DEFAULT_ORDERING_POLICY, DEFAULT_FAIRNESS_POLICY, DEFAULT_USAGE_LIMIT_POLICY];

/** Default parameters of a plugin type (its schema applied to `{}`); `{}` if unknown or required params. */
function defaultParameters(registry: PluginRegistry, type: string): Record<string, unknown> {
  const result = registry.get(type)?.params.safeParse({});
  return result?.success && typeof result.data === 'object' && result.data !== null
    ? (result.data as Record<string, unknown>)
    : {};
}

export function ensure(input: SluiceConfig, registry: PluginRegistry): { config: SluiceConfig; injections: Injection[] } {
  const config = structuredClone(input);
  const injections: Injection[] = [];
  const { plugins, schedulingProfiles: profiles, flowControl } = config;

  const byName = (name: string): PluginSpec | undefined => plugins.find((p) => p.name === name);
  const isKind = (p: PluginSpec, kind: PluginKind): boolean => registry.is(p.type, kind);
  const inject = (type: string, why: string): PluginSpec => {
    const spec: PluginSpec = { type, name: type, parameters: defaultParameters(registry, type) };
    plugins.push(spec);
    injections.push({ where: 'plugins', what: `${type} (${why})` });
    return spec;
  };

  // 1. Nothing to schedule with: the §3.5 default profile. Detectors and flow-control policies do
  //    not count, so tuning only the detector still gets the default scorers.
  const schedulingKinds: PluginKind[] = ['filter', 'scorer', 'picker', 'profileHandler'];
  const declaresScheduling = plugins.some(
    (p) => !isKind(p, 'saturationDetector') && schedulingKinds.some((k) => isKind(p, k)),
  );
  if (profiles.length === 0 && !declaresScheduling) {
    // A declared plugin of another type under a default scorer's name (a detector can be one) must
    // not stand in for it: the injected scorer then clashes with it, and the loader names both.
    for (const { type } of DEFAULT_SCORERS) if (byName(type)?.type !== type) inject(type, 'default scorer: no scheduling plugins configured');
    profiles.push({ name: DEFAULT_PROFILE_NAME, plugins: DEFAULT_SCORERS.map((s) => ({ pluginRef: s.type, weight: s.weight })) });
    injections.push({
      where: 'schedulingProfiles',
      what: `profile ${DEFAULT_PROFILE_NAME} (${DEFAULT_SCORERS.map((s) => `${s.type} x${s.weight}`).join(', ')})`,
    });
  } else if (profiles.length === 0) {
    // 2. No profiles: one profile with every filter, scorer and picker, in declaration order (llm-d
    //    iterates a map here, so its order is random; ours is deterministic). Detectors are left out:
    //    declared first they would narrow before the role filters; step 9 appends the configured one last.
    const members = plugins.filter(
      (p) => !isKind(p, 'saturationDetector') && (isKind(p, 'filter') || isKind(p, 'scorer') || isKind(p, 'picker')),
    );
    profiles.push({ name: DEFAULT_PROFILE_NAME, plugins: members.map((p) => ({ pluginRef: p.name })) });
    injections.push({
      where: 'schedulingProfiles',
      what: `profile ${DEFAULT_PROFILE_NAME} with every declared filter, scorer and picker (no profiles configured)`,
    });
  }

  // 3. One profile and no handler.
  if (profiles.length === 1 && !plugins.some((p) => isKind(p, 'profileHandler'))) {
    inject(SINGLE_PROFILE_HANDLER, 'one profile and no profile handler');
  }

  // 4. No picker at all.
  if (!plugins.some((p) => isKind(p, 'picker'))) inject(DEFAULT_PICKER, 'no picker configured');

  // 5. Scorer weights default to 1; 6. profiles without a picker get the first picker.
  const firstPicker = plugins.find((p) => isKind(p, 'picker'))!;
  profiles.forEach((profile, i) => {
    for (const ref of profile.plugins) {
      const spec = byName(ref.pluginRef);
      if (spec && ref.weight === undefined && isKind(spec, 'scorer')) ref.weight = 1;
    }
    const hasPicker = profile.plugins.some((ref) => {
      const spec = byName(ref.pluginRef);
      return spec !== undefined && isKind(spec, 'picker');
    });
    if (!hasPicker) {
      profile.plugins.push({ pluginRef: firstPicker.name });
      injections.push({
        where: `schedulingProfiles[${i}].plugins`,
        what: `${firstPicker.name} as picker of profile ${profile.name}`,
      });
    }
  });

  // 7. Flow-control policies (regardless of the feature gate, as llm-d does).
  for (const type of FLOW_CONTROL_POLICIES) if (!byName(type)) inject(type, 'default flow-control policy');
  if (flowControl.usageLimitPolicyPluginRef === '') flowControl.usageLimitPolicyPluginRef = DEFAULT_USAGE_LIMIT_POLICY;
  for (const band of [flowControl.defaultPriorityBand, flowControl.defaultNegativePriorityBand, ...flowControl.priorityBands]) {
    if (!band) continue;
    if (band.fairnessPolicyRef === '') band.fairnessPolicyRef = DEFAULT_FAIRNESS_POLICY;
    if (band.orderingPolicyRef === '') band.orderingPolicyRef = DEFAULT_ORDERING_POLICY;
  }

  // 8. The saturation detector: defaulted by name; only the default one is auto-declared.
  if (flowControl.saturationDetector.pluginRef === '') {
    flowControl.saturationDetector = { pluginRef: DEFAULT_SATURATION_DETECTOR };
  }
  const detectorRef = flowControl.saturationDetector.pluginRef;
  if (detectorRef === DEFAULT_SATURATION_DETECTOR && !byName(detectorRef)) {
    inject(DEFAULT_SATURATION_DETECTOR, 'saturation detector');
  }

  // 9. The detector also filters (SPEC §7.2): last filter of every profile that neither lists it
  //    nor opts out. Appended at the end so the indexes of configured entries stay as written.
  const detector = byName(detectorRef);
  if (detector && isKind(detector, 'filter')) {
    profiles.forEach((profile, i) => {
      if (profile.saturationFilter === false) return;
      if (profile.plugins.some((ref) => ref.pluginRef === detectorRef)) return;
      profile.plugins.push({ pluginRef: detectorRef });
      injections.push({ where: `schedulingProfiles[${i}].plugins`, what: `${detectorRef} as last filter of profile ${profile.name}` });
    });
  }

  return { config, injections };
}

/** Whether `featureGates` names `gate` (rather than leaving it at its default). */
export function featureGateWritten(config: Pick<SluiceConfig, 'featureGates'>, gate: string): boolean {
  return config.featureGates.some((entry) => {
    const parsed = parseFeatureGate(entry);
    return !(parsed instanceof Error) && parsed.name === gate;
  });
}

/** Is a feature gate on? Later entries win; unset gates take their default (flowControl: on). */
export function featureEnabled(config: Pick<SluiceConfig, 'featureGates'>, gate: string): boolean {
  let enabled = FEATURE_GATE_DEFAULTS[gate] ?? false;
  for (const entry of config.featureGates) {
    const parsed = parseFeatureGate(entry);
    if (!(parsed instanceof Error) && parsed.name === gate) enabled = parsed.enabled;
  }
  return enabled;
}
