/**
 * `disagg-profile-handler` — profile handler for prefill/decode disaggregation (SPEC §7.3, llm-d).
 *
 * Rounds:
 * 1. run the decode profile (always first: the decision depends on the decode endpoint's cache);
 * 2. decode found nothing → stop (the request fails like any profile failure, 429);
 * 3. if a prefill decider is configured, the request's API can be disaggregated by the connector
 *    and the decider says yes for (request, chosen decode endpoint) → run the prefill profile;
 * 4. stop.
 * The decode result is primary (the request goes to the decode endpoint). The result carries
 * `disaggregation`: `prefill-decode` with the prefill endpoint when the prefill profile chose one
 * that is not the decode endpoint itself (when it chose that one, the next endpoint it scored as
 * high, if any), otherwise `decode-only` (prefill finding nothing degrades to decode-only). The
 * proxy counts the decision in `llm_d_epp_disagg_decision_total` once per request and carries it
 * out with `connector`.
 *
 * APIs: chat and completions, whatever the connector (the llm-d routing sidecar runs its P/D
 * protocol for those two paths and passes any other, `/v1/responses` too, to its decoder as is);
 * responses and embeddings are always decode-only. Under
 * `nixlv2`, a request for several sequences (`n` > 1) or prompts (a completions batch) is decode-only:
 * its prefill leg's `kv_transfer_params` name one prompt's KV for one sequence.
 *
 * Parameters:
 * - `profiles.decode` "decode", `profiles.prefill` "prefill" — profile names (must differ)
 * - `deciders.prefill` — name of a decider plugin; absent = P/D disabled (always decode-only)
 * - `connector` "sidecar" — Sluice: `sidecar` | `nixlv2` | `shared-storage` (SPEC §7.4)
 * - `stageOrder` — llm-d's; `decode-first` (its default, the order above) is accepted, `prefill-first` refused
 * - llm-d's older flat form is read too: `decodeProfile`, `prefillProfile`, `deciderPluginName` or
 *   `prefillDeciderPluginName` (not mixed with `profiles`/`deciders`)
 */
import { z } from 'zod';
import type { Endpoint } from '../../datalayer/endpoint.js';
import type { PluginDefinition, PluginDeps, PluginReference } from '../../plugins/registry.js';
import {
  isDecider,
  type ApiKind,
  type ConnectorName,
  type CycleContext,
  type Decider,
  type Plugin,
  type ProfileHandler,
  type ProfileRunResult,
  type SchedulingProfile,
  type SchedulingRequest,
  type SchedulingResult,
  type ScoredEndpoint,
  singleSequence,
} from '../framework.js';

export const DISAGG_PROFILE_HANDLER_TYPE = 'disagg-profile-handler';

export const CONNECTORS = ['sidecar', 'nixlv2', 'shared-storage'] as const satisfies readonly ConnectorName[];

/**
 * APIs each connector can run as prefill + decode; anything else is served decode-only. The routing
 * sidecar sends a request of another path straight to its decoder: a prefill endpoint named for
 * it would be counted busy with a prompt it never gets.
 */
const DISAGG_APIS: Readonly<Record<ConnectorName, ReadonlySet<ApiKind>>> = {
  sidecar: new Set<ApiKind>(['chat', 'completions']),
  nixlv2: new Set<ApiKind>(['chat', 'completions']),
  'shared-storage': new Set<ApiKind>(['chat', 'completions']),
};

/** Connectors whose prefill leg serves one prompt for one sequence: `n` > 1 and prompt batches are decode-only. */
const SINGLE_SEQUENCE_ONLY: ReadonlySet<ConnectorName> = new Set<ConnectorName>(['nixlv2']);

/** llm-d's older flat parameters, still accepted by llm-d (not mixed with the nested form). */
const FLAT_KEYS: Readonly<Record<string, readonly ['profiles' | 'deciders', 'decode' | 'prefill']>> = {
  decodeProfile: ['profiles', 'decode'],
  prefillProfile: ['profiles', 'prefill'],
  deciderPluginName: ['deciders', 'prefill'],
  prefillDeciderPluginName: ['deciders', 'prefill'],
};

