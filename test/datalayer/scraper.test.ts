import { test, describe, after } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { Pool } from '../../src/datalayer/pool.js';
import { SCRAPE_BACKOFF_AFTER_MS, SCRAPE_BACKOFF_MS, Scraper, scrapeDelay, type ScraperOptions } from '../../src/datalayer/scraper.js';
import type { Endpoint } from '../../src/datalayer/endpoint.js';
import { ManualClock, systemClock } from '../../src/util/clock.js';

const unhandled: unknown[] = [];
const onUnhandled = (reason: unknown): void => {
  unhandled.push(reason);
};
process.on('unhandledRejection', onUnhandled);
after(() => {
  process.off('unhandledRejection', onUnhandled);
  assert.deepEqual(unhandled, [], 'the scraper must never leave an unhandled rejection');
});

const page = (waiting: number, running = 1, kv = 0.5): string =>
  `# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name="m"} ${waiting}\n` +
  `vllm:num_requests_running{model_name="m"} ${running}\nvllm:kv_cache_usage_perc{model_name="m"} ${kv}\n`;

type Handler = (req: IncomingMessage, res: ServerResponse, requestNumber: number) => void;

interface TestServer {
  port: number;
  /** TCP connections accepted (keep-alive reuse keeps this at 1). */
  connections: number;
  requests: number;
  active: number;
  maxActive: number;
  paths: string[];
  close(): Promise<void>;
}

