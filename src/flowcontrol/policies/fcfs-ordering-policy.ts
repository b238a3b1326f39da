/** `fcfs-ordering-policy`: first come, first served within a flow (the llm-d default). */
import { z } from 'zod';
import type { PluginDefinition } from '../../plugins/registry.js';
import type { OrderingPolicy, QueuedItemView } from './types.js';

export const FCFS_ORDERING_POLICY = 'fcfs-ordering-policy';

const fcfsParams = z.strictObject({});

export function createFcfsOrderingPolicy(name: string): OrderingPolicy {
  return {
    type: FCFS_ORDERING_POLICY,
    name,
    compare: (a: QueuedItemView, b: QueuedItemView): number => a.enqueuedAt - b.enqueuedAt,
  };
}

export const fcfsOrderingPolicyDefinition: PluginDefinition<z.output<typeof fcfsParams>> = {
  type: FCFS_ORDERING_POLICY,
  kinds: ['orderingPolicy'],
  params: fcfsParams,
  create: (name) => createFcfsOrderingPolicy(name),
};
