/**
 * Plugin registry: llm-d type name → definition. A definition declares which extension points the
 * plugin implements (so the config loader's "ensure" step can reason about a config without
 * instantiating anything), a zod schema that validates and defaults its parameters (so a bad
 * parameter is a config error with a path), and a factory.
 */
import type { z } from 'zod';
import type { Endpoint } from '../datalayer/endpoint.js';
import type { Plugin } from '../scheduling/framework.js';
import type { Clock, RandomSource } from '../util/clock.js';

export type PluginKind =
  | 'filter'
  | 'scorer'
  | 'picker'
  | 'profileHandler'
  | 'saturationDetector'
  | 'decider'
  | 'fairnessPolicy'
  | 'orderingPolicy'
  | 'usageLimitPolicy';

/** The live endpoint set, as plugins may read it (e.g. prefix index purge, autoTune). */
export interface PoolView {
  readonly endpoints: readonly Endpoint[];
}

export interface PluginLogger {
  warn(obj: object, msg?: string): void;
  info(obj: object, msg?: string): void;
  debug(obj: object, msg?: string): void;
}

export interface PluginDeps {
  clock: Clock;
  random: RandomSource;
  pool: PoolView;
  logger: PluginLogger;
  /** Plugins instantiated so far, by name (a plugin may reference another in its parameters). */
  plugins: ReadonlyMap<string, Plugin>;
  /**
   * Counts a plugin type's decisions by outcome in `llm_d_epp_<type>_decisions_total{plugin_name,
   * outcome}`; absent outside a gateway (unit tests), where nothing is counted.
   */
  decisionCounter?(pluginType: string, help: string): (pluginName: string, outcome: string) => void;
  /**
   * Records a scheduled request's expected prefix hit in `llm_d_epp_prefix_indexer_hit_ratio` and
   * `_hit_bytes{plugin_name, plugin_type}`; absent outside a gateway.
   */
  prefixIndexerMatch?(pluginName: string, pluginType: string): (matchedBytes: number, totalBytes: number) => void;
}

/** A profile or another plugin named in a plugin's parameters, for the loader to check. */
export type PluginReference =
  | { readonly path: readonly (string | number)[]; readonly name: string; readonly to: 'profile' }
  | {
      readonly path: readonly (string | number)[];
      readonly name: string;
      readonly to: 'plugin';
      readonly kinds: readonly PluginKind[];
      /** How the reference is used, for the message ("the prefill decider"). */
      readonly usage: string;
    };

export interface PluginDefinition<P = unknown> {
  readonly type: string;
  readonly kinds: readonly PluginKind[];
  /** Validates raw parameters (absent → `{}`) and fills defaults. Must be strict (unknown keys rejected). */
  readonly params: z.ZodType<P>;
  /** Names in the parsed parameters that must resolve (paths relative to `parameters`). */
  references?(params: P): PluginReference[];
  /**
   * Where a path of the parsed parameters was written in `raw` (the parameters as in the file), for
   * a definition whose schema moves keys (llm-d's older flat forms): errors then name that key.
   */
  writtenPath?(raw: unknown, path: readonly (string | number)[]): (string | number)[];
  /**
   * Warnings about how the parsed parameters meet the rest of the configuration (a threshold the
   * metrics scrape interval cannot meet, say). The loader places each at the user's key.
   */
  configWarnings?(params: P, context: PluginConfigContext): PluginConfigWarning[];
  /**
   * A filter that decides by an endpoint's labels alone: whether it keeps an endpoint with these
   * labels. The loader warns about a profile whose filters keep none of the configured endpoints.
   */
  keepsByLabels?(params: P, labels: Readonly<Record<string, string>>): boolean;
  /**
   * The plugin's parameters configure plugins of another type (an llm-d data producer whose work
   * that type does here): the loader copies them into each declared plugin of type `to` whose
   * parameter `referencedBy` names this one or is unset; that plugin's own values win. When none
   * is declared, the plugin itself runs as a plugin of type `to` (under its own name).
   */
  readonly lendsParameters?: { readonly to: string; readonly referencedBy: string };
  /**
   * Settings outside `plugins` that the parsed parameters stand for (llm-d configures in a plugin
   * what Sluice configures in a section): the loader applies each one, unless the user wrote that
   * setting too, in which case the two must agree.
   */
  standsFor?(params: P): PluginSettingValue[];
  create(name: string, params: P, deps: PluginDeps): Plugin;
}

/** A setting of the configuration (a path such as pool.metrics.path) and the value a plugin parameter gives it. */
export interface PluginSettingValue {
  readonly parameter: string;
  readonly setting: readonly string[];
  /** The value as the setting holds it (parsed: a duration in ms). */
  readonly value: unknown;
  /** The value as the user wrote it, for messages. */
  readonly written: string;
}

/** What a plugin may check its parameters against (see PluginDefinition.configWarnings). */
export interface PluginConfigContext {
  /** pool.metrics.interval, ms. */
  metricsIntervalMs: number;
  /** The names of the plugins declared in the file (a parameter naming another plugin is checked against them). */
  declaredNames?: ReadonlySet<string>;
  /** The names of the scheduling profiles. */
  profileNames?: ReadonlySet<string>;
}

export interface PluginConfigWarning {
  /** The plugin's parameter the warning is about. */
  parameter?: string;
  /**
   * Shown only where `parameter` is written in this plugin's entry: a parameter another plugin lent
   * (PluginDefinition.lendsParameters) is warned about at the lender, which checks its own.
   */
  whereWritten?: boolean;
  /** The setting outside the plugin it conflicts with (a config path): shown there when the user wrote it. */
  setting?: readonly string[];
  message: string;
}

export class PluginRegistry {
  private readonly defs = new Map<string, PluginDefinition<any>>();

  register<P>(def: PluginDefinition<P>): this {
    if (this.defs.has(def.type)) throw new Error(`plugin type '${def.type}' is already registered`);
    this.defs.set(def.type, def);
    return this;
  }

  get(type: string): PluginDefinition<unknown> | undefined {
    return this.defs.get(type);
  }

  has(type: string): boolean {
    return this.defs.has(type);
  }

  types(): string[] {
    return [...this.defs.keys()].sort();
  }

  /** Does a plugin of this type implement the given extension point? */
  is(type: string, kind: PluginKind): boolean {
    return this.defs.get(type)?.kinds.includes(kind) ?? false;
  }
}
