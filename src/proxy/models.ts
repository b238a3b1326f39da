/**
 * `GET /v1/models`: the union of the models the pool's servers list, cached a few seconds.
 *
 * The client's `authorization` goes to the servers (a vLLM started with `--api-key` lists nothing
 * without it), so the cache is kept per authorization value. When servers answered but none with
 * a list, the client gets the first server's answer (a 401, say), and when none answered, a 502:
 * never an empty list that would read as "no models".
 */
import type { Endpoint } from '../datalayer/endpoint.js';
import type { Clock } from '../util/clock.js';
import type { Upstreams } from './upstreams.js';
import { errorBody } from './errors.js';

interface ModelEntry {
  id: string;
  [k: string]: unknown;
}

export interface ModelsAnswer {
  status: number;
  /** JSON text, or a model server's refusal as it sent it. */
  body: string;
  /** A relayed refusal's own content type (JSON when absent). */
  contentType?: string;
}

/** Distinct authorization values cached at once (they come from clients): past it the cache starts over. */
const MAX_CACHED_KEYS = 64;

export class ModelsCache {
  private readonly cached = new Map<string, { at: number; answer: ModelsAnswer }>();
  private readonly inflight = new Map<string, Promise<ModelsAnswer>>();

  constructor(
    private readonly endpoints: () => readonly Endpoint[],
    private readonly upstreams: Upstreams,
    private readonly clock: Clock,
    private readonly ttlMs = 5000,
  ) {}

  invalidate(): void {
    this.cached.clear();
  }

  list(authorization: string | undefined, requestId: string): Promise<ModelsAnswer> {
    const key = authorization ?? '';
    const hit = this.cached.get(key);
    if (hit !== undefined && this.clock.now() - hit.at < this.ttlMs) return Promise.resolve(hit.answer);
    let pending = this.inflight.get(key);
    if (pending === undefined) {
      pending = this.fetchAll(authorization, requestId).finally(() => this.inflight.delete(key));
      this.inflight.set(key, pending);
    }
    return pending;
  }

  private async fetchAll(authorization: string | undefined, requestId: string): Promise<ModelsAnswer> {
    const headers: Record<string, string> = { 'x-request-id': requestId };
    if (authorization !== undefined) headers.authorization = authorization;
    const endpoints = this.endpoints();
    // Each server's answer in its slot, merged in configuration order, not in order of arrival: the
    // list, and which server's entry stands for a model several serve, are the same on every call.
    const answers = await Promise.all(
      endpoints.map(async (ep): Promise<ModelEntry[] | ModelsAnswer | undefined> => {
        try {
          const r = await this.upstreams.get(ep).request({ method: 'GET', path: '/v1/models', headers, signal: AbortSignal.timeout(2000) });
          const text = await r.body.text();
          if (r.statusCode !== 200) {
            const type = r.headers['content-type'];
            return { status: r.statusCode, body: text, contentType: typeof type === 'string' ? type : undefined };
          }
          const data = (JSON.parse(text) as { data?: unknown }).data;
          return Array.isArray(data) ? (data as ModelEntry[]) : undefined;
        } catch {
          return undefined; // unreachable, timed out or not JSON: this endpoint contributes nothing
        }
      }),
    );
    const byId = new Map<string, ModelEntry>();
    let listed = 0;
    let refusal: ModelsAnswer | undefined;
    for (const answer of answers) {
      if (answer === undefined) continue;
      if (!Array.isArray(answer)) {
        refusal ??= answer;
        continue;
      }
      listed++;
      for (const m of answer) if (typeof m?.id === 'string' && !byId.has(m.id)) byId.set(m.id, m);
    }
    if (listed === 0 && endpoints.length > 0) {
      return refusal ?? { status: 502, body: errorBody(502, 'no model server of the pool listed its models') };
    }
    const answer = { status: 200, body: JSON.stringify({ object: 'list', data: [...byId.values()] }) };
    if (this.cached.size >= MAX_CACHED_KEYS) this.cached.clear();
    this.cached.set(authorization ?? '', { at: this.clock.now(), answer });
    return answer;
  }
}
