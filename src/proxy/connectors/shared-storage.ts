/**
 * `shared-storage` connector: the KV cache goes through a store both endpoints share (LMCache and
 * the like), so nothing is exchanged in the bodies (SPEC §7.4, llm-d's shared-storage protocol).
 *
 * 1. Prefill leg → prefill endpoint, same path and headers; body = the client's body with
 *    `max_tokens` = `max_completion_tokens` = 1 (and no `min_tokens` / `min_completion_tokens`);
 *    `stream` is left as the client set it. The answer is read and dropped.
 * 2. 2xx → the client's body, unchanged, to the decode endpoint; 4xx but 404 → that answer goes to
 *    the client; anything else (404, 5xx, connection error, time-out) → decode-only (Sluice's choice: the
 *    decoder can still compute the prompt itself; the llm-d sidecar returns the error instead).
 */
import { decodeOnly, isClientError, jsonBuffer, oneTokenBody, type Connector, type PdInput, type PdStep, type SendPrefill } from './types.js';

/** Body of the prefill leg. */
export function sharedStoragePrefillBody(body: Readonly<Record<string, unknown>>): Buffer {
  return jsonBuffer(oneTokenBody(body));
}

export const sharedStorageConnector: Connector = {
  name: 'shared-storage',
  runsPrefill: true,
  async carryOut(input: PdInput, sendPrefill: SendPrefill): Promise<PdStep> {
    const leg = await sendPrefill(sharedStoragePrefillBody(input.body));
    if (leg.kind === 'aborted') return leg;
    if (leg.kind === 'failed') return decodeOnly(input.raw, `prefill ${input.prefill.name} failed: ${leg.error}`);
    if (isClientError(leg.status)) return { kind: 'reply', status: leg.status, headers: leg.headers, body: leg.body };
    if (leg.status < 200 || leg.status > 299) {
      return decodeOnly(input.raw, `prefill ${input.prefill.name} answered HTTP ${leg.status}`);
    }
    return { kind: 'decode', leg: { body: input.raw } };
  },
};