async function startServer(handler: Handler): Promise<TestServer> {
  const state = { connections: 0, requests: 0, active: 0, maxActive: 0, paths: [] as string[] };
  const server = createServer((req, res) => {
    state.requests++;
    state.active++;
    state.maxActive = Math.max(state.maxActive, state.active);
    state.paths.push(req.url ?? '');
    let done = false;
    const finish = (): void => {
      if (!done) {
        done = true;
        state.active--;
      }
    };
    res.on('close', finish);
    handler(req, res, state.requests);
  });
  server.on('connection', () => state.connections++);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    port,
    get connections() {
      return state.connections;
    },
    get requests() {
      return state.requests;
    },
    get active() {
      return state.active;
    },
    get maxActive() {
      return state.maxActive;
    },
    paths: state.paths,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

async function waitFor(what: string, cond: () => boolean, timeoutMs = 3000): Promise<void> {
  const start = Date.now();
  while (!cond()) {
    if (Date.now() - start > timeoutMs) throw new Error(`timed out waiting for ${what}`);
    await sleep(5);
  }
}

function poolFor(...ports: number[]): Pool {
  return new Pool(ports.map((port, k) => ({ name: `ep-${k}`, address: '127.0.0.1', port, labels: {} })));
}

function options(overrides: Partial<ScraperOptions> = {}): ScraperOptions {
  // A generous default time-out: a cold first request on a loaded CI machine can take >100 ms.
  // Tests about time-outs set their own.
  return { path: '/metrics', intervalMs: 20, timeoutMs: 1000, clock: systemClock, ...overrides };
}

describe('Scraper.scrapeOnce', () => {
  test('a good page becomes the endpoint metrics, stamped with the clock', async () => {
    const server = await startServer((_req, res) => res.end(page(3, 4, 0.25)));
    const pool = poolFor(server.port);
    const clock = new ManualClock(5000);
    const scraper = new Scraper(pool, options({ clock }));
    try {
      const ep = pool.endpoints[0]!;
      await scraper.scrapeOnce(ep);
      assert.deepEqual(ep.metrics, { waiting: 3, running: 4, kvUsage: 0.25, model: 'm' }, ep.lastError);
      assert.equal(ep.metricsAt, 5000);
      assert.equal(ep.lastError, undefined);
      assert.deepEqual(server.paths, ['/metrics']);
    } finally {
      await scraper.stop();
      await server.close();
    }
  });

  test('HTTP 500 records an error naming the status and keeps the old values with their old time', async () => {
    const server = await startServer((_req, res, n) => {
      if (n === 1) res.end(page(2));
      else {
        res.statusCode = 500;
        res.end('internal error');
      }
    });
    const pool = poolFor(server.port);
    const clock = new ManualClock(1000);
    const errors: string[] = [];
    const scraper = new Scraper(pool, options({ clock, onError: (ep, err) => errors.push(`${ep.name}: ${err}`) }));
    try {
      const ep = pool.endpoints[0]!;
      await scraper.scrapeOnce(ep);
      clock.advance(500);
      await scraper.scrapeOnce(ep);
      assert.deepEqual(ep.metrics, { waiting: 2, running: 1, kvUsage: 0.5, model: 'm' });
      assert.equal(ep.metricsAt, 1000);
      assert.equal(ep.metricsAge(clock.now()), 500);
      assert.match(ep.lastError ?? '', /500/);
      assert.equal(ep.scrapeErrors, 1);
      assert.equal(errors.length, 1);
      assert.match(errors[0]!, /^ep-0: .*500/);
      assert.equal(ep.unansweredSince, undefined, 'an HTTP error is an answer: the server is not silent');
    } finally {
      await scraper.stop();
      await server.close();
    }
  });

  test('onRecovered: once, on the first good scrape after failed ones; never for a good scrape after a good one', async () => {
    const answers = [200, 500, 500, 200, 200, 503, 200];
    const server = await startServer((_req, res, n) => {
      res.statusCode = answers[n - 1]!;
      res.end(res.statusCode === 200 ? page(1) : 'down');
    });
    const pool = poolFor(server.port);
    const events: string[] = [];
    const scraper = new Scraper(pool, options({ onError: () => events.push('error'), onRecovered: (ep) => events.push(`recovered ${ep.name}`) }));
    try {
      for (let i = 0; i < answers.length; i++) await scraper.scrapeOnce(pool.endpoints[0]!);
      assert.deepEqual(events, ['error', 'error', 'recovered ep-0', 'error', 'recovered ep-0']);
    } finally {
      await scraper.stop();
      await server.close();
    }
  });

  test('any answer but 200 is an error naming its status, a 204 or a redirect too (its body is no metrics page)', async () => {
    const server = await startServer((_req, res, n) => {
      res.statusCode = n === 1 ? 204 : 302;
      res.end();
    });
    const pool = poolFor(server.port);
    const scraper = new Scraper(pool, options());
    try {
      const ep = pool.endpoints[0]!;
      await scraper.scrapeOnce(ep);
      assert.equal(ep.lastError, 'HTTP 204 from /metrics');
      await scraper.scrapeOnce(ep);
      assert.equal(ep.lastError, 'HTTP 302 from /metrics');
      assert.equal(ep.metrics, undefined);
    } finally {
      await scraper.stop();
      await server.close();
    }
  });

  test('a garbage page is an error, not zeros', async () => {
    const server = await startServer((_req, res) => res.end('<html><body>hello</body></html>'));
    const pool = poolFor(server.port);
    const scraper = new Scraper(pool, options());
    try {
      const ep = pool.endpoints[0]!;
      await scraper.scrapeOnce(ep);
      assert.equal(ep.metrics, undefined);
      assert.match(ep.lastError ?? '', /line 1: invalid metric name/);
      assert.equal(ep.scrapeErrors, 1);
    } finally {
      await scraper.stop();
      await server.close();
    }
  });

  test("an error quoting the page is cut to 512 characters (the page is the server's to fill: a 2 MB value made a 2 MB log line)", async () => {
    const server = await startServer((_req, res) => res.end(`vllm:num_requests_waiting{model_name="m"} ${'9'.repeat(2_000_000)}x\n`));
    const pool = poolFor(server.port);
    const errors: string[] = [];
    const scraper = new Scraper(pool, { ...options(), maxBytes: 4 << 20, onError: (_ep, message) => errors.push(message) });
    try {
      const ep = pool.endpoints[0]!;
      await scraper.scrapeOnce(ep);
      assert.equal(ep.metrics, undefined);
      assert.ok(ep.lastError !== undefined && ep.lastError.length < 600, `${ep.lastError?.length} characters`);
      assert.match(ep.lastError, /… \(\d+ characters\)$/);
      assert.deepEqual(errors, [ep.lastError]);
    } finally {
      await scraper.stop();
      await server.close();
    }
  });

  test('a valid page without vLLM metrics is an error naming the missing metric', async () => {
    const server = await startServer((_req, res) => res.end('# TYPE up gauge\nup 1\n'));
    const pool = poolFor(server.port);
    const scraper = new Scraper(pool, options());
    try {
      const ep = pool.endpoints[0]!;
      await scraper.scrapeOnce(ep);
      assert.match(ep.lastError ?? '', /vllm:num_requests_waiting is missing/);
    } finally {
      await scraper.stop();
      await server.close();
    }
  });

  test('the engine-type label selects the metric names', async () => {
    const server = await startServer((_req, res) =>
      res.end('sglang:num_queue_reqs 1.0\nsglang:num_running_reqs 2.0\nsglang:token_usage 0.3\n'),
    );
    const pool = new Pool([{ name: 's', address: '127.0.0.1', port: server.port, labels: { 'llm-d.ai/engine-type': 'sglang' } }]);
    const scraper = new Scraper(pool, options());
    try {
      const ep = pool.endpoints[0]!;
      await scraper.scrapeOnce(ep);
      assert.deepEqual(ep.metrics, { waiting: 1, running: 2, kvUsage: 0.3 });
    } finally {
      await scraper.stop();
      await server.close();
    }
  });

  test('a 10 MB page is rejected, with or without content-length', async () => {
    const big = Buffer.alloc(10 * 1024 * 1024, 'a');
    const server = await startServer((req, res) => {
      if (req.url === '/chunked') {
        // No content-length: the limit must hold while streaming.
        const chunk = Buffer.alloc(1024 * 1024, '#');
        let sent = 0;
        const pump = (): void => {
          while (sent < 10) {
            sent++;
            if (!res.write(chunk)) {
              res.once('drain', pump);
              return;
            }
          }
          res.end();
        };
        pump();
      } else {
        res.setHeader('content-length', big.length);
        res.end(big);
      }
    });
    const pool = poolFor(server.port);
    const sized = new Scraper(pool, options({ timeoutMs: 2000 }));
    const chunked = new Scraper(pool, options({ path: '/chunked', timeoutMs: 2000 }));
    try {
      const ep = pool.endpoints[0]!;
      await sized.scrapeOnce(ep);
      assert.match(ep.lastError ?? '', /10485760 bytes exceeds the 4194304-byte limit/);
      await chunked.scrapeOnce(ep);
      assert.match(ep.lastError ?? '', /exceeds the 4194304-byte limit/);
      assert.equal(ep.scrapeErrors, 2);
      assert.equal(ep.metrics, undefined);
    } finally {
      await sized.stop();
      await chunked.stop();
      await server.close();
    }
  });

  test('maxBytes is configurable', async () => {
    const server = await startServer((_req, res) => res.end(page(1)));
    const pool = poolFor(server.port);
    const scraper = new Scraper(pool, options({ maxBytes: 16 }));
    try {
      const ep = pool.endpoints[0]!;
      await scraper.scrapeOnce(ep);
      assert.match(ep.lastError ?? '', /exceeds the 16-byte limit/);
    } finally {
      await scraper.stop();
      await server.close();
    }
  });

  test('connection refused is a recorded error', async () => {
    const server = await startServer((_req, res) => res.end(page(1)));
    const port = server.port;
    await server.close();
    const pool = poolFor(port);
    const scraper = new Scraper(pool, options());
    try {
      const ep = pool.endpoints[0]!;
      await scraper.scrapeOnce(ep);
      assert.match(ep.lastError ?? '', /ECONNREFUSED/);
      assert.notEqual(ep.unansweredSince, undefined, 'no answer: silent from this scrape on');
    } finally {
      await scraper.stop();
    }
  });

  test('a second scrapeOnce while one is in progress joins it instead of sending another request', async () => {
    const server = await startServer((_req, res) => setTimeout(() => res.end(page(1)), 50));
    const pool = poolFor(server.port);
    const scraper = new Scraper(pool, options({ timeoutMs: 1000 }));
    try {
      const ep = pool.endpoints[0]!;
      const first = scraper.scrapeOnce(ep);
      const second = scraper.scrapeOnce(ep);
      assert.equal(first, second);
      await Promise.all([first, second]);
      assert.equal(server.requests, 1);
      assert.equal(ep.metrics?.waiting, 1);
    } finally {
      await scraper.stop();
      await server.close();
    }
  });
});

describe('Scraper loops', () => {
  test('start scrapes at once and then every interval, reusing the connection', async () => {
    const server = await startServer((_req, res, n) => res.end(page(n)));
    const pool = poolFor(server.port);
    const scraper = new Scraper(pool, options());
    const ep = pool.endpoints[0]!;
    try {
      scraper.start();
      await waitFor('first metrics', () => ep.metrics !== undefined, 1000);
      await waitFor('several scrapes', () => server.requests >= 5, 2000);
      assert.ok((ep.metrics?.waiting ?? 0) >= 4, 'later scrapes replace the metrics');
      assert.equal(ep.scrapeErrors, 0);
      assert.equal(server.connections, 1, 'keep-alive: one connection for all scrapes');
    } finally {
      await scraper.stop();
      await server.close();
    }
  });

  test('a hanging server times out within timeoutMs and the loop carries on', async () => {
    const server = await startServer((_req, res, n) => {
      if (n <= 2) return; // never answer the first two requests
      res.end(page(9));
    });
    const pool = poolFor(server.port);
    const errorTimes: number[] = [];
    const errorMessages: string[] = [];
    const started = Date.now();
    const scraper = new Scraper(
      pool,
      options({
        intervalMs: 20,
        timeoutMs: 150,
        onError: (_ep, err) => {
          errorTimes.push(Date.now() - started);
          errorMessages.push(err);
        },
      }),
    );
    const ep = pool.endpoints[0]!;
    try {
      scraper.start();
      await waitFor('recovery after the time-outs', () => ep.metrics !== undefined, 3000);
      assert.ok(ep.scrapeErrors >= 2);
      assert.equal(errorTimes.length, ep.scrapeErrors);
      assert.ok(errorTimes[0]! >= 140 && errorTimes[0]! < 1000, `first time-out after ${errorTimes[0]} ms`);
      assert.ok(errorTimes[1]! - errorTimes[0]! >= 150, 'the second scrape started only after the first ended');
      assert.deepEqual(errorMessages.slice(0, 2), ['timed out after 150 ms', 'timed out after 150 ms']);
      assert.equal(ep.metrics?.waiting, 9);
      assert.equal(ep.lastError, undefined);
      assert.equal(ep.unansweredSince, undefined, 'answered again');
      assert.equal(server.maxActive, 1, 'timed-out requests were really aborted, never overlapped');
    } finally {
      await scraper.stop();
      await server.close();
    }
  });

  test('the time-out also covers a body that stalls half way', async () => {
    const server = await startServer((_req, res) => {
      res.write('vllm:num_requests_waiting 1\n'); // then nothing more
    });
    const pool = poolFor(server.port);
    const scraper = new Scraper(pool, options({ timeoutMs: 100 }));
    try {
      const ep = pool.endpoints[0]!;
      const t0 = Date.now();
      await scraper.scrapeOnce(ep);
      assert.ok(Date.now() - t0 < 1000);
      assert.match(ep.lastError ?? '', /timed out after 100 ms/);
      assert.equal(ep.unansweredSince, undefined, 'its status line came: the server is there');
    } finally {
      await scraper.stop();
      await server.close();
    }
  });

  test('never two concurrent requests to one endpoint, even when the server is slower than the interval', async () => {
    const server = await startServer((_req, res) => setTimeout(() => res.end(page(1)), 60));
    const pool = poolFor(server.port);
    const scraper = new Scraper(pool, options({ intervalMs: 5, timeoutMs: 1000 }));
    const ep = pool.endpoints[0]!;
    try {
      scraper.start();
      // Outside callers join the loop's scrape rather than adding a request.
      for (let k = 0; k < 10; k++) {
        void scraper.scrapeOnce(ep);
        await sleep(15);
      }
      await waitFor('several scrapes', () => server.requests >= 4, 3000);
      assert.equal(server.maxActive, 1);
      assert.equal(ep.scrapeErrors, 0);
    } finally {
      await scraper.stop();
      await server.close();
    }
  });

  test('scrapes failing for a second are retried once a second; a hiccup is retried at the interval; a good scrape restores it', async () => {
    const starts: number[] = [];
    let failUntil = Infinity;
    const server = await startServer((_req, res) => {
      const now = Date.now();
      starts.push(now);
      if (now < failUntil) res.writeHead(500).end();
      else res.end(page(1));
    });
    const pool = poolFor(server.port);
    const scraper = new Scraper(pool, options({ intervalMs: 20 }));
    const ep = pool.endpoints[0]!;
    try {
      const t0 = Date.now();
      failUntil = t0 + 1300;
      scraper.start();
      await waitFor('two scrapes after the recovery', () => starts.length >= 2 && starts.at(-2)! >= failUntil, 8000);
      const gaps = starts.slice(1).map((t, k) => t - starts[k]!);
      // A hiccup is no outage: the first second of failures is retried at the interval (the detector
      // reads metrics older than 200 ms as saturated).
      assert.ok(starts.filter((t) => t - t0 < 900).length >= 10, `scrapes in the first 0.9 s: ${gaps.join(', ')}`);
      // Then a pause of the back-off (timers never fire early), and the interval again once one succeeds.
      assert.ok(gaps.some((g) => g >= SCRAPE_BACKOFF_MS - 2), `a back-off pause: ${gaps.join(', ')}`);
      assert.ok(gaps.at(-1)! < 500, `back to the interval after a good scrape: ${gaps.join(', ')}`);
      assert.equal(ep.lastError, undefined);
    } finally {
      await scraper.stop();
      await server.close();
    }
  });

  test('scrapeDelay: the interval, until the scrapes have failed for a second; then once a second (or the interval when longer)', () => {
    assert.deepEqual([0, 50, 999, 1000, 60_000].map((ms) => scrapeDelay(50, ms)), [50, 50, 50, 1000, 1000]);
    assert.deepEqual([0, 5000].map((ms) => scrapeDelay(2000, ms)), [2000, 2000]);
    assert.deepEqual([SCRAPE_BACKOFF_AFTER_MS, SCRAPE_BACKOFF_MS], [1000, 1000]);
  });

  test('the next scrape starts intervalMs after the previous one finished, not on a fixed beat', async () => {
    const starts: number[] = [];
    const ends: number[] = [];
    const server = await startServer((_req, res) => {
      starts.push(Date.now());
      setTimeout(() => {
        ends.push(Date.now());
        res.end(page(1));
      }, 60);
    });
    const pool = poolFor(server.port);
    const scraper = new Scraper(pool, options({ intervalMs: 80, timeoutMs: 1000 }));
    try {
      scraper.start();
      await waitFor('four scrapes', () => starts.length >= 4, 3000);
      for (let k = 1; k < 4; k++) {
        const gap = starts[k]! - ends[k - 1]!;
        assert.ok(gap >= 65, `scrape ${k} started ${gap} ms after the previous answer (interval 80 ms)`);
      }
    } finally {
      await scraper.stop();
      await server.close();
    }
  });

  test('follows the pool: a removed endpoint stops being scraped, an added one starts', async () => {
    const first = await startServer((_req, res) => res.end(page(1)));
    const second = await startServer((_req, res) => res.end(page(2)));
    const pool = poolFor(first.port);
    const scraper = new Scraper(pool, options());
    try {
      scraper.start();
      await waitFor('scrapes of the first endpoint', () => first.requests >= 2);
      pool.setEndpoints([{ name: 'second', address: '127.0.0.1', port: second.port, labels: {} }]);
      const countAtRemoval = first.requests;
      await waitFor('the added endpoint to be scraped', () => pool.byName('second')?.metrics?.waiting === 2, 1000);
      await sleep(150);
      assert.equal(first.requests, countAtRemoval, 'no request to the removed endpoint after removal');
      assert.ok(second.requests >= 3);
    } finally {
      await scraper.stop();
      await first.close();
      await second.close();
    }
  });

  test('removing an endpoint aborts its scrape in progress without recording an error', async () => {
    const server = await startServer(() => undefined); // hangs
    const pool = poolFor(server.port);
    const errors: string[] = [];
    const scraper = new Scraper(pool, options({ timeoutMs: 5000, onError: (_ep, err) => errors.push(err) }));
    const ep = pool.endpoints[0]!;
    try {
      scraper.start();
      await waitFor('the request to arrive', () => server.active === 1);
      pool.setEndpoints([]);
      await waitFor('the request to be aborted', () => server.active === 0, 1000);
      await sleep(50);
      assert.equal(server.requests, 1);
      assert.equal(ep.scrapeErrors, 0);
      assert.deepEqual(errors, []);
    } finally {
      await scraper.stop();
      await server.close();
    }
  });

  test('stop() ends every loop promptly, even with a scrape hanging, and records nothing', async () => {
    const server = await startServer(() => undefined); // hangs
    const pool = poolFor(server.port);
    const scraper = new Scraper(pool, options({ timeoutMs: 5000 }));
    const ep = pool.endpoints[0]!;
    scraper.start();
    scraper.start(); // idempotent: still one loop
    await waitFor('the request to arrive', () => server.active === 1);
    const t0 = Date.now();
    await scraper.stop();
    assert.ok(Date.now() - t0 < 1000, 'stop did not wait for the hanging request');
    const after = server.requests;
    await sleep(100);
    assert.equal(server.requests, after);
    assert.equal(after, 1);
    assert.equal(ep.scrapeErrors, 0);
    await server.close();
  });

  test('an onError hook that throws does not break the loop', async () => {
    const server = await startServer((_req, res) => {
      res.statusCode = 503;
      res.end();
    });
    const pool = poolFor(server.port);
    const seen: Endpoint[] = [];
    const scraper = new Scraper(
      pool,
      options({
        onError: (ep) => {
          seen.push(ep);
          throw new Error('hook failed');
        },
      }),
    );
    try {
      scraper.start();
      await waitFor('repeated failures', () => pool.endpoints[0]!.scrapeErrors >= 3);
      assert.ok(seen.length >= 3);
      assert.match(pool.endpoints[0]!.lastError ?? '', /HTTP 503/);
    } finally {
      await scraper.stop();
      await server.close();
    }
  });
});
