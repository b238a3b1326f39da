/**
 * Header rules (SPEC §2, §4): hop-by-hop headers never cross the gateway; routing-control headers
 * are consumed by Sluice and stripped; a client's `x-prefiller-host-port` is always removed
 * (anti-spoofing: only Sluice may tell a decode sidecar where to prefill).
 */
import type { IncomingHttpHeaders } from 'node:http';
import { SLO_TTFT_HEADER, SLO_TTFT_HEADER_DEPRECATED } from '../flowcontrol/policies/slo-deadline-ordering-policy.js';
import { REQUEST_TTL_HEADER } from '../flowcontrol/request-ttl.js';

const HOP_BY_HOP = new Set([
  'connection',
  'keep-alive',
  'proxy-authenticate',
  'proxy-authorization',
  'proxy-connection',
  'te',
  'trailer',
  'transfer-encoding',
  'upgrade',
]);

export const OBJECTIVE_HEADERS = ['x-llm-d-inference-objective', 'x-gateway-inference-objective'] as const;
export const FAIRNESS_HEADERS = ['x-llm-d-inference-fairness-id', 'x-gateway-inference-fairness-id'] as const;
/** The TTFT SLO in milliseconds, for `slo-deadline-ordering-policy`; then the GIE's older name. */
export const SLO_TTFT_HEADERS = [SLO_TTFT_HEADER, SLO_TTFT_HEADER_DEPRECATED] as const;
/** A client's own, shorter queue TTL (llm-d has no older name for it). */
export const REQUEST_TTL_HEADERS = [REQUEST_TTL_HEADER] as const;
export const PREFILLER_HEADER = 'x-prefiller-host-port';

/**
 * llm-d's control headers that Sluice does not read, stripped as llm-d strips them: a client's
 * claim of a routing decision or of a refusal is not the model server's business.
 */
const LLMD_CONTROL = [
  'x-llm-d-slo-tpot-ms',
  'x-slo-tpot-ms',
  'x-llm-d-model-name-rewrite',
  'x-gateway-model-name-rewrite',
  'x-gateway-destination-endpoint',
  'x-gateway-destination-endpoint-subset',
  'x-llm-d-request-dropped-reason',
  // What llm-d's routing sidecar reads as a <host:port> to prefill on, encode on, pull KV blocks
  // from or send to (llm-d's EPP drops a client's): on a request Sluice serves decode-only (it sets
  // no prefill header then) a client's value would send the prompt, or fetch the cache, where the
  // client says. The canonical names and the older ones.
  'x-llm-d-prefiller-host-port',
  'x-prefiller-url',
  'x-llm-d-encoder-hosts-ports',
  'x-encoder-hosts-ports',
  'x-llm-d-kv-cache-source-host-port',
  'x-kv-cache-source-host-port',
  'x-data-parallel-host-port',
];

/**
 * Response headers not relayed: hop-by-hop, and what only Sluice may say to the client — why it
 * refused a request (a model server's 200 carried a `rejected-saturated` Sluice never decided) and
 * where a prefill ran (an internal address).
 */
const NOT_RELAYED = new Set<string>([...HOP_BY_HOP, 'x-llm-d-request-dropped-reason', PREFILLER_HEADER]);

/** Headers consumed by Sluice, or llm-d's control headers, that must not reach the model server. */
const ROUTING = new Set<string>([...OBJECTIVE_HEADERS, ...FAIRNESS_HEADERS, ...SLO_TTFT_HEADERS, ...REQUEST_TTL_HEADERS, PREFILLER_HEADER, ...LLMD_CONTROL]);

/**
 * Request headers sent upstream: minus hop-by-hop (incl. those named in `Connection`), host, length,
 * routing, and `expect` (Node has answered the client's `100-continue`; undici refuses to send it);
 * `accept-encoding: identity` in place of the client's: Sluice reads every answer (SSE events,
 * usage, kv_transfer_params, a rewritten cached-token count), and a client's gzip would hold an SSE
 * stream back until a compressed chunk happened to hold "\n\n".
 */
