/**
 * Effective configuration → ready-to-run scheduling: one plugin instance per configured name
 * (shared by every profile that references it), the profiles, the one profile handler, the
 * PreRequest and response-header hooks, and the flow-control saturation detector.
 *
 * The config loader has already validated and defaulted everything (SPEC §3.6), so anything
 * inconsistent here is a bug upstream and throws a plain Error.
 */
import type { SluiceConfig } from '../config/types.js';
import type { PluginDeps, PluginRegistry } from '../plugins/registry.js';
import { isSaturationDetector, type SaturationDetector } from '../saturation/detector.js';
import {
  isFilter,
  isPicker,
  isPreRequest,
  isProfileHandler,
  isResponseHeadersHook,
  isScorer,
  type Filter,
  type Picker,
  type Plugin,
  type PreRequest,
  type ProfileHandler,
  type ResponseHeadersHook,
  type SchedulingProfile,
  type Scorer,
} from './framework.js';
import { findPrefixMatcher } from './prompt-load.js';
import { Scheduler } from './scheduler.js';

export interface BuiltScheduling {
  scheduler: Scheduler;
  /** Every instantiated plugin, by name, in configuration order. */
  plugins: Map<string, Plugin>;
  detector: SaturationDetector;
  responseHooks: ResponseHeadersHook[];
}

/** `previous`: the plugins of the configuration a reload replaces (see Plugin.carryOver). */
export function buildScheduling(
  config: SluiceConfig,
  registry: PluginRegistry,
  deps: PluginDeps,
  previous?: ReadonlyMap<string, Plugin>,
  replacedEndpoints: ReadonlySet<string> = new Set(),
): BuiltScheduling {
  const plugins = new Map<string, Plugin>();
  // Plugins see the ones created before them (a plugin may reference another by name).
  const pluginDeps: PluginDeps = { ...deps, plugins };

  // Profile handlers last, so they can resolve the deciders/plugins they reference at creation.
  const ordered = [...config.plugins].sort(
    (a, b) => Number(registry.is(a.type, 'profileHandler')) - Number(registry.is(b.type, 'profileHandler')),
  );
  for (const spec of ordered) {
    const def = registry.get(spec.type);
    if (def === undefined) throw new Error(`plugin '${spec.name}': unknown type '${spec.type}'`);
    if (plugins.has(spec.name)) throw new Error(`plugin name '${spec.name}' is declared twice`);
    const parsed = def.params.safeParse(spec.parameters ?? {});
    if (!parsed.success) {
      throw new Error(`plugin '${spec.name}' (${spec.type}): invalid parameters: ${parsed.error.message}`);
    }
    plugins.set(spec.name, def.create(spec.name, parsed.data, pluginDeps));
  }
  // Back to configuration order for everything that iterates the map.
  const byConfigOrder = new Map<string, Plugin>();
  for (const spec of config.plugins) byConfigOrder.set(spec.name, plugins.get(spec.name)!);
  const profiles = new Map<string, SchedulingProfile>();
  for (const profileConfig of config.schedulingProfiles) {
    if (profiles.has(profileConfig.name)) throw new Error(`scheduling profile '${profileConfig.name}' is declared twice`);
    const filters: Filter[] = [];
    const scorers: { scorer: Scorer; weight: number }[] = [];
    let picker: Picker | undefined;
    for (const ref of profileConfig.plugins) {
      const plugin = byConfigOrder.get(ref.pluginRef);
      if (plugin === undefined) {
        throw new Error(`scheduling profile '${profileConfig.name}': no plugin named '${ref.pluginRef}'`);
      }
      let used = false;
      if (isFilter(plugin)) {
        filters.push(plugin);
        used = true;
      }
      if (isScorer(plugin)) {
        scorers.push({ scorer: plugin, weight: ref.weight ?? 1 });
        used = true;
      }
      if (isPicker(plugin)) {
        if (picker !== undefined) {
          throw new Error(
            `scheduling profile '${profileConfig.name}': more than one picker ('${picker.name}', '${plugin.name}')`,
          );
        }
        picker = plugin;
        used = true;
      }
      if (!used) {
        throw new Error(
          `scheduling profile '${profileConfig.name}': plugin '${ref.pluginRef}' (${plugin.type}) is not a filter, scorer or picker`,
        );
      }
    }
    if (picker === undefined) throw new Error(`scheduling profile '${profileConfig.name}' has no picker`);
    profiles.set(profileConfig.name, { name: profileConfig.name, filters, scorers, picker });
  }
  if (profiles.size === 0) throw new Error('no scheduling profiles configured');

  const handlers: ProfileHandler[] = [];
  const preRequest: PreRequest[] = [];
  const responseHooks: ResponseHeadersHook[] = [];
  for (const plugin of byConfigOrder.values()) {
    if (isProfileHandler(plugin)) handlers.push(plugin);
    if (isPreRequest(plugin)) preRequest.push(plugin);
    if (isResponseHeadersHook(plugin)) responseHooks.push(plugin);
  }
  if (handlers.length === 0) throw new Error('no profile handler configured');
  if (handlers.length > 1) {
    throw new Error(`multiple profile handlers configured: ${handlers.map((h) => h.name).join(', ')}`);
  }

  const detectorRef = config.flowControl.saturationDetector.pluginRef;
  const detector = byConfigOrder.get(detectorRef);
  if (detector === undefined) throw new Error(`flowControl.saturationDetector: no plugin named '${detectorRef}'`);
  if (!isSaturationDetector(detector)) {
    throw new Error(`flowControl.saturationDetector: plugin '${detectorRef}' (${detector.type}) is not a saturation detector`);
  }

  // A reload: each plugin takes over what its predecessor of the same name and type learned. Last,
  // once nothing can throw: a take-over may change what the predecessor holds (the prefix index
  // forgets moved endpoints), and a build that fails leaves the running one as it was.
  for (const [name, plugin] of byConfigOrder) {
    const before = previous?.get(name);
    if (before !== undefined && before.type === plugin.type) plugin.carryOver?.(before, replacedEndpoints);
  }

  const ctx = { clock: deps.clock, random: deps.random };
  const scheduler = new Scheduler(handlers[0]!, profiles, preRequest, ctx, detector, findPrefixMatcher(byConfigOrder.values()));
  return { scheduler, plugins: byConfigOrder, detector, responseHooks };
}
