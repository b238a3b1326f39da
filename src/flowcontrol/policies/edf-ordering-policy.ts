/**
 * `edf-ordering-policy` — ordering policy, earliest deadline first. No parameters.
 *
 * Order: `ttlDeadline` ascending (= enqueuedAt + effective TTL; Infinity when the request has no
 * TTL, so those sort last), tie → FCFS (`compareFcfs`: enqueuedAt, receivedAt, byteSize).
 */
import { z } from 'zod';
import type { PluginDefinition } from '../../plugins/registry.js';
import { compareFcfs, compareNumbers } from './fcfs-ordering-policy.js';
import type { OrderingPolicy, QueuedItemView } from './types.js';

export const EDF_ORDERING_POLICY = 'edf-ordering-policy';

/** NaN would make the comparison non-transitive; read it as "no deadline". */
const deadline = (d: number): number => (Number.isNaN(d) ? Infinity : d);

export function compareEdf(a: QueuedItemView, b: QueuedItemView): number {
  return compareNumbers(deadline(a.ttlDeadline), deadline(b.ttlDeadline)) || compareFcfs(a, b);
}

const edfParams = z.strictObject({});

export function createEdfOrderingPolicy(name: string): OrderingPolicy {
  return { type: EDF_ORDERING_POLICY, name, compare: compareEdf };
}

export const edfOrderingPolicyDefinition: PluginDefinition<z.output<typeof edfParams>> = {
  type: EDF_ORDERING_POLICY,
  kinds: ['orderingPolicy'],
  params: edfParams,
  create: (name) => createEdfOrderingPolicy(name),
};
