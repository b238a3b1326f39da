/**
 * `nixlv2` connector: the gateway runs the NIXL v2 protocol of the llm-d routing sidecar itself,
 * so no sidecar is needed (SPEC §7.4).
 *
 * 1. Prefill leg → prefill endpoint, same path and headers; body = the client's body with
 *    `kv_transfer_params: {do_remote_decode: true, do_remote_prefill: false, remote_engine_id: null,
 *    remote_block_ids: null, remote_host: null, remote_port: null}`, `stream: false`, no
 *    `stream_options`, `max_tokens` = `max_completion_tokens` = 1 (and no `min_tokens` /
 *    `min_completion_tokens`, which vLLM would refuse above that limit).
 * 2. Prefill answer: 2xx → read its `kv_transfer_params` (absent → null: the decoder then computes
 *    the prompt itself) and `usage.prompt_tokens_details.cached_tokens` (absent → 0); 4xx but 404 →
 *    that answer goes to the client; anything else (404, 5xx, connection error, time-out, unreadable 2xx) →
 *    decode-only with the client's body unchanged.
 * 3. Decode leg → decode endpoint: the client's body byte for byte plus the `kv_transfer_params`
 *    the prefill answer returned, as its text (appended; the client's body is re-serialised only
 *    when it sent its own `kv_transfer_params`): parsed and written again, an id past 2^53 would
 *    change. The answer streams to the client with `usage.prompt_tokens_details.cached_tokens`
 *    replaced by the prefill leg's value: the decoder counts every transferred prompt token as
 *    cached (not when the prefill returned no `kv_transfer_params`: the decoder computed the prompt).
 *
 * A request for several sequences (`n` > 1) or several prompts (a `/v1/completions` batch) runs
 * decode-only: one `kv_transfer_params` names the KV of one prompt for one sequence. The profile
 * handler decides so already (SINGLE_SEQUENCE_ONLY); this guard keeps the connector safe on its own.
 */
import { singleSequence } from '../../scheduling/framework.js';
import { topLevelMemberText } from '../json-member.js';
import { decodeOnly, isClientError, jsonBuffer, jsonObjectOf, oneTokenBody, type Connector, type PdInput, type PdStep, type SendPrefill } from './types.js';

/** The kv_transfer_params of a prefill leg (vLLM NixlConnector). */
export const PREFILL_KV_TRANSFER_PARAMS = Object.freeze({
  do_remote_decode: true,
  do_remote_prefill: false,
  remote_engine_id: null,
  remote_block_ids: null,
  remote_host: null,
  remote_port: null,
});

/** Body of the prefill leg. */
export function nixlPrefillBody(body: Readonly<Record<string, unknown>>): Buffer {
  const out = oneTokenBody(body);
  out.kv_transfer_params = { ...PREFILL_KV_TRANSFER_PARAMS };
  out.stream = false;
  delete out.stream_options;
  return jsonBuffer(out);
}

/** What the decode leg needs from a 2xx prefill answer; undefined when it is not a JSON object. */
export interface PrefillOutput {
  /** Exactly what the prefiller returned, as its JSON text; `null` when absent. */
  kvTransferParams: string;
  /** The prefill leg's `usage.prompt_tokens_details.cached_tokens` (0 when absent). */
  cachedTokens: number;
  /** The answer had no `kv_transfer_params` (worth a warning: the decoder will recompute). */
  missingParams: boolean;
}

/** `obj`: the body parsed, when the proxy did already (PrefillLegResult.json). */
export function readPrefillAnswer(body: Buffer, obj = jsonObjectOf(body)): PrefillOutput | undefined {
  if (obj === undefined) return undefined;
  const text = body.toString('utf8');
  // `null` too: vLLM answers that when the prefill server has no KV connector (a misconfiguration).
  const has = obj.kv_transfer_params !== undefined && obj.kv_transfer_params !== null;
  const usage = obj.usage as { prompt_tokens_details?: { cached_tokens?: unknown } | null } | null | undefined;
  const cached = usage?.prompt_tokens_details?.cached_tokens;
  return {
    kvTransferParams: has ? (topLevelMemberText(text, 'kv_transfer_params') ?? JSON.stringify(obj.kv_transfer_params)) : 'null',
    cachedTokens: typeof cached === 'number' && Number.isFinite(cached) ? cached : 0,
    missingParams: !has,
  };
}

/**
 * A decode-body builder prepared before the prefill answer arrives, so that between the prefill
 * answer and the decode request the gateway only joins buffers. Takes `kv_transfer_params` as text.
 */
export function nixlDecodeBodyBuilder(raw: Buffer, body: Readonly<Record<string, unknown>>): (kvTransferParams: string) => Buffer {
  let source = raw;
  let end = lastNonSpace(raw);
  if (Object.prototype.hasOwnProperty.call(body, 'kv_transfer_params') || end < 0 || raw[end] !== 0x7d /* } */) {
    // The client's own kv_transfer_params is replaced: the rest of its body is written again.
    const rest: Record<string, unknown> = { ...body };
    delete rest.kv_transfer_params;
    source = jsonBuffer(rest);
    end = source.length - 1;
  }
  const members = Object.keys(body).some((key) => key !== 'kv_transfer_params');
  const head = Buffer.concat([source.subarray(0, end), Buffer.from(members ? ',"kv_transfer_params":' : '"kv_transfer_params":', 'utf8')]);
  const tail = source.subarray(end);
  return (kv) => Buffer.concat([head, Buffer.from(kv, 'utf8'), tail]);
}

/** Body of the decode leg: the client's body plus exactly the prefiller's kv_transfer_params (text). */
export function nixlDecodeBody(raw: Buffer, body: Readonly<Record<string, unknown>>, kvTransferParams: string): Buffer {
  return nixlDecodeBodyBuilder(raw, body)(kvTransferParams);
}

function lastNonSpace(buf: Buffer): number {
  let i = buf.length - 1;
  while (i >= 0 && (buf[i] === 0x20 || buf[i] === 0x0a || buf[i] === 0x0d || buf[i] === 0x09)) i--;
  return i;
}

export const nixlv2Connector: Connector = {
  name: 'nixlv2',
  runsPrefill: true,
  async carryOut(input: PdInput, sendPrefill: SendPrefill): Promise<PdStep> {
    if (!singleSequence(input.body)) return decodeOnly(input.raw);
    const decodeBody = nixlDecodeBodyBuilder(input.raw, input.body);
    const leg = await sendPrefill(nixlPrefillBody(input.body));
    if (leg.kind === 'aborted') return leg;
    if (leg.kind === 'failed') return decodeOnly(input.raw, `prefill ${input.prefill.name} failed: ${leg.error}`);
    if (isClientError(leg.status)) return { kind: 'reply', status: leg.status, headers: leg.headers, body: leg.body };
    if (leg.status < 200 || leg.status > 299) {
      return decodeOnly(input.raw, `prefill ${input.prefill.name} answered HTTP ${leg.status}`);
    }
    const out = readPrefillAnswer(leg.body, leg.json);
    if (out === undefined) return decodeOnly(input.raw, `prefill ${input.prefill.name} answered a body that is not a JSON object`);
    return {
      kind: 'decode',
      // Without kv_transfer_params the decoder computes the prompt: its own cached count is the true one.
      leg: { body: decodeBody(out.kvTransferParams), ...(out.missingParams ? { recomputesPrompt: true } : { cachedTokens: out.cachedTokens }) },
      ...(out.missingParams ? { warning: `prefill ${input.prefill.name} returned no kv_transfer_params; the decoder recomputes the prompt` } : {}),
    };
  },
};
