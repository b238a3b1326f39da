/** What the request path needs from the rest of the gateway; swapped as a whole on reload. */
import type { SluiceConfig } from '../config/types.js';
import type { ResponseHeadersHook } from '../scheduling/framework.js';
import type { Scheduler } from '../scheduling/scheduler.js';
import type { GatewayError } from './errors.js';
import type { GatewayMetrics } from '../metrics/metrics.js';
import type { FlowController } from '../flowcontrol/controller.js';

export interface ProxyRuntime {
  readonly config: SluiceConfig;
  /** objective name → priority */
  readonly objectives: ReadonlyMap<string, number>;
  readonly scheduler: Scheduler;
  readonly responseHooks: readonly ResponseHeadersHook[];
  /** The priority-banded queue; undefined when the `flowControl` feature gate is off. */
  readonly flowControl: FlowController | undefined;
  /** Admission with flow control off (SPEC §6): an error to answer with, or undefined to go on. */
  admitWithoutQueue(priority: number): GatewayError | undefined;
}

/** The request-path metrics (see metrics/metrics.ts); per-model series are resolved once per request. */
export type ProxyMetrics = Pick<
  GatewayMetrics,
  | 'forModel'
  | 'schedulerDuration'
  | 'schedulerAttempt'
  | 'upstreamRetry'
  | 'flowControlOutcome'
  | 'disaggDecision'
  | 'pdDegraded'
  | 'endpointFirstByte'
  | 'endpointUpstreamError'
  | 'bodyIncomplete'
  | 'requestRejected'
  | 'previousResponseRouting'
  | 'previousResponseSearch'
>;
