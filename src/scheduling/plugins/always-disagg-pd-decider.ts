/**
 * `always-disagg-pd-decider` — decider (no parameters).
 *
 * Always disaggregates: every request whose prefill profile finds an endpoint is prefilled there
 * (llm-d ships it for benchmarks and tests).
 */
import { z } from 'zod';
import type { PluginDefinition } from '../../plugins/registry.js';
import type { Decider } from '../framework.js';

export const ALWAYS_DISAGG_PD_DECIDER_TYPE = 'always-disagg-pd-decider';

export class AlwaysDisaggPdDecider implements Decider {
  readonly type = ALWAYS_DISAGG_PD_DECIDER_TYPE;

  constructor(readonly name: string) {}

  disaggregate(): boolean {
    return true;
  }
}

export const alwaysDisaggPdDeciderDefinition: PluginDefinition<Record<string, never>> = {
  type: ALWAYS_DISAGG_PD_DECIDER_TYPE,
  kinds: ['decider'],
  params: z.strictObject({}),
  create: (name) => new AlwaysDisaggPdDecider(name),
};