export function upstreamRequestHeaders(incoming: IncomingHttpHeaders, requestId: string): Record<string, string | string[]> {
  const out: Record<string, string | string[]> = {};
  // `Connection` may name more hop-by-hop headers; the common bare values need no parsing.
  const extraHop = namedByConnection(incoming.connection);
  for (const name in incoming) {
    if (HOP_BY_HOP.has(name) || ROUTING.has(name) || name === 'host' || name === 'content-length' || name === 'expect') continue;
    if (extraHop?.has(name)) continue;
    const v = incoming[name];
    if (v !== undefined) out[name] = v;
  }
  out['accept-encoding'] = 'identity';
  out['x-request-id'] = requestId;
  return out;
}

/** The headers a `Connection` value names (hop-by-hop too); undefined for the common bare values. */
function namedByConnection(conn: string | undefined): Set<string> | undefined {
  return conn && conn !== 'keep-alive' && conn !== 'close' ? new Set(conn.toLowerCase().split(',').map((s) => s.trim())) : undefined;
}

/** Response headers relayed to the client: minus hop-by-hop (incl. those named in `Connection`) and NOT_RELAYED. */
export function clientResponseHeaders(upstream: Record<string, string | string[] | undefined>): Record<string, string | string[]> {
  const out: Record<string, string | string[]> = {};
  const conn = upstream.connection;
  const extraHop = namedByConnection(typeof conn === 'string' ? conn : conn?.join(','));
  for (const name in upstream) {
    if (NOT_RELAYED.has(name) || extraHop?.has(name)) continue;
    const v = upstream[name];
    if (v !== undefined) out[name] = v;
  }
  return out;
}

/**
 * The same from undici's raw list (name, value, name, value, …):
 * names lower-cased, repeated names gathered into an array, hop-by-hop and NOT_RELAYED headers left out.
 */
export function rawClientResponseHeaders(raw: readonly Buffer[]): Record<string, string | string[]> {
  const out: Record<string, string | string[]> = {};
  let extraHop: Set<string> | undefined;
  for (let i = 0; i + 1 < raw.length; i += 2) {
    const name = raw[i]!.toString('latin1').toLowerCase();
    if (NOT_RELAYED.has(name) || name === '__proto__') {
      // Rare: a `Connection` naming more hop-by-hop headers (taken out below, wherever they stand).
      if (name === 'connection') for (const named of namedByConnection(raw[i + 1]!.toString('latin1')) ?? []) (extraHop ??= new Set()).add(named);
      continue;
    }
    const value = raw[i + 1]!.toString('latin1');
    // Not `=== undefined`: a name like `constructor` finds Object.prototype's.
    const seen = out[name];
    if (typeof seen === 'string') out[name] = [seen, value];
    else if (Array.isArray(seen)) seen.push(value);
    else out[name] = value;
  }
  if (extraHop !== undefined) for (const name of extraHop) delete out[name];
  return out;
}

/**
 * A header value as text: Node hands header bytes over one character per byte (latin1), so a UTF-8
 * fairness id `équipe-α` would read `Ã©quipe-Î±`, unlike llm-d (Go keeps the bytes), and match no
 * objective named in UTF-8. Only for values Sluice reads, never for one it sends back in a header.
 */
export function textHeader(headers: IncomingHttpHeaders, names: readonly string[]): string | undefined {
  const v = firstHeader(headers, names);
  if (v === undefined) return undefined;
  for (let i = 0; i < v.length; i++) if (v.charCodeAt(i) > 0x7f) return Buffer.from(v, 'latin1').toString('utf8');
  return v;
}

/** First value of a header (aliases in order of preference). */
export function firstHeader(headers: IncomingHttpHeaders, names: readonly string[]): string | undefined {
  for (const n of names) {
    const v = headers[n];
    if (typeof v === 'string' && v.length > 0) return v;
    if (Array.isArray(v) && v.length > 0) return v[0];
  }
  return undefined;
}
