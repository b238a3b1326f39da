/**
 * `session-affinity-scorer` — scorer and response-headers hook.
 *
 * Keeps a client's session on one endpoint (llm-d semantics, `encoded_endpoint_header` algorithm):
 * every response carries `<headerName>: base64(<endpoint name>)` naming the endpoint that served it;
 * a request that echoes the token scores 1.0 on that endpoint and 0 on every other, so (with enough
 * weight) it returns there. A request without a token, or whose token names no candidate — e.g. the
 * endpoint left the pool or was filtered out — scores 0 everywhere, is scheduled on the other
 * signals, and its response carries the token of the endpoint that did serve it. Invalid base64 is
 * treated as naming no endpoint. With a repeated header the first value counts.
 *
 * Parameters (defaults):
 * - `headerName` "x-session-token" — the request and response header carrying the token
 * - `profileName` — unset: the token names the endpoint that served the request (with P/D, the
 *   decode endpoint); set (e.g. "prefill", with its own `headerName`): the target of that profile,
 *   and no header when that profile did not run for the request (llm-d's P/D pattern: one instance
 *   per profile)
 * - `algorithm` "encoded_endpoint_header" — the only one; llm-d's `session_id_header` (a table of
 *   sessions kept in the gateway) is refused, saying so. `strategy` is the same key under its newer
 *   llm-d name (whose table is `session_id`, refused too)
 * - `evictionTtlSeconds`, `evictionSweepSeconds`, `missThreshold`, `sessionIdConfig` — the session
 *   table's; accepted and ignored, with a warning
 */
import { z } from 'zod';
import type { Endpoint } from '../../datalayer/endpoint.js';
import type { PluginConfigWarning, PluginDefinition } from '../../plugins/registry.js';
import type { CycleContext, ResponseHeadersHook, SchedulingResult, Scorer, SchedulingRequest } from '../framework.js';

export const SESSION_AFFINITY_SCORER_TYPE = 'session-affinity-scorer';
export const SESSION_TOKEN_HEADER = 'x-session-token';

/** An HTTP header name (RFC 9110 token). */
const HEADER_NAME = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;
const SESSION_ID_ONLY = ['evictionTtlSeconds', 'evictionSweepSeconds', 'missThreshold', 'sessionIdConfig'] as const;

const ENCODED_ENDPOINT_HEADER = 'encoded_endpoint_header';
const onlyEncodedEndpointHeader = z.literal(ENCODED_ENDPOINT_HEADER, {
  error: (issue) =>
    `only "${ENCODED_ENDPOINT_HEADER}" is supported (llm-d's ${JSON.stringify(issue.input)}${String(issue.input).startsWith('session_id') ? ', a session table kept in the gateway,' : ''} is not implemented in Sluice)`,
});

export const sessionAffinityScorerParams = z
  .strictObject({
    headerName: z
      .string()
      .regex(HEADER_NAME, { error: 'must be an HTTP header name' })
      .transform((h) => h.toLowerCase())
      .default(SESSION_TOKEN_HEADER),
    profileName: z.string().min(1).optional(),
    algorithm: onlyEncodedEndpointHeader.optional(),
    /** llm-d's newer name of `algorithm`. */
    strategy: onlyEncodedEndpointHeader.optional(),
    evictionTtlSeconds: z.number().nonnegative().optional(),
    evictionSweepSeconds: z.number().nonnegative().optional(),
    missThreshold: z.number().int().nonnegative().optional(),
    sessionIdConfig: z.unknown().optional(),
  })
  .transform(({ strategy: _, ...p }) => ({ ...p, algorithm: ENCODED_ENDPOINT_HEADER }) as const);

export type SessionAffinityScorerParams = z.infer<typeof sessionAffinityScorerParams>;

/** The token a response carries for `endpointName`. */
export function sessionTokenFor(endpointName: string): string {
  return Buffer.from(endpointName, 'utf8').toString('base64');
}

/** The endpoint name a request's token (in `header`) names, or undefined when there is no usable token. */
export function sessionTarget(req: SchedulingRequest, header = SESSION_TOKEN_HEADER): string | undefined {
  const raw = req.headers[header];
  const token = (Array.isArray(raw) ? raw[0] : raw)?.trim();
  if (token === undefined || token === '') return undefined;
  const name = Buffer.from(token, 'base64').toString('utf8');
  return name === '' ? undefined : name;
}

export class SessionAffinityScorer implements Scorer, ResponseHeadersHook {
  readonly type = SESSION_AFFINITY_SCORER_TYPE;
  private readonly header: string;
  private readonly profile: string | undefined;

  constructor(
    readonly name: string,
    params: Partial<SessionAffinityScorerParams> = {},
  ) {
    this.header = params.headerName ?? SESSION_TOKEN_HEADER;
    this.profile = params.profileName;
  }

  score(_ctx: CycleContext, req: SchedulingRequest, endpoints: readonly Endpoint[], out: Float64Array): void {
    const target = sessionTarget(req, this.header);
    for (let i = 0; i < endpoints.length; i++) out[i] = target !== undefined && endpoints[i]!.name === target ? 1 : 0;
  }

  onResponseHeaders(_req: SchedulingRequest, endpoint: Endpoint, setHeader: (name: string, value: string) => void, result?: SchedulingResult): void {
    const named = this.profile === undefined ? endpoint : result?.profileResults.get(this.profile)?.targets[0];
    if (named !== undefined) setHeader(this.header, sessionTokenFor(named.name));
  }
}

const ignoredKeys = (p: SessionAffinityScorerParams): PluginConfigWarning[] =>
  SESSION_ID_ONLY.filter((k) => p[k] !== undefined).map((k) => ({
    parameter: k,
    message: `${k} is ignored: it belongs to llm-d's session table (algorithm session_id_header, strategy session_id), and Sluice runs encoded_endpoint_header`,
  }));

export const sessionAffinityScorerDefinition: PluginDefinition<SessionAffinityScorerParams> = {
  type: SESSION_AFFINITY_SCORER_TYPE,
  kinds: ['scorer'],
  params: sessionAffinityScorerParams,
  configWarnings: ignoredKeys,
  create: (name, params) => new SessionAffinityScorer(name, params),
};
