/**
 * `label-selector-filter` — filter. The parameters are a Kubernetes label selector:
 * - `matchLabels` {} — map key → value; each pair requires that exact label value
 * - `matchExpressions` [] — list of `{key, operator, values}` with operator
 *   `In` (label present and value in `values`), `NotIn` (label absent or value not in `values`),
 *   `Exists`, `DoesNotExist`. `In`/`NotIn` need a non-empty `values`; `Exists`/`DoesNotExist` none.
 * All requirements are ANDed; an empty selector keeps every endpoint (as in Kubernetes).
 */
import { z } from 'zod';
import type { Endpoint } from '../../datalayer/endpoint.js';
import type { PluginDefinition } from '../../plugins/registry.js';
import type { CycleContext, Filter, SchedulingRequest } from '../framework.js';

export const LABEL_SELECTOR_FILTER_TYPE = 'label-selector-filter';

const labelRequirement = z
  .strictObject({
    key: z.string().min(1),
    operator: z.enum(['In', 'NotIn', 'Exists', 'DoesNotExist']),
    values: z.array(z.string()).optional(),
  })
  .superRefine((req, ctx) => {
    const count = req.values?.length ?? 0;
    if ((req.operator === 'In' || req.operator === 'NotIn') && count === 0) {
      ctx.addIssue({ code: 'custom', path: ['values'], message: `operator ${req.operator} needs at least one value` });
    }
    if ((req.operator === 'Exists' || req.operator === 'DoesNotExist') && count > 0) {
      ctx.addIssue({ code: 'custom', path: ['values'], message: `operator ${req.operator} takes no values` });
    }
  });

export const labelSelectorFilterParams = z.strictObject({
  matchLabels: z.record(z.string(), z.string()).default({}),
  matchExpressions: z.array(labelRequirement).default([]),
});

export type LabelSelectorFilterParams = z.infer<typeof labelSelectorFilterParams>;

type Operator = 'In' | 'NotIn' | 'Exists' | 'DoesNotExist';

interface CompiledRequirement {
  key: string;
  operator: Operator;
  values: ReadonlySet<string>;
}

export class LabelSelectorFilter implements Filter {
  readonly type = LABEL_SELECTOR_FILTER_TYPE;
  private readonly requirements: CompiledRequirement[] = [];

  constructor(
    readonly name: string,
    params: LabelSelectorFilterParams,
  ) {
    for (const [key, value] of Object.entries(params.matchLabels)) {
      this.requirements.push({ key, operator: 'In', values: new Set([value]) });
    }
    for (const r of params.matchExpressions) {
      this.requirements.push({ key: r.key, operator: r.operator, values: new Set(r.values ?? []) });
    }
  }

  matches(labels: Readonly<Record<string, string>>): boolean {
    for (const r of this.requirements) {
      const value = Object.hasOwn(labels, r.key) ? labels[r.key] : undefined;
      switch (r.operator) {
        case 'In':
          if (value === undefined || !r.values.has(value)) return false;
          break;
        case 'NotIn':
          if (value !== undefined && r.values.has(value)) return false;
          break;
        case 'Exists':
          if (value === undefined) return false;
          break;
        case 'DoesNotExist':
          if (value !== undefined) return false;
          break;
      }
    }
    return true;
  }

  filter(_ctx: CycleContext, _req: SchedulingRequest, endpoints: readonly Endpoint[]): Endpoint[] {
    const kept: Endpoint[] = [];
    for (const endpoint of endpoints) if (this.matches(endpoint.labels)) kept.push(endpoint);
    return kept;
  }
}

export const labelSelectorFilterDefinition: PluginDefinition<LabelSelectorFilterParams> = {
  type: LABEL_SELECTOR_FILTER_TYPE,
  kinds: ['filter'],
  params: labelSelectorFilterParams,
  create: (name, params) => new LabelSelectorFilter(name, params),
  keepsByLabels: (params, labels) => new LabelSelectorFilter('', params).matches(labels),
};
