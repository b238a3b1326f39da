/**
 * One pooled keep-alive undici connection pool per endpoint origin. Pools of endpoints that left
 * the fleet are closed once their in-flight requests have finished.
 */
import { Pool } from 'undici';
import type { Endpoint } from '../datalayer/endpoint.js';
import type { UpstreamConfig } from '../config/types.js';

export class Upstreams {
  private readonly pools = new Map<string, Pool>();
  /** Origins of the live endpoints, once a reload has named them (before: every origin is live). */
  private live: ReadonlySet<string> | undefined;

  constructor(private opts: UpstreamConfig) {}

  /**
   * A reload. A pool takes its settings when it is made, so when a setting it holds changed, every
   * pool is retired (gracefully: its requests in flight finish on their connections) and the next
   * request makes a new one with the new settings. `retries` is read per request.
   */
  configure(opts: UpstreamConfig): void {
    const old = this.opts;
    this.opts = opts;
    const same =
      opts.connectTimeout === old.connectTimeout &&
      opts.headersTimeout === old.headersTimeout &&
      opts.bodyTimeout === old.bodyTimeout &&
      opts.connections === old.connections;
    if (same) return;
    for (const p of this.pools.values()) p.close().catch(() => undefined);
    this.pools.clear();
  }

  get(ep: Endpoint): Pool {
    let p = this.pools.get(ep.origin);
    if (!p) {
      p = this.newPool(ep.origin);
      // An endpoint removed while a request was deciding (a retry, a P/D leg): one pool for this
      // request alone, closed once its request is done (callers dispatch at once, in this tick).
      if (this.live !== undefined && !this.live.has(ep.origin)) {
        const once = p;
        queueMicrotask(() => void once.close().catch(() => undefined));
        return once;
      }
      this.pools.set(ep.origin, p);
    }
    return p;
  }

  private newPool(origin: string): Pool {
    return new Pool(origin, {
      // No limit by default: requests past a limit would wait inside undici, in arrival order, with
      // no time-out, unseen by the saturation signal (the model server reports them nowhere), so
      // flow control would never hold anything and a server's batch would be capped at the limit.
      connections: this.opts.connections > 0 ? this.opts.connections : null,
      pipelining: 1,
      connect: { timeout: this.opts.connectTimeout },
      headersTimeout: this.opts.headersTimeout,
      bodyTimeout: this.opts.bodyTimeout,
      // Below the idle time-out of vLLM's server (uvicorn, 5 s) and Node's (5 s): a socket the server
      // is closing is not picked for a request (a reset there fails the request over to another endpoint).
      // Also the most a server's own `Keep-Alive: timeout=N` hint may keep one (undici would take up
      // to 10 minutes): idle sockets count against the gateway's open-file limit.
      keepAliveTimeout: 4_000,
      keepAliveMaxTimeout: 4_000,
    });
  }

  /** Closes pools whose origin is no longer among the live endpoints (gracefully: queued requests finish). */
  retain(live: readonly Endpoint[]): void {
    const keep = new Set(live.map((e) => e.origin));
    this.live = keep;
    for (const [origin, p] of this.pools) {
      if (!keep.has(origin)) {
        this.pools.delete(origin);
        p.close().catch(() => undefined);
      }
    }
  }

  async close(): Promise<void> {
    const all = [...this.pools.values()];
    this.pools.clear();
    await Promise.all(all.map((p) => p.close().catch(() => undefined)));
  }

  async destroy(): Promise<void> {
    const all = [...this.pools.values()];
    this.pools.clear();
    await Promise.all(all.map((p) => p.destroy().catch(() => undefined)));
  }
}
