/**
 * The parameter all three pickers share: `maxNumOfEndpoints` 1 — integer; ≤ 0 is read as 1 with a
 * warning, as llm-d's pickers fall back to their default on it.
 */
import { z } from 'zod';
import type { PluginConfigWarning } from '../../plugins/registry.js';

const DEFAULT_MAX_NUM_OF_ENDPOINTS = 1;

export const pickerParams = z.strictObject({
  maxNumOfEndpoints: z.number().int().default(DEFAULT_MAX_NUM_OF_ENDPOINTS),
});

export type PickerParams = z.infer<typeof pickerParams>;

/** How many endpoints a picker configured with `params` picks. */
export const pickCount = (params: PickerParams): number =>
  params.maxNumOfEndpoints > 0 ? params.maxNumOfEndpoints : DEFAULT_MAX_NUM_OF_ENDPOINTS;

export const pickerWarnings = (params: PickerParams): PluginConfigWarning[] =>
  params.maxNumOfEndpoints > 0
    ? []
    : [{ parameter: 'maxNumOfEndpoints', message: `maxNumOfEndpoints ${params.maxNumOfEndpoints} is not positive: read as ${DEFAULT_MAX_NUM_OF_ENDPOINTS} (as llm-d does)` }];