/** Rewrites the flat form into the nested one; a mix of both is an error. */
function nestFlatKeys(raw: unknown, ctx: { addIssue(issue: { code: 'custom'; message: string; path?: PropertyKey[] }): void }): unknown {
  if (typeof raw !== 'object' || raw === null || Array.isArray(raw)) return raw;
  const flat = Object.keys(raw).filter((k) => Object.hasOwn(FLAT_KEYS, k));
  if (flat.length === 0) return raw;
  const rest: Record<string, unknown> = { ...raw };
  if (rest.profiles !== undefined || rest.deciders !== undefined) {
    ctx.addIssue({ code: 'custom', message: `${flat.join(', ')} (llm-d's older form) cannot be mixed with profiles/deciders`, path: [flat[0]!] });
    return raw;
  }
  const nested: Record<'profiles' | 'deciders', Record<string, unknown>> = { profiles: {}, deciders: {} };
  for (const key of flat) {
    const [group, role] = FLAT_KEYS[key]!;
    nested[group][role] = rest[key];
    delete rest[key];
  }
  return { ...rest, profiles: nested.profiles, deciders: nested.deciders };
}

/**
 * Where a path of the nested parameters was written: under the flat key it came from, when the raw
 * parameters use llm-d's older form (so an error names the key and line the user wrote).
 */
export function flatKeyPath(raw: unknown, path: readonly (string | number)[]): (string | number)[] {
  if (typeof raw === 'object' && raw !== null && !Array.isArray(raw) && path.length >= 2) {
    for (const key of Object.keys(raw)) {
      const nested = Object.hasOwn(FLAT_KEYS, key) ? FLAT_KEYS[key]! : undefined;
      if (nested !== undefined && nested[0] === path[0] && nested[1] === path[1]) return [key, ...path.slice(2)];
    }
  }
  return [...path];
}

export const disaggProfileHandlerParams = z.preprocess(nestFlatKeys, z
  .strictObject({
    profiles: z
      .strictObject({
        decode: z.string().min(1).default('decode'),
        prefill: z.string().min(1).default('prefill'),
      })
      .prefault({}),
    deciders: z.strictObject({ prefill: z.string().min(1).optional() }).prefault({}),
    connector: z.enum(CONNECTORS).default('sidecar'),
    // llm-d's; its default is the only order Sluice runs (the decider needs the decode pick). Spelt
    // as llm-d reads it: case, "-" and "_" aside (`DecodeFirst`, `decode_first`), and `decode` alone.
    stageOrder: z
      .string()
      .transform((order, ctx) => {
        const plain = order.toLowerCase().replace(/[-_]/g, '');
        if (plain === 'decodefirst' || plain === 'decode' || plain === '') return 'decode-first' as const;
        ctx.addIssue({
          code: 'custom',
          message:
            plain === 'prefillfirst' || plain === 'prefill'
              ? 'only "decode-first" is supported: the prefill decider needs the decode endpoint to estimate what is cached (llm-d\'s "prefill-first" is not implemented in Sluice)'
              : `unknown stage order ${JSON.stringify(order)}: llm-d's are "decode-first" (the one Sluice runs) and "prefill-first"`,
        });
        return z.NEVER;
      })
      .optional(),
  })
  .refine((p) => p.profiles.decode !== p.profiles.prefill, {
    message: 'profiles.decode and profiles.prefill must name different profiles',
    path: ['profiles', 'prefill'],
  }));

export type DisaggProfileHandlerParams = z.infer<typeof disaggProfileHandlerParams>;

const NOTHING: SchedulingProfile[] = [];

export class DisaggProfileHandler implements ProfileHandler {
  readonly type = DISAGG_PROFILE_HANDLER_TYPE;
  readonly decodeProfile: string;
  readonly prefillProfile: string;
  readonly connector: ConnectorName;
  private readonly apis: ReadonlySet<ApiKind>;
  private readonly singleSequenceOnly: boolean;
  readonly disaggregatesWith: ConnectorName | undefined;

  constructor(
    readonly name: string,
    params: DisaggProfileHandlerParams,
    /** The prefill decider; undefined = P/D disabled. */
    readonly decider: Decider | undefined,
  ) {
    this.decodeProfile = params.profiles.decode;
    this.prefillProfile = params.profiles.prefill;
    this.connector = params.connector;
    this.apis = DISAGG_APIS[params.connector];
    this.singleSequenceOnly = SINGLE_SEQUENCE_ONLY.has(params.connector);
    this.disaggregatesWith = decider !== undefined ? params.connector : undefined;
  }

  pickProfiles(
    ctx: CycleContext,
    req: SchedulingRequest,
    profiles: ReadonlyMap<string, SchedulingProfile>,
    results: ReadonlyMap<string, ProfileRunResult>,
  ): SchedulingProfile[] {
    const decoded = results.get(this.decodeProfile);
    if (decoded === undefined) {
      const decode = profiles.get(this.decodeProfile);
      if (decode === undefined) {
        throw new Error(`${DISAGG_PROFILE_HANDLER_TYPE} '${this.name}': no scheduling profile named '${this.decodeProfile}'`);
      }
      return [decode];
    }
    if (results.has(this.prefillProfile)) return NOTHING;
    const target = decoded.targets[0];
    if (target === undefined || this.decider === undefined || !this.apis.has(req.api)) return NOTHING;
    if (this.singleSequenceOnly && !singleSequence(req.body)) return NOTHING;
    const prefill = profiles.get(this.prefillProfile);
    if (prefill === undefined) return NOTHING;
    return this.decider.disaggregate(ctx, req, target) ? [prefill] : NOTHING;
  }

