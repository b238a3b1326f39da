/**
 * `GET /v1/models`: the union of the models the pool's servers list, cached a few seconds.
 *
 * The client's `authorization` goes to the servers (a vLLM started with `--api-key` lists nothing
 * without it), so the cache is kept per authorization value. When servers answered but none with
 * a list, the client gets the first server's answer (a 401, say), and when none answered, a 502:
 * never an empty list that would read as "no models". A refusal of the key (401, 403) is cached as a list is.
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

/** Distinct authorization values cached at once (they come from clients): past it the oldest goes. */
const MAX_CACHED_KEYS = 64;
/**
 * Listings asking the pool at once. Each asks every server, and a client can make each new (an
 * authorization value of its own per request, no valid key needed): without a bound one client
 * request turned into one per server. The rest wait their turn, up to MAX_WAITING_FANOUTS, then 503.
 */
const MAX_FANOUTS = 4;
const MAX_WAITING_FANOUTS = 256;
/**
 * The most of one server's answer read. vLLM's list is a few KB (a few hundred with LoRA adapters);
 * a server sending more (a 140 MB list held the event loop 4 s per listing, and listings cached per
 * authorization value exhausted the heap) contributes nothing.
 */
const MAX_LISTING_BYTES = 1 << 20;

/** The body as text, or undefined past `max` bytes (then no more is read). */
async function textUpTo(body: AsyncIterable<Buffer> & { destroy(): unknown }, max: number): Promise<string | undefined> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of body) {
    size += chunk.length;
    if (size > max) {
      body.destroy();
      return undefined;
    }
    chunks.push(chunk);
  }
  return Buffer.concat(chunks, size).toString('utf8');
}

export class ModelsCache {
  private readonly cached = new Map<string, { at: number; answer: ModelsAnswer }>();
  private readonly inflight = new Map<string, Promise<ModelsAnswer>>();
  private fanouts = 0;
  private readonly waiting: (() => void)[] = [];

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
      if (this.fanouts >= MAX_FANOUTS && this.waiting.length >= MAX_WAITING_FANOUTS) {
        return Promise.resolve({ status: 503, body: errorBody(503, 'too many model listings in progress; try again') });
      }
      pending = this.inTurn(() => this.fetchAll(authorization, requestId)).finally(() => this.inflight.delete(key));
      this.inflight.set(key, pending);
    }
    return pending;
  }

  /** Runs `fetch` when fewer than MAX_FANOUTS run, in arrival order. */
  private async inTurn(fetch: () => Promise<ModelsAnswer>): Promise<ModelsAnswer> {
    if (this.fanouts >= MAX_FANOUTS) await new Promise<void>((go) => this.waiting.push(go));
    this.fanouts++;
    try {
      return await fetch();
    } finally {
      this.fanouts--;
      this.waiting.shift()?.();
    }
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
          const text = await textUpTo(r.body, MAX_LISTING_BYTES);
          if (text === undefined) return undefined;
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
      if (refusal === undefined) return { status: 502, body: errorBody(502, 'no model server of the pool listed its models') };
      // A refusal of the client's key (401, 403) is kept as a list is: else each request with it
      // asked every server again. A server's state (5xx, 429, 408) is not.
      if (refusal.status === 401 || refusal.status === 403) this.remember(authorization ?? '', refusal);
      return refusal;
    }
    const answer = { status: 200, body: JSON.stringify({ object: 'list', data: [...byId.values()] }) };
    this.remember(authorization ?? '', answer);
    return answer;
  }

  /** Keeps an answer; past MAX_CACHED_KEYS the oldest goes (not all: a client's new values would flush everyone's). */
  private remember(key: string, answer: ModelsAnswer): void {
    this.cached.delete(key);
    if (this.cached.size >= MAX_CACHED_KEYS) this.cached.delete(this.cached.keys().next().value!);
    this.cached.set(key, { at: this.clock.now(), answer });
  }
}
