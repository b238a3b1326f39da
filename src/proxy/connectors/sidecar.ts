/**
 * `sidecar` connector (default): the llm-d routing sidecar on the decode pod runs the two legs.
 * Sluice forwards the request unchanged to the decode endpoint with
 * `x-prefiller-host-port: <host>:<port>` of the chosen prefill endpoint (IPv6 bracketed). A client's
 * own value of that header never reaches upstream: it is stripped with the routing headers before
 * this one is added (headers.ts).
 */
import type { Endpoint } from '../../datalayer/endpoint.js';
import { PREFILLER_HEADER } from '../headers.js';
import type { Connector, PdInput, PdStep } from './types.js';

/** The header the decode sidecar reads. `Endpoint.hostPort` is already `[v6]:port`. */
export function sidecarHeaders(prefill: Endpoint): Record<string, string> {
  return { [PREFILLER_HEADER]: prefill.hostPort };
}

export const sidecarConnector: Connector = {
  name: 'sidecar',
  runsPrefill: false,
  carryOut(input: PdInput): PdStep {
    return { kind: 'decode', leg: { body: input.raw, headers: sidecarHeaders(input.prefill) } };
  },
};