  processResults(_req: SchedulingRequest, results: ReadonlyMap<string, ProfileRunResult>): SchedulingResult {
    const result: SchedulingResult = { primaryProfile: this.decodeProfile, profileResults: new Map(results) };
    const decode = results.get(this.decodeProfile)?.targets[0];
    if (decode === undefined) return result;
    const prefillRun = results.get(this.prefillProfile);
    let prefill = prefillRun?.targets[0];
    // Prefilling on the decode endpoint itself would only add a round trip; another endpoint the
    // prefill profile scored as high serves as well (endpoints that can do both, tied: both profiles
    // would otherwise take the same turn of their picker every time). The prefill run then names it
    // first, for the plugins that read it there (session tokens, no-hit LRU).
    if (prefill === decode && prefillRun?.scored !== undefined) {
      const other = nextAsGood(prefillRun.scored, decode);
      if (other !== undefined) {
        const targets = prefillRun.targets.map((e) => (e === decode ? other : e === other ? decode : e)); // swapped: as many as picked
        result.profileResults.set(this.prefillProfile, { ...prefillRun, targets });
      }
      prefill = other;
    }
    result.disaggregation =
      prefill !== undefined && prefill !== decode
        ? { decision: 'prefill-decode', prefill, connector: this.connector }
        : { decision: 'decode-only', connector: this.connector };
    return result;
  }
}

/** The first endpoint after `taken` (in `scored`'s order, wrapping) scored at least as high as it; undefined when none is. */
function nextAsGood(scored: readonly ScoredEndpoint[], taken: Endpoint): Endpoint | undefined {
  const at = scored.findIndex((s) => s.endpoint === taken);
  if (at < 0) return undefined;
  const bar = scored[at]!.score;
  for (let k = 1; k < scored.length; k++) {
    const s = scored[(at + k) % scored.length]!;
    if (s.score >= bar) return s.endpoint;
  }
  return undefined;
}

export const disaggProfileHandlerDefinition: PluginDefinition<DisaggProfileHandlerParams> = {
  type: DISAGG_PROFILE_HANDLER_TYPE,
  kinds: ['profileHandler'],
  params: disaggProfileHandlerParams,
  references: disaggReferences,
  writtenPath: flatKeyPath,
  // A prefill profile with no decider to run it: easily left so when moving from pd-profile-handler, which wires one in.
  configWarnings: (params, { profileNames }) =>
    params.deciders.prefill === undefined && profileNames?.has(params.profiles.prefill) === true
      ? [{ message: `no deciders.prefill: P/D is off, profile ${JSON.stringify(params.profiles.prefill)} never runs and every request is served decode-only; name a decider (prefix-based-pd-decider, always-disagg-pd-decider) to disaggregate, or remove the profile` }]
      : [],
  create: (name, params, deps) => createDisaggHandler(name, params, deps),
};

/** The profiles and decider the handler names; without a decider (decode-only) no prefill profile is needed. */
export function disaggReferences(params: DisaggProfileHandlerParams): PluginReference[] {
  const decode: PluginReference = { path: ['profiles', 'decode'], name: params.profiles.decode, to: 'profile' };
  const decider = params.deciders.prefill;
  if (decider === undefined) return [decode];
  return [
    decode,
    { path: ['profiles', 'prefill'], name: params.profiles.prefill, to: 'profile' },
    { path: ['deciders', 'prefill'], name: decider, to: 'plugin', kinds: ['decider'], usage: 'the prefill decider' },
  ];
}

export function createDisaggHandler(name: string, params: DisaggProfileHandlerParams, deps: PluginDeps): DisaggProfileHandler {
  const ref = params.deciders.prefill;
  let decider: Decider | undefined;
  if (ref !== undefined) {
    const plugin: Plugin | undefined = deps.plugins.get(ref);
    if (plugin === undefined) {
      throw new Error(`${DISAGG_PROFILE_HANDLER_TYPE} '${name}': deciders.prefill: no plugin named '${ref}'`);
    }
    if (!isDecider(plugin)) {
      throw new Error(`${DISAGG_PROFILE_HANDLER_TYPE} '${name}': deciders.prefill: plugin '${ref}' (${plugin.type}) is not a decider`);
    }
    decider = plugin;
  }
  return new DisaggProfileHandler(name, params, decider);
}
