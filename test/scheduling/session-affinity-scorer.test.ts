import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { loadConfigText } from '../../src/config/load.js';
import type { Endpoint } from '../../src/datalayer/endpoint.js';
import { builtinRegistry } from '../../src/plugins/builtin.js';
import { buildScheduling } from '../../src/scheduling/build.js';
import type { SchedulingRequest, SchedulingResult } from '../../src/scheduling/framework.js';
import {
  SessionAffinityScorer,
  sessionAffinityScorerDefinition,
  sessionTarget,
  sessionTokenFor,
} from '../../src/scheduling/plugins/session-affinity-scorer.js';
import { makeContext, makeDeps, makeEndpoint, makeRequest } from './helpers.js';

const scorer = new SessionAffinityScorer('session-affinity-scorer');
const b64 = (s: string) => Buffer.from(s).toString('base64');

function withHeaders(headers: Record<string, string | string[]>): SchedulingRequest {
  return { ...makeRequest('hello'), headers };
}

function scores(req: SchedulingRequest, endpoints: Endpoint[]): number[] {
  const out = new Float64Array(endpoints.length);
  scorer.score(makeContext(), req, endpoints, out);
  return [...out];
}

/** The response headers the hook sets for `endpoint`. */
function responseHeaders(endpoint: Endpoint): Record<string, string> {
  const headers: Record<string, string> = {};
  scorer.onResponseHeaders(makeRequest(), endpoint, (name, value) => (headers[name] = value));
  return headers;
}

