/** `GET /v1/models`: the union of the models the pool's servers list, cached a few seconds. */
import type { Endpoint } from '../datalayer/endpoint.js';
import type { Clock } from '../util/clock.js';
import type { Upstreams } from './upstreams.js';

interface ModelEntry {
  id: string;
  [k: string]: unknown;
}

export class ModelsCache {
  private cached: { at: number; body: string } | undefined;
  private inflight: Promise<string> | undefined;

  constructor(
    private readonly endpoints: () => readonly Endpoint[],
    private readonly upstreams: Upstreams,
    private readonly clock: Clock,
    private readonly ttlMs = 5000,
  ) {}

  invalidate(): void {
    this.cached = undefined;
  }

  list(): Promise<string> {
    const now = this.clock.now();
    if (this.cached && now - this.cached.at < this.ttlMs) return Promise.resolve(this.cached.body);
    this.inflight ??= this.fetchAll().finally(() => (this.inflight = undefined));
    return this.inflight;
  }

  private async fetchAll(): Promise<string> {
    const byId = new Map<string, ModelEntry>();
    await Promise.all(
      this.endpoints().map(async (ep) => {
        try {
          const r = await this.upstreams.get(ep).request({ method: 'GET', path: '/v1/models', signal: AbortSignal.timeout(2000) });
          const j = (await r.body.json()) as { data?: unknown };
          if (r.statusCode !== 200 || !Array.isArray(j.data)) return;
          for (const m of j.data as ModelEntry[]) if (typeof m?.id === 'string' && !byId.has(m.id)) byId.set(m.id, m);
        } catch {
          // an endpoint that cannot list its models simply contributes none
        }
      }),
    );
    const body = JSON.stringify({ object: 'list', data: [...byId.values()] });
    this.cached = { at: this.clock.now(), body };
    return body;
  }
}
