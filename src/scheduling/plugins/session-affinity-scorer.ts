/**
 * `session-affinity-scorer` — scorer and response-headers hook (no parameters).
 *
 * Keeps a client's session on one endpoint (llm-d semantics, header form): every response carries
 * `x-session-token: base64(<endpoint name>)` naming the endpoint that served it; a request that
 * echoes the token scores 1.0 on that endpoint and 0 on every other, so (with enough weight) it
 * returns there. A request without a token, or whose token names no candidate — e.g. the endpoint
 * left the pool or was filtered out — scores 0 everywhere, is scheduled on the other signals, and
 * its response carries the token of the endpoint that did serve it. Invalid base64 is treated as
 * naming no endpoint. With a repeated header the first value counts.
 */
import { z } from 'zod';
import type { Endpoint } from '../../datalayer/endpoint.js';
import type { PluginDefinition } from '../../plugins/registry.js';
import type { CycleContext, ResponseHeadersHook, Scorer, SchedulingRequest } from '../framework.js';

export const SESSION_AFFINITY_SCORER_TYPE = 'session-affinity-scorer';
export const SESSION_TOKEN_HEADER = 'x-session-token';

/** The token a response carries for `endpointName`. */
export function sessionTokenFor(endpointName: string): string {
  return Buffer.from(endpointName, 'utf8').toString('base64');
}

/** The endpoint name a request's token names, or undefined when there is no usable token. */
export function sessionTarget(req: SchedulingRequest): string | undefined {
  const raw = req.headers[SESSION_TOKEN_HEADER];
  const token = (Array.isArray(raw) ? raw[0] : raw)?.trim();
  if (token === undefined || token === '') return undefined;
  const name = Buffer.from(token, 'base64').toString('utf8');
  return name === '' ? undefined : name;
}

export class SessionAffinityScorer implements Scorer, ResponseHeadersHook {
  readonly type = SESSION_AFFINITY_SCORER_TYPE;
  constructor(readonly name: string) {}

  score(_ctx: CycleContext, req: SchedulingRequest, endpoints: readonly Endpoint[], out: Float64Array): void {
    const target = sessionTarget(req);
    for (let i = 0; i < endpoints.length; i++) out[i] = target !== undefined && endpoints[i]!.name === target ? 1 : 0;
  }

  onResponseHeaders(_req: SchedulingRequest, endpoint: Endpoint, setHeader: (name: string, value: string) => void): void {
    setHeader(SESSION_TOKEN_HEADER, sessionTokenFor(endpoint.name));
  }
}

export const sessionAffinityScorerDefinition: PluginDefinition<Record<string, never>> = {
  type: SESSION_AFFINITY_SCORER_TYPE,
  kinds: ['scorer'],
  params: z.strictObject({}),
  create: (name) => new SessionAffinityScorer(name),
};