describe('session-affinity-scorer', () => {
  const endpoints = ['vllm-0', 'vllm-1', 'vllm-2'].map((n) => makeEndpoint(n));

  test('x-session-token = base64(endpoint name): 1 for that endpoint, 0 for the others', () => {
    assert.deepEqual(scores(withHeaders({ 'x-session-token': b64('vllm-1') }), endpoints), [0, 1, 0]);
    assert.deepEqual(scores(withHeaders({ 'x-session-token': b64('vllm-2') }), endpoints), [0, 0, 1]);
  });

  test('no token, an empty one, or one naming no candidate (e.g. a removed endpoint) → 0 everywhere', () => {
    assert.deepEqual(scores(withHeaders({}), endpoints), [0, 0, 0]);
    assert.deepEqual(scores(withHeaders({ 'x-session-token': '' }), endpoints), [0, 0, 0]);
    assert.deepEqual(scores(withHeaders({ 'x-session-token': b64('vllm-9') }), endpoints), [0, 0, 0]);
    // The named endpoint is no longer among the candidates.
    assert.deepEqual(scores(withHeaders({ 'x-session-token': b64('vllm-1') }), [endpoints[0]!, endpoints[2]!]), [0, 0]);
  });

  test('invalid base64 names no endpoint; a repeated header counts its first value; whitespace is trimmed', () => {
    assert.deepEqual(scores(withHeaders({ 'x-session-token': '!!!not-base64!!!' }), endpoints), [0, 0, 0]);
    assert.equal(sessionTarget(withHeaders({ 'x-session-token': '%%%' })), undefined);
    assert.deepEqual(scores(withHeaders({ 'x-session-token': [b64('vllm-0'), b64('vllm-2')] }), endpoints), [1, 0, 0]);
    assert.deepEqual(scores(withHeaders({ 'x-session-token': ` ${b64('vllm-2')} ` }), endpoints), [0, 0, 1]);
  });

  test('the response carries the serving endpoint’s token, which routes the next request back', () => {
    assert.deepEqual(responseHeaders(endpoints[1]!), { 'x-session-token': b64('vllm-1') });
    assert.equal(sessionTokenFor('vllm-1'), b64('vllm-1'));
    const token = responseHeaders(endpoints[2]!)['x-session-token']!;
    assert.deepEqual(scores(withHeaders({ 'x-session-token': token }), endpoints), [0, 0, 1]);
    // Names are UTF-8 and may contain '/' (llm-d uses namespace/name).
    const odd = makeEndpoint('ns/pödé-0');
    const oddToken = responseHeaders(odd)['x-session-token']!;
    assert.deepEqual(scores(withHeaders({ 'x-session-token': oddToken }), [endpoints[0]!, odd]), [0, 1]);
  });

  test('parameters (llm-d): headerName, profileName, algorithm; session_id_header refused; its keys ignored with a warning', () => {
    const def = sessionAffinityScorerDefinition;
    const defaults = { headerName: 'x-session-token', algorithm: 'encoded_endpoint_header' };
    assert.deepEqual(def.params.parse({}), defaults);
    assert.deepEqual(def.params.parse(def.params.parse({})), defaults);
    // llm-d's README default, written out, loads.
    assert.deepEqual(def.params.parse({ headerName: 'x-session-token', algorithm: 'encoded_endpoint_header' }), defaults);
    assert.deepEqual(def.params.parse({ headerName: 'X-Session-Token-Prefill', profileName: 'prefill' }), { ...defaults, headerName: 'x-session-token-prefill', profileName: 'prefill' });
    const sessionId = def.params.safeParse({ algorithm: 'session_id_header' });
    assert.equal(sessionId.success, false);
    assert.match(sessionId.error!.issues[0]!.message, /only "encoded_endpoint_header" is supported.*"session_id_header".*not implemented/);
    // `strategy`, llm-d's newer name of the key, loads the same; its session table, `session_id`, is refused alike.
    assert.deepEqual(def.params.parse({ strategy: 'encoded_endpoint_header' }), defaults);
    const strategySessionId = def.params.safeParse({ strategy: 'session_id', sessionIdConfig: { sources: [{ header: 'x-session-id' }] } });
    assert.equal(strategySessionId.success, false);
    assert.match(strategySessionId.error!.issues[0]!.message, /only "encoded_endpoint_header" is supported \(llm-d's "session_id", a session table kept in the gateway, is not implemented/);
    assert.deepEqual(def.configWarnings!(def.params.parse({ strategy: 'encoded_endpoint_header', sessionIdConfig: {} }), { metricsIntervalMs: 50 }).map((w) => w.parameter), ['sessionIdConfig']);
    for (const bad of [{ maxAge: 10 }, { headerName: 'x session' }, { headerName: '' }, { profileName: '' }, { missThreshold: 1.5 }]) {
      assert.equal(def.params.safeParse(bad).success, false, JSON.stringify(bad));
    }
    const warned = def.configWarnings!(def.params.parse({ evictionTtlSeconds: 600, missThreshold: 3 }), { metricsIntervalMs: 50 });
    assert.deepEqual(warned.map((w) => w.parameter), ['evictionTtlSeconds', 'missThreshold']);
    assert.match(warned[0]!.message, /ignored: it belongs to llm-d's session table \(algorithm session_id_header, strategy session_id\)/);
    assert.deepEqual(def.configWarnings!(def.params.parse({}), { metricsIntervalMs: 50 }), []);
  });

  test('headerName: the token is read from and written to that header only', () => {
    const custom = new SessionAffinityScorer('s', sessionAffinityScorerDefinition.params.parse({ headerName: 'X-Sticky' }));
    const out = new Float64Array(3);
    custom.score(makeContext(), withHeaders({ 'x-sticky': b64('vllm-2'), 'x-session-token': b64('vllm-0') }), endpoints, out);
    assert.deepEqual([...out], [0, 0, 1]);
    const headers: Record<string, string> = {};
    custom.onResponseHeaders(makeRequest(), endpoints[1]!, (n, v) => (headers[n] = v));
    assert.deepEqual(headers, { 'x-sticky': b64('vllm-1') });
  });

  test("profileName: the token names that profile's target; no header when the profile did not run", () => {
    const prefill = new SessionAffinityScorer('s', sessionAffinityScorerDefinition.params.parse({ headerName: 'x-session-token-prefill', profileName: 'prefill' }));
    const result = (profiles: Record<string, Endpoint[]>): SchedulingResult => ({
      primaryProfile: 'decode',
      profileResults: new Map(Object.entries(profiles).map(([name, targets]) => [name, { targets }])),
    }) as SchedulingResult;
    const set = (r: SchedulingResult | undefined) => {
      const headers: Record<string, string> = {};
      prefill.onResponseHeaders(makeRequest(), endpoints[0]!, (n, v) => (headers[n] = v), r);
      return headers;
    };
    assert.deepEqual(set(result({ decode: [endpoints[0]!], prefill: [endpoints[2]!] })), { 'x-session-token-prefill': b64('vllm-2') });
    assert.deepEqual(set(result({ decode: [endpoints[0]!] })), {});
    assert.deepEqual(set(result({ decode: [endpoints[0]!], prefill: [] })), {});
    assert.deepEqual(set(undefined), {});
  });

  test('definition: built as scorer and response hook', () => {
    const def = sessionAffinityScorerDefinition;
    const registry = builtinRegistry();
    assert.equal(registry.get('session-affinity-scorer'), def);
    assert.ok(registry.is('session-affinity-scorer', 'scorer'));

    const text = `plugins:
- type: session-affinity-scorer
- type: queue-scorer
schedulingProfiles:
- name: default
  plugins:
  - { pluginRef: session-affinity-scorer, weight: 10 }
  - { pluginRef: queue-scorer }
`;
    const built = buildScheduling(loadConfigText(text, 't.yaml', registry).config, registry, makeDeps());
    assert.deepEqual(built.responseHooks.map((h) => h.name), ['session-affinity-scorer']);
    const fleet = [makeEndpoint('idle', { waiting: 0 }), makeEndpoint('sticky', { waiting: 4 })];
    // Without a token the queue decides; with one the session wins over a longer queue.
    const free = built.scheduler.schedule(makeRequest('x'), fleet);
    assert.ok(free.ok && free.target.name === 'idle');
    const sticky = built.scheduler.schedule(withHeaders({ 'x-session-token': b64('sticky') }), fleet);
    assert.ok(sticky.ok && sticky.target.name === 'sticky');
    // Once 'sticky' is gone the token scores nobody and the request is scheduled elsewhere.
    const gone = built.scheduler.schedule(withHeaders({ 'x-session-token': b64('sticky') }), [fleet[0]!]);
    assert.ok(gone.ok && gone.target.name === 'idle');
  });
});
