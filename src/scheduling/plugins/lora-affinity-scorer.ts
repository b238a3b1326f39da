/**
 * `lora-affinity-scorer` — scorer (no parameters).
 *
 * Reads `vllm:lora_requests_info` (endpoint.metrics.lora: running and waiting adapter lists and
 * `max_lora`) and scores how cheaply the endpoint can serve the request's model (body `model`,
 * which names the adapter for LoRA traffic). Checked in this order:
 *   1.0  the model is among the running adapters (already loaded);
 *   0.8  a free adapter slot: |running ∪ waiting| < max_lora;
 *   0.6  the model is among the waiting adapters;
 *   0.0  otherwise, and for an endpoint with no metrics or no LoRA information.
 * Adapters listed as both running and waiting count once. llm-d sums the two lists, so an adapter
 * with requests running and waiting takes two of its slots there, and a server with a slot free
 * can score 0: Sluice counts what occupies slots.
 */
import { z } from 'zod';
import type { Endpoint } from '../../datalayer/endpoint.js';
import type { PluginDefinition } from '../../plugins/registry.js';
import type { CycleContext, Scorer, SchedulingRequest } from '../framework.js';

export const LORA_AFFINITY_SCORER_TYPE = 'lora-affinity-scorer';

export const LORA_ACTIVE_SCORE = 1;
export const LORA_FREE_SLOT_SCORE = 0.8;
export const LORA_WAITING_SCORE = 0.6;

export class LoraAffinityScorer implements Scorer {
  readonly type = LORA_AFFINITY_SCORER_TYPE;
  constructor(readonly name: string) {}

  score(_ctx: CycleContext, req: SchedulingRequest, endpoints: readonly Endpoint[], out: Float64Array): void {
    const model = req.model;
    for (let i = 0; i < endpoints.length; i++) {
      const lora = endpoints[i]!.metrics?.lora;
      if (lora === undefined) {
        out[i] = 0;
        continue;
      }
      const { running, waiting } = lora;
      if (running.includes(model)) {
        out[i] = LORA_ACTIVE_SCORE;
        continue;
      }
      // The lists are a handful of names: counting the union by scanning beats building a Set.
      let loaded = running.length;
      for (const adapter of waiting) if (!running.includes(adapter)) loaded++;
      if (loaded < lora.maxLora) out[i] = LORA_FREE_SLOT_SCORE;
      else if (waiting.includes(model)) out[i] = LORA_WAITING_SCORE;
      else out[i] = 0;
    }
  }
}

export const loraAffinityScorerDefinition: PluginDefinition<Record<string, never>> = {
  type: LORA_AFFINITY_SCORER_TYPE,
  kinds: ['scorer'],
  params: z.strictObject({}),
  create: (name) => new LoraAffinityScorer(name),
};
