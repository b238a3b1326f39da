/**
 * Shared logic of the role filters (`decode-filter`, `prefill-filter`, `encode-filter`), after
 * llm-d's ByLabel: keep an endpoint iff (it has no `llm-d.ai/role` label and unlabelled endpoints
 * are allowed) or its role is one of the accepted values. A label with an unknown (or empty) value is always dropped.
 * Roles are compared normalised (`both` → `prefill-decode`, see Endpoint.role).
 */
import { z } from 'zod';
import { ROLE_LABEL, roleOf, type Endpoint } from '../../datalayer/endpoint.js';
import type { PluginDefinition } from '../../plugins/registry.js';
import type { CycleContext, Filter, SchedulingRequest } from '../framework.js';

export class RoleFilter implements Filter {
  private readonly accepted: ReadonlySet<string>;

  constructor(
    readonly type: string,
    readonly name: string,
    acceptedRoles: readonly string[],
    private readonly allowsNoLabel: boolean,
  ) {
    this.accepted = new Set(acceptedRoles);
  }

  filter(_ctx: CycleContext, _req: SchedulingRequest, endpoints: readonly Endpoint[]): Endpoint[] {
    const kept: Endpoint[] = [];
    for (const endpoint of endpoints) {
      const keep =
        endpoint.labels[ROLE_LABEL] === undefined ? this.allowsNoLabel : this.accepted.has(endpoint.role);
      if (keep) kept.push(endpoint);
    }
    return kept;
  }
}

/** A role filter's definition (no parameters): `type` keeps `roles`, and unlabelled endpoints when `allowsNoLabel`. */
export function roleFilterDefinition(type: string, roles: readonly string[], allowsNoLabel: boolean): PluginDefinition<Record<string, never>> {
  return {
    type,
    kinds: ['filter'],
    params: z.strictObject({}),
    create: (name) => new RoleFilter(type, name, roles, allowsNoLabel),
    keepsByLabels: (_params, labels) => (labels[ROLE_LABEL] === undefined ? allowsNoLabel : roles.includes(roleOf(labels))),
  };
}
