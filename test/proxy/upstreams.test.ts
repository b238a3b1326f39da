/** One connection pool per endpoint origin, against real loopback servers. */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { Endpoint } from '../../src/datalayer/endpoint.js';
import { Upstreams } from '../../src/proxy/upstreams.js';
import { startFakeBackend } from '../helpers/fake-backend.js';
import { DEFAULT_OUTLIER_POLICY } from '../../src/datalayer/outlier.js';

const OPTS = { connectTimeout: 1000, headersTimeout: 5000, bodyTimeout: 5000, retries: 2, connections: 4, outlierDetection: DEFAULT_OUTLIER_POLICY };
const endpoint = (name: string, port: number) => new Endpoint({ name, address: '127.0.0.1', port, labels: {} });
const get = async (up: Upstreams, ep: Endpoint) => {
  const r = await up.get(ep).request({ method: 'GET', path: '/metrics' });
  await r.body.dump();
  return r.statusCode;
};

describe('Upstreams', () => {
  test('a live endpoint keeps its pool; one removed by a reload gets a pool per request, closed after it', async () => {
    const a = await startFakeBackend();
    const b = await startFakeBackend();
    const up = new Upstreams(OPTS);
    const [epA, epB] = [endpoint('a', a.port), endpoint('b', b.port)];
    try {
      assert.equal(await get(up, epA), 200);
      assert.equal(up.get(epA), up.get(epA), 'kept');
      up.retain([epA]); // b is gone (a request still deciding may reach it: a retry, a P/D leg)
      const once = up.get(epB);
      const r = await once.request({ method: 'GET', path: '/metrics' });
      await r.body.dump();
      assert.equal(r.statusCode, 200, 'its request is served');
      assert.equal(once.closed, true, 'and its pool closed');
      assert.notEqual(up.get(epB), once, 'not kept');
      assert.equal(up.get(epA), up.get(epA));
    } finally {
      await up.close();
      await a.close();
      await b.close();
    }
  });
});
