/**
 * `slo-deadline-ordering-policy` — ordering policy by TTFT SLO deadline. No parameters.
 *
 * Order: `sloDeadline` ascending (= receivedAt + `x-llm-d-slo-ttft-ms`, see `parseSloTtftHeader`;
 * Infinity when the header is missing or invalid, so those sort after every SLO-bound request),
 * tie → earlier `receivedAt`, then enqueuedAt, then byteSize (total order for deterministic heaps).
 */
import { z } from 'zod';
import type { PluginDefinition } from '../../plugins/registry.js';
import { compareFcfs, compareNumbers } from './fcfs-ordering-policy.js';
import type { OrderingPolicy, QueuedItemView } from './types.js';

export const SLO_DEADLINE_ORDERING_POLICY = 'slo-deadline-ordering-policy';

/** The request header carrying the time-to-first-token SLO in milliseconds (current name first). */
export const SLO_TTFT_HEADER = 'x-llm-d-slo-ttft-ms';
/** Deprecated alias (GIE name). */
export const SLO_TTFT_HEADER_DEPRECATED = 'x-slo-ttft-ms';

const INTEGER = /^[+-]?\d+$/;

/**
 * `x-llm-d-slo-ttft-ms` → milliseconds, like Go's `strconv.ParseInt(strings.TrimSpace(v), 10, 64)`
 * with negatives refused. Missing, empty, non-integer, negative or too large to hold exactly
 * (> 2^53 − 1, our stand-in for int64 overflow) → undefined, i.e. no SLO deadline.
 */
export function parseSloTtftHeader(value: string | undefined): number | undefined {
  if (value === undefined) return undefined;
  const text = value.trim();
  if (!INTEGER.test(text)) return undefined;
  const ms = Number(text);
  if (!Number.isSafeInteger(ms) || ms < 0) return undefined;
  return ms + 0; // "-0" parses to -0; normalise
}

const deadline = (d: number): number => (Number.isNaN(d) ? Infinity : d);

export function compareSloDeadline(a: QueuedItemView, b: QueuedItemView): number {
  return (
    compareNumbers(deadline(a.sloDeadline), deadline(b.sloDeadline)) ||
    compareNumbers(a.receivedAt, b.receivedAt) ||
    compareFcfs(a, b)
  );
}

const sloParams = z.strictObject({});

export function createSloDeadlineOrderingPolicy(name: string): OrderingPolicy {
  return { type: SLO_DEADLINE_ORDERING_POLICY, name, compare: compareSloDeadline };
}

export const sloDeadlineOrderingPolicyDefinition: PluginDefinition<z.output<typeof sloParams>> = {
  type: SLO_DEADLINE_ORDERING_POLICY,
  kinds: ['orderingPolicy'],
  params: sloParams,
  create: (name) => createSloDeadlineOrderingPolicy(name),
};
