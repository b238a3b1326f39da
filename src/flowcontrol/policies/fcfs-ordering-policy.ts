/**
 * `fcfs-ordering-policy` — ordering policy (the llm-d default). No parameters.
 *
 * Order: `a.enqueuedAt − b.enqueuedAt` (earliest accepted first). Ties break on `receivedAt`, then
 * `byteSize`, so the order is total and heaps pop deterministically.
 */
import { z } from 'zod';
import type { PluginDefinition } from '../../plugins/registry.js';
import type { OrderingPolicy, QueuedItemView } from './types.js';

export const FCFS_ORDERING_POLICY = 'fcfs-ordering-policy';

/** Three-way comparison that is safe for ±Infinity (subtraction would give NaN for Infinity − Infinity). */
export function compareNumbers(a: number, b: number): number {
  return a < b ? -1 : a > b ? 1 : 0;
}

/** FCFS with deterministic tie-breaks; shared by the deadline policies as their final tie-break. */
export function compareFcfs(a: QueuedItemView, b: QueuedItemView): number {
  return (
    compareNumbers(a.enqueuedAt, b.enqueuedAt) ||
    compareNumbers(a.receivedAt, b.receivedAt) ||
    compareNumbers(a.byteSize, b.byteSize)
  );
}

const fcfsParams = z.strictObject({});

export function createFcfsOrderingPolicy(name: string): OrderingPolicy {
  return { type: FCFS_ORDERING_POLICY, name, compare: compareFcfs };
}

export const fcfsOrderingPolicyDefinition: PluginDefinition<z.output<typeof fcfsParams>> = {
  type: FCFS_ORDERING_POLICY,
  kinds: ['orderingPolicy'],
  params: fcfsParams,
  create: (name) => createFcfsOrderingPolicy(name),
};
