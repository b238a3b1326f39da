/**
 * `single-profile-handler` — profile handler (no parameters).
 *
 * Runs the one configured profile once; its result is primary. With more than one profile the
 * first (in configuration order) is run — the config loader rejects that case (llm-d does too).
 */
import { z } from 'zod';
import type { PluginDefinition } from '../../plugins/registry.js';
import type {
  CycleContext,
  ProfileHandler,
  ProfileRunResult,
  SchedulingProfile,
  SchedulingRequest,
  SchedulingResult,
} from '../framework.js';

export const SINGLE_PROFILE_HANDLER_TYPE = 'single-profile-handler';

const NOTHING: SchedulingProfile[] = [];

export class SingleProfileHandler implements ProfileHandler {
  readonly type = SINGLE_PROFILE_HANDLER_TYPE;

  constructor(readonly name: string) {}

  pickProfiles(
    _ctx: CycleContext,
    _req: SchedulingRequest,
    profiles: ReadonlyMap<string, SchedulingProfile>,
    results: ReadonlyMap<string, ProfileRunResult>,
  ): SchedulingProfile[] {
    if (results.size > 0) return NOTHING;
    for (const profile of profiles.values()) return [profile];
    return NOTHING;
  }

  processResults(_req: SchedulingRequest, results: ReadonlyMap<string, ProfileRunResult>): SchedulingResult {
    // Exactly one profile ran; it is the primary.
    let primaryProfile = '';
    for (const name of results.keys()) {
      primaryProfile = name;
      break;
    }
    return { primaryProfile, profileResults: new Map(results) };
  }
}

export const singleProfileHandlerDefinition: PluginDefinition<Record<string, never>> = {
  type: SINGLE_PROFILE_HANDLER_TYPE,
  kinds: ['profileHandler'],
  params: z.strictObject({}),
  create: (name) => new SingleProfileHandler(name),
};
